"""`compare --impl hf`'s sound check of one model, on the scan's machinery (issue 21).

`sound_compare(runner, tokens, schedules, ...)` is `smearcli.compare.compare` with the two
guarantees `smearcli scan` gives every architecture:

- the noise floor comes from the full pass in float64 against float32 (`hf_state.floor_run`),
  never from decode, so a wrong one-token step cannot raise it; decode is measured like every
  other schedule;
- when every schedule agrees, the state the cache carries must be shown to matter
  (`hf_state.live_state`): a kind of state whose zeroing moves no logit past the floor makes the
  comparison `inconclusive` (its verdict says so), since agreement on it says nothing.

The runner is `hf.runner(model, source, tokens)`: an `hf_state.CacheRunner` (a cache under
`state=`, a cache the caller creates) described with what was loaded.
`their_frame(exc)` says where in transformers an exception was raised, or None when it was not.
"""

from __future__ import annotations

import traceback
from typing import Optional, Sequence

from ..compare import Comparison, compare
from ..names import NOISE_MARGIN
from . import hf_state
from .hf_state import CacheRunner


def sound_compare(r: CacheRunner, tokens, schedules: Sequence[str], options=None,
                  tolerance: float = NOISE_MARGIN, progress=None, tokens_progress=None,
                  notes: Sequence[str] = ()) -> Comparison:
    """compare() against a float64 floor, then the live-state check (see the module docstring)."""
    kw = {} if options is None else {"options": options}
    tokens = tokens.to(r.device)
    floor, source = hf_state.floor_run(r, tokens, capture=len(r.layers) > 1)
    c = compare(r, tokens, list(schedules), tolerance=tolerance, progress=progress,
                tokens_progress=tokens_progress, notes=list(notes), floor=floor, floor_source=source, **kw)
    if c.passed:
        if progress is not None:
            progress("live state")
        live = hf_state.live_state(r, tokens, c.noise.per_layer[-1], margin=tolerance)
        c.notes.append(live.describe())
        if not live.effects:
            c.inconclusive = "the cache carries no floating-point state to perturb"
        elif live.dead:
            c.inconclusive = (f"zeroing its {', '.join(live.dead)} state at position {live.split} moves no logit past "
                              f"{tolerance:g}x the floor, so agreement does not show that state is read "
                              "(try a larger initializer_range)")
    return c


def their_frame(exc: BaseException) -> Optional[str]:
    """"transformers/models/x/modeling_x.py:12 in f" for the deepest frame of an exception that
    was raised inside transformers (None when the deepest frame is elsewhere)."""
    frames = traceback.extract_tb(exc.__traceback__)
    if not frames:
        return None
    last = frames[-1]
    path = last.filename.replace("\\", "/")
    theirs = [f for f in frames if "/transformers/" in f.filename.replace("\\", "/")]
    if "/transformers/" not in path and not (theirs and "/torch/" in path):
        return None
    f = theirs[-1]
    return f"{f.filename.replace(chr(92), '/').split('/site-packages/')[-1]}:{f.lineno} in {f.name}"
