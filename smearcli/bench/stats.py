"""Summaries that survive a noisy machine: median and interquartile range of timed samples, and
fixed/old ratios taken per round (A B A B), not divided after the fact."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence

def quantile(xs: Sequence[float], q: float) -> float:
    """The q-quantile of xs with linear interpolation between order statistics (numpy's default)."""
    if not xs:
        raise ValueError("quantile of no samples")
    if not 0.0 <= q <= 1.0:
        raise ValueError(f"q must be in [0, 1], got {q}")
    s = sorted(xs)
    h = (len(s) - 1) * q
    lo = int(h)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (h - lo) * (s[hi] - s[lo])


@dataclass(frozen=True)
class Summary:
    n: int
    median: float
    q1: float
    q3: float
    min: float
    max: float

    @property
    def iqr(self) -> float:
        return self.q3 - self.q1

    @classmethod
    def of(cls, xs: Sequence[float]) -> "Summary":
        return cls(len(xs), quantile(xs, 0.5), quantile(xs, 0.25), quantile(xs, 0.75), min(xs), max(xs))

    def to_json(self) -> dict:
        return {"n": self.n, "median": self.median, "q1": self.q1, "q3": self.q3, "iqr": self.iqr,
                "min": self.min, "max": self.max}


def pair_ratios(samples: dict[str, list[float]], num: str = "fixed", den: str = "old") -> Optional[list[float]]:
    """num/den per round, or None when either logic did not run."""
    if num not in samples or den not in samples:
        return None
    return [a / b for a, b in zip(samples[num], samples[den])]
