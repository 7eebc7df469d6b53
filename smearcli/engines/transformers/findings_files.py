"""A finding's files, in an order that never leaves one on disk without a record pointing at it:
each reproducer written, the record sent (`census.budget.stage`), each reproducer run once within
a limit scaled to the check's pace, then the bug-report draft (`attach`)."""

from __future__ import annotations

from pathlib import Path

from . import draft, repro
from ...census.record import Record


def attach(rec: Record, repro_dir, limit: float, stage, **kw) -> None:
    """A finding's files, into `rec`: its reproducer (and one per failed boundary beside another
    headline), each written, then `stage(rec)` (the census sends the record so far: every file on
    disk has a record pointing at it before it runs), then each run once with `limit` seconds
    (scaled to the check's pace by the caller), then the bug-report draft. `kw`: `write`'s seed,
    vocab, margin and total; `rec.built_from` is the config the reproducer rebuilds."""
    import torch
    import transformers

    name = rec.model_type
    path = repro.write(rec, rec.built_from, Path(repro_dir) / f"{name}.py", **kw)
    rec.reproducer = str(path)
    beside = {}  # a failed boundary beside another headline: its own reproducer
    for b, e in (rec.boundaries or {}).items():
        if e.status == "bug" and b != rec.worst_schedule:
            beside[b] = repro.write(rec, rec.built_from, Path(repro_dir) / f"{name}-{b}.py", schedule=b, **kw)
            e.reproducer, e.reproducer_status = str(beside[b]), None
    stage(rec)
    rec.reproducer_status, rec.reproducer_output = repro.run(path, timeout=limit)
    for b, p in beside.items():
        rec.boundaries[b].reproducer_status, _ = repro.run(p, timeout=limit)
    rec.report_draft = str(draft.write(rec, path.with_suffix(".md"), {
        "transformers": transformers.__version__, "torch": torch.__version__}))
