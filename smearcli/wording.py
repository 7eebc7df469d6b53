"""The phrases a verdict and a table share: steps as "3x16", where an error is born relative to
the chunk starts, and the list of chunk starts a verdict names."""

from __future__ import annotations

from typing import Sequence


def fmt_steps(steps: Sequence[int]) -> str:
    """16,16,16 as 3x16: runs of equal steps counted."""
    runs: list[list[int]] = []
    for n in steps:
        if runs and runs[-1][0] == n:
            runs[-1][1] += 1
        else:
            runs.append([n, 1])
    return ",".join(str(n) if k == 1 else f"{k}x{n}" for n, k in runs)


def born_where(pos: int, starts: Sequence[int]) -> str:
    """", the first chunk start (16)", ", a chunk start (32)", ", not on a chunk start (first
    chunk start: 16)", or "" for a run without chunk starts."""
    if not starts:
        return ""
    if pos in starts:
        return f", {'the first chunk start' if pos == starts[0] else 'a chunk start'} ({pos})"
    return f", not on a chunk start (first chunk start: {starts[0]})"


def starts_phrase(starts: Sequence[int], schedule: str, shown: int = 4) -> str:
    """"the 3 chunk starts of chunked: 64, 128, 192", the list cut after `shown` with a count."""
    more = f" and {len(starts) - shown} more" if len(starts) > shown else ""
    what = "chunk start" if len(starts) == 1 else f"{len(starts)} chunk starts"
    return f"the {what} of {schedule}: {', '.join(map(str, starts[:shown]))}{more}"
