"""Value axes of the figures: log scales spanning many decades, with exact zeros kept on the
bottom edge, and decade labels as plain text."""

from __future__ import annotations


def positive_min(arrays, default: float) -> float:
    vals = [a[a > 0] for a in arrays]
    vals = [v for v in vals if v.size]
    return float(min(v.min() for v in vals)) if vals else default


SUPERSCRIPT = str.maketrans("-0123456789", "⁻⁰¹²³⁴⁵⁶⁷⁸⁹")


def pow10_label(v: float, pos=None) -> str:
    """10⁻⁶ as plain text: the look of matplotlib's default, without the cost of mathtext."""
    import math

    if v == 0:
        return "0"
    if v < 0:
        return ""
    e = math.log10(v)
    return "10" + str(round(e)).translate(SUPERSCRIPT) if abs(e - round(e)) < 1e-9 else ""


def sane_range(arrays, lo: float, hi: float) -> tuple[float, float]:
    """(lo, hi) a log axis can take: 0 < lo < hi, both finite. A model whose activations overflow
    gives a noise floor of 0 or NaN and errors of inf; the axis then spans the finite positive
    values drawn (NaN and inf are left out of the plot by matplotlib), or one decade."""
    import math

    import numpy as np

    finite = [a[np.isfinite(a)] for a in arrays]
    if not (math.isfinite(lo) and lo > 0):
        lo = positive_min(finite, 1e-12)
    if not (math.isfinite(hi) and hi > lo):
        top = [float(v.max()) for v in finite if v.size]
        hi = max(top) if top and max(top) > lo else lo * 10
    return lo, hi


def value_axis(ax, arrays, lo: float, hi: float) -> float:
    """A log y axis from `lo` to `hi`; if any value is exactly 0, a symlog axis whose linear
    part runs from 0 to `lo`, so that exact agreement is drawn (on the bottom edge) instead of
    being dropped. Returns the bottom of the axis."""
    import math

    import numpy as np
    from matplotlib.ticker import FixedLocator, FuncFormatter, NullLocator

    lo, hi = sane_range(arrays, lo, hi)
    zeros = any(bool(np.any(a == 0)) for a in arrays)
    if zeros:
        ax.set_yscale("symlog", linthresh=lo, linscale=0.5)
        bottom = 0.0
    else:
        ax.set_yscale("log")
        bottom = lo
    ax.set_ylim(bottom, hi)
    # whole decades, at most ~8 of them, and 0 where the axis has it (the decade at the end of
    # the linear part would crowd the 0, so the decades start one above it)
    first, last = math.ceil(math.log10(lo)) + (1 if zeros else 0), math.floor(math.log10(hi))
    stride = max(1, math.ceil((last - first + 1) / 8))
    ticks = [10.0 ** e for e in range(last, first - 1, -stride)][::-1]
    ax.yaxis.set_major_locator(FixedLocator(([0.0] if zeros else []) + ticks))
    ax.yaxis.set_major_formatter(FuncFormatter(pow10_label))
    ax.yaxis.set_minor_locator(NullLocator())  # the axes span many decades: majors suffice
    return bottom
