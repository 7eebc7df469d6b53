"""`compare --impl hf`'s check of one model: `smearcli.measure.compare` with the model's own cache.

`sound_compare(runner, tokens, schedules, ...)` is `smearcli.measure.compare.compare` on an
`hf.cache_runner.CacheRunner`, judged by `smearcli.judging.evidence` like every surface: the floor is the full
pass in float64 (never decode, which is measured like every other schedule), a departure is
confirmed in float64 with the float32 islands lifted, and agreement is OK only when zeroing each
kind of carried state moves the later logits by 100x the tolerance. A cache that carries no
floating-point state at all makes the comparison `inconclusive`: agreement on it says nothing.

The runner is `hf.runner(model, source, tokens)`: an `hf.cache_runner.CacheRunner` described with what
was loaded. `their_frame(exc)` says where in transformers an exception was raised, or None when
it was not.
"""

from __future__ import annotations

from typing import Optional, Sequence

from ...util import frames
from ...measure.compare import Comparison, compare
from ...util.defaults import NOISE_MARGIN
from .cache_runner import CacheRunner


def sound_compare(r: CacheRunner, tokens, schedules: Sequence[str], options=None,
                  tolerance: float = NOISE_MARGIN, progress=None, tokens_progress=None,
                  notes: Sequence[str] = ()) -> Comparison:
    """compare() on the model's own cache (see the module docstring)."""
    kw = {} if options is None else {"options": options}
    c = compare(r, tokens.to(r.device), list(schedules), tolerance=tolerance, progress=progress,
                tokens_progress=tokens_progress, notes=list(notes), **kw)
    if c.power is not None and not c.power.measured:
        c.inconclusive = c.power.why
    return c


def their_frame(exc: BaseException) -> Optional[str]:
    """"transformers/models/x/modeling_x.py:12 in f" for the deepest frame of an exception that
    was raised inside transformers (None when it was raised elsewhere): `frames.raised_in`."""
    return frames.raised_in(exc, "transformers")
