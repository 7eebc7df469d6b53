"""Timing a long decode from a sample of its steps, so `bench` keeps to its budget.

A decode of T tokens is T one-token steps whose cost grows with the position (attention reads a
longer cache; on short-window layers only up to the window). Timing k consecutive steps centred
on the middle of the sequence and scaling by T / k estimates the whole decode: for a cost linear
in the position, the middle step costs the mean. The cache is filled up to the sample's start
by one untimed prefill of the same logic, so the timed steps see the cache a real decode would.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional

import torch
from torch import Tensor

MIN_SAMPLE = 8  # one-token steps: fewer and the per-step overhead dominates the estimate


@dataclass(frozen=True)
class DecodeSample:
    start: int  # position of the first timed step
    steps: int  # one-token steps timed per run
    total: int  # steps of the whole decode (T)

    @property
    def scale(self) -> float:
        return self.total / self.steps


def sample_window(T: int, k: int, start: Optional[int] = None) -> DecodeSample:
    """k steps (at least MIN_SAMPLE, at most T) centred on the middle of T, or from `start`."""
    k = max(min(MIN_SAMPLE, T), min(k, T))
    start = max(0, (T - k) // 2) if start is None else min(start, T - k)
    return DecodeSample(start, k, T)


def steps_that_fit(round_s_per_step: float, share_s: float, rounds: int, T: int) -> int:
    """How many steps per run fit `rounds` rounds (every logic once) in `share_s` seconds, when one
    round costs `round_s_per_step` per step."""
    if round_s_per_step <= 0:
        return T
    return max(1, min(T, int(share_s / (rounds * round_s_per_step))))


def time_decode_steps(model, tokens: Tensor, logic: str, sample: DecodeSample,
                      measure: Callable[[Callable[[], object]], float], caches: Optional[dict] = None) -> float:
    """Seconds `measure` gives for the sample's one-token steps, on a cache of the full length
    filled up to the sample's start by an untimed prefill. With `caches` (a dict kept between
    calls) that filled cache is kept per logic and cut back to the start after each call, so
    later calls pay no prefill."""
    B, T = tokens.shape
    key = (logic, sample.start)
    with torch.inference_mode():
        if caches is not None and key in caches:
            cache, prev = caches[key]
            cache.truncate(sample.start, prev)
        else:
            cache = model.new_cache(B, T)
            if sample.start:
                model(tokens[:, :sample.start], cache=cache, smear=logic)
            if caches is not None:
                caches[key] = (cache, cache.prev_embedding)

        def steps():
            for p in range(sample.start, sample.start + sample.steps):
                model(tokens[:, p:p + 1], cache=cache, smear=logic)
        return measure(steps)
