"""A failing step plan's shape, diagnosed by reruns (`name_shape`): explicit `position_ids` or an
explicit attention mask that makes it pass, the dropped-state hypothesis replayed
(`dropped_state`), then the error's profile (`shapes.classify`)."""

from __future__ import annotations

from typing import Optional

import torch

from ..defaults import NOISE_MARGIN
from ..schedules import run_steps
from ..state import KV, Zeroing, state_kinds
from ..impls.hf.cache_runner import CacheRunner
from . import shapes
from .boundary import logits_noise, logits_only


def name_shape(model, tokens, plans, name, worst, ms, ref, noise, tolerance, window=None):
    """(the failing run's shape, the explicit argument that fixes it or None, a note or None, the
    kinds of state whose zeroing replays it: [] when none); `window`: the config's sliding window."""
    thr = NOISE_MARGIN * noise.per_layer[-1]
    length = misreported(model, tokens, plans[name])
    edge = window_edge(ms, plans, window)
    fixed = None
    for arg, kw in (("position_ids", dict(positions=True)), ("attention_mask", dict(mask=True))):
        r = CacheRunner(model, **kw)
        if not (r.positions or r.mask):
            continue
        try:
            m = measure_one(r, tokens, plans[name], name, ref, noise, tolerance)
        except Exception:
            continue
        if m.passed:
            fixed = arg
            break
    decode_fails = "decode" in ms and not ms["decode"].passed  # a plan their code refused is not in ms
    chunks_pass = all(ms[k].passed for k in ("chunks of 16", "prefill") if k in ms)
    steps = plans[name]
    starts = shapes.boundaries(steps)
    matches = None
    if fixed is None and starts and not decode_fails and not (length or edge):
        matches = dropped_state(model, tokens, steps, starts, thr)
    err = worst.abs_err[-1].tolist()
    shape = shapes.classify(err, steps, thr, fixed, decode_fails, chunks_pass, matches is not None,
                            length=bool(length), window_edge=bool(edge))
    note = None
    if length:
        note = f"{name}: {length}"
    elif edge:
        note = edge
    elif matches:
        note = f"token-by-token decode with the {matches} at each chunk start equals {name} to the floor"
    kinds = [k for k in (matches or "").removesuffix(" state zeroed").split(" and ") if k]
    return shape, fixed, note, kinds


def misreported(model, tokens, steps) -> Optional[str]:
    """Where the cache misreports its length on `steps`: after a step, its `get_seq_length()` is not
    the number of tokens fed so far ("get_seq_length() is 0 after 21 tokens fed"), or None. Only a
    cache that holds attention keys is asked (a cache of recurrent state alone has no length)."""
    runner = CacheRunner(model)
    cache = runner.new_cache(1, tokens.size(1))
    pos = 0
    try:
        with torch.inference_mode():
            for n in steps:
                runner.step(tokens[:, pos:pos + n], cache, False)
                pos += n
                ask = getattr(cache.inner, "get_seq_length", None)
                if not callable(ask) or KV not in state_kinds(cache.inner):
                    return None
                got = int(ask())
                if got != pos:
                    fed = f"{pos} token{'s' * (pos != 1)}"
                    return (f"{type(cache.inner).__name__}.get_seq_length() is {got} after {fed} fed, so the next "
                            "step's positions and masks start from the wrong place")
    except Exception:
        return None
    return None


def window_edge(ms: dict, plans: dict, window: Optional[int]) -> Optional[str]:
    """A note when every cached step plan that ran departs, and first exactly at position `window`
    (the sliding window's length; a prefill over it, then single tokens: at its first cached token),
    whatever its steps; None otherwise."""
    if not window:
        return None
    from .boundary import SCHEDULES

    cached = {k: m for k, m in ms.items() if k in plans and k not in SCHEDULES and len(plans[k]) > 1}
    if len(cached) < 2 or any(m.passed or m.first_departure is None for m in cached.values()):
        return None
    if any(m.first_departure[1] != edge(plans[k], window) for k, m in cached.items()):
        return None
    return (f"every cached schedule ({len(cached)}) departs first at position {window}, the sliding window's length "
            "(or at its first step after it), whatever its steps: the cached path sizes its window or mask "
            "differently from the full pass")


def edge(steps, window: int) -> int:
    """Where a schedule of `steps` first departs if the window is the cause: at the window, or, for
    one prefill past the window then single tokens, at the first cached token (the prefill ran as
    the full pass does)."""
    if steps and steps[0] > window and all(n == 1 for n in steps[1:]):
        return steps[0]  # one prefill over the window, then single tokens: the first cached token
    return window


def dropped_state(model, tokens, steps, starts, thr) -> Optional[str]:
    """The kinds of carried state whose zeroing at each multi-token chunk start makes token-by-token
    decode equal the failing run (the hypothesis "the chunk forgot its state" replayed), or None."""
    probe = CacheRunner(model)
    held = probe.new_cache(1, 2)
    with torch.inference_mode():
        probe.step(tokens[:, :2], held, False)
    kinds = [k for k in state_kinds(held.inner) if k != KV]
    if not kinds:
        return None
    cache_starts = tuple(s for s, n in zip(starts, steps[1:]) if n > 1)
    try:
        run = run_steps(CacheRunner(model), tokens, steps)
    except Exception:
        return None
    for subset in ([[k] for k in kinds] if len(kinds) > 1 else []) + [kinds]:
        r = Zeroing(CacheRunner(model), cache_starts, subset)
        try:
            replay = run_steps(r, tokens, [1] * tokens.size(1))
        except Exception:
            continue
        if float((replay.logits - run.logits).abs().max()) <= thr:
            return " and ".join(subset) + " state zeroed"
    return None


def measure_one(runner, tokens, steps, name, ref, noise, tolerance):
    """One step plan on `runner` against the reference's logits (`boundary.measured`)."""
    from .boundary import measured

    run = run_steps(runner, tokens, steps, capture=False, schedule=name)
    return measured(logits_only(ref), run, logits_noise(noise), tolerance)
