"""A failing step plan's shape, diagnosed by reruns (`name_shape`): explicit `position_ids` or an
explicit attention mask that makes it pass, the dropped-state hypothesis replayed
(`dropped_state`), then the error's profile (`shapes.classify`)."""

from __future__ import annotations

from typing import Optional

import torch

from ...util.defaults import NOISE_MARGIN
from ...measure.schedules import run_steps
from ...measure.state import KV, Zeroing, state_kinds
from .cache_runner import CacheRunner
from ...measure import shapes
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
    """A note when every cached step plan that ran departs, each first exactly at its first step that
    starts once the cache holds the sliding window (`edge`: decode at the window, chunks of 16 at
    16), whatever its steps; None otherwise."""
    from .boundary import SCHEDULES

    if not window:
        return None
    cached = {k: m for k, m in ms.items() if k in plans and k not in SCHEDULES and len(plans[k]) > 1}
    if len(cached) < 2 or any(m.passed or m.first_departure is None for m in cached.values()):
        return None
    if any(m.first_departure[1] != edge(plans[k], window) for k, m in cached.items()):
        return None
    return (f"every cached schedule ({len(cached)}) departs first at its first step that starts once the cache "
            f"holds the sliding window ({window} tokens), whatever its steps: the cached path windows or masks the "
            "cache differently from the full pass")


def edge(steps, window: int) -> Optional[int]:
    """The first step start at or past `window` (None when no step starts there)."""
    pos = 0
    for n in steps[:-1]:
        pos += n
        if pos >= window:
            return pos
    return None


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
