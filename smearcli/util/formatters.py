"""Numbers for people: the one set of formatters every table, verdict and error message uses
(a run's steps as "3x16" among them).

Torch-free and dependency-free, so the lowest layers (a memory refusal, a verdict) and the
renderers format the same number the same way."""

from __future__ import annotations

import math
from typing import Sequence

BYTE_UNITS = ("B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB")


def sci(x: float) -> str:
    """Two significant digits in scientific notation, exact zero as "0": 1.5e-05, 5.8e+00."""
    return "0" if x == 0 else f"{x:.1e}"


def compact(x: float) -> str:
    """`sci` without the exponent's padding, for prose: 0.91 -> 9.1e-1, 42000 -> 4.2e4."""
    if x == 0:
        return "0"
    if math.isnan(x):
        return "nan"
    m, e = f"{x:.1e}".split("e")
    return f"{m}e{int(e)}"


def sig3(x: float) -> str:
    """Three significant digits: 5.79, 3.8e+05."""
    return f"{x:.3g}"


def times(x: float) -> str:
    """A multiple (of the noise floor) in two significant digits: 0.31, 1, 3.8e+05."""
    return f"{x:.2g}"


def duration(s: float) -> str:
    """Seconds with a unit that keeps three significant digits: 1.2 s, 340 ms, 12 µs."""
    for unit, scale in (("s", 1.0), ("ms", 1e-3), ("µs", 1e-6)):
        if s >= scale:
            return f"{s / scale:.3g} {unit}"
    return f"{s / 1e-9:.3g} ns"


def nbytes(n: float) -> str:
    """Bytes in binary units: 1536 -> '1.5 KiB'; past exbibytes the number grows."""
    n = float(n)
    for unit in BYTE_UNITS:
        if n < 1024 or unit == BYTE_UNITS[-1]:
            break
        n /= 1024
    if unit == "B":
        return f"{n:.0f} B"
    return f"{n:.1f} {unit}" if n < 1024 else f"{n:.3g} {unit}"


def fmt_steps(steps: Sequence[int]) -> str:
    """16,16,16 as 3x16: runs of equal steps counted."""
    runs: list[list[int]] = []
    for n in steps:
        if runs and runs[-1][0] == n:
            runs[-1][1] += 1
        else:
            runs.append([n, 1])
    return ",".join(str(n) if k == 1 else f"{k}x{n}" for n, k in runs)
