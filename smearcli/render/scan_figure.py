"""The scan's figure: architectures x schedules, each cell the schedule's logits error as a
multiple of the architecture's float64 noise floor (log scale), with the verdict beside each row.

```python
from smearcli.render import scan_figure, figures
figures.save(scan_figure.figure(records), "scan.png")  # records: `census.record.Record`s, as `census.records` reads them
```

Rows are the architectures whose schedules ran (bugs first); a schedule an architecture did not run
is blank. `value` picks what a cell shows: `against_reference` (the default, every engine) or
`against_own_prefill` (llama.cpp's census, which holds its cache to its own one-call prefill). Uses `matplotlib.figure.Figure` only (no pyplot), like `render.figures`.
"""

from __future__ import annotations

import math
from typing import Callable, Optional, Sequence

from ..judging.verdicts import rank  # rows: findings first, in the order reports list them


def against_reference(record, entry) -> Optional[float]:
    """A schedule's error (its `census.record.ScheduleResult`) as a multiple of the floor, against
    the reference (the full pass)."""
    return entry.multiple


def against_own_prefill(record, entry) -> Optional[float]:
    """A llama.cpp schedule's distance from llama.cpp's own one-call prefill (`vs_prefill`) as a
    multiple of the same floor: what the llama.cpp census judges its cache by."""
    if entry.vs_prefill is None or not record.floor:
        return None
    return entry.vs_prefill / record.floor


TITLES = {against_reference: "cached schedules vs the full pass: log10(max |dlogit| / float64 floor)",
          against_own_prefill: "llama.cpp's cached schedules vs its own one-call prefill: log10(max |d log-prob| / "
                               "float64 floor)"}


def grid(records: Sequence, value: Callable = against_reference) -> tuple[list[str], list[str], list[list[float]]]:
    """(row labels, column labels, log10 of `value(record, schedule entry)` per cell, nan where not
    run or not measured) of the census's records (`census.record.Record`)."""
    ran = [r for r in records if r.schedules]
    ran.sort(key=lambda r: (rank(r.verdict), r.model_type))
    cell = (lambda r, name: None if r.schedules.get(name) is None else value(r, r.schedules[name]))
    cols: list[str] = []
    for r in ran:
        cols += [k for k in r.schedules if k not in cols and any(cell(x, k) is not None for x in ran)]
    rows = [f"{r.model_type} ({r.verdict})" for r in ran]
    cells = []
    for r in ran:
        vals = [cell(r, c) for c in cols]
        cells.append([math.nan if v is None else math.log10(max(v, 1e-3)) for v in vals])
    return rows, cols, cells


def figure(records: Sequence, tolerance: float = 10.0, value: Callable = against_reference):
    """A matplotlib Figure of `grid(records, value)`; the colour scale is centred on the tolerance."""
    from matplotlib.colors import TwoSlopeNorm
    from matplotlib.figure import Figure

    rows, cols, cells = grid(records, value)
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
    ax.set_title(TITLES.get(value, ""), fontsize=9)
    fig.colorbar(im, ax=ax, shrink=0.5, label=f"log10 multiple of the floor ({tolerance:g}x: the line)")
    return fig
