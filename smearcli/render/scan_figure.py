"""The scan's figure: architectures x schedules, each cell the schedule's logits error as a
multiple of the architecture's float64 noise floor (log scale), with the verdict beside each row.

```python
from smearcli.render import scan_figure, figures
figures.save(scan_figure.figure(records), "scan.png")  # records: the scan's JSON Lines, as dicts
```

Rows are the architectures whose schedules ran (bugs first); a schedule an architecture did not run
is blank. Uses `matplotlib.figure.Figure` only (no pyplot), like `render.figures`.
"""

from __future__ import annotations

import math
from typing import Sequence

from ..verdicts import rank  # rows: findings first, in the order reports list them


def grid(records: Sequence) -> tuple[list[str], list[str], list[list[float]]]:
    """(row labels, column labels, log10 of error / floor per cell, nan where not run) of the census's
    records (`census.record.Record`)."""
    ran = [r for r in records if r.schedules]
    ran.sort(key=lambda r: (rank(r.verdict), r.model_type))
    cols: list[str] = []
    for r in ran:
        cols += [k for k in r.schedules if k not in cols]
    rows = [f"{r.model_type} ({r.verdict})" for r in ran]
    cells = [[math.log10(max(r.schedules[c]["multiple"], 1e-3)) if (r.schedules.get(c) or {}).get("multiple") is not None else math.nan
              for c in cols] for r in ran]
    return rows, cols, cells


def figure(records: Sequence, tolerance: float = 10.0):
    """A matplotlib Figure of `grid(records)`; the colour scale is centred on the tolerance."""
    from matplotlib.colors import TwoSlopeNorm
    from matplotlib.figure import Figure

    rows, cols, cells = grid(records)
    if not rows:
        raise ValueError("no architecture in these records ran a schedule")
    fig = Figure(figsize=(2 + 0.45 * len(cols), 1.5 + 0.16 * len(rows)), layout="constrained")
    ax = fig.add_subplot()
    vals = [v for row in cells for v in row if not math.isnan(v)]
    hi = max(max(vals), math.log10(tolerance) + 1)
    im = ax.imshow(cells, aspect="auto", cmap="RdBu_r", interpolation="nearest",
                   norm=TwoSlopeNorm(vcenter=math.log10(tolerance), vmin=min(min(vals), -0.5), vmax=hi))
    ax.set_xticks(range(len(cols)), cols, rotation=60, ha="right", fontsize=7)
    ax.set_yticks(range(len(rows)), rows, fontsize=6)
    ax.set_title("cached schedules vs the full pass: log10(max |dlogit| / float64 floor)", fontsize=9)
    fig.colorbar(im, ax=ax, shrink=0.5, label=f"log10 multiple of the floor ({tolerance:g}x: the line)")
    return fig
