"""The scan's report: an 80-column table, a versioned JSON document, a Markdown census.

Records are `census.record.Record`s, as every engine's check returns them and `records` reads them
back; a field the check never set (a process that died, a record file from an older release) is null.
"""

from __future__ import annotations

import re
from typing import Optional, Sequence

from ..util.errors import UserError
from ..measure.jsondoc import SCHEMAS, header
from ..judging.verdicts import BUG, OK, RECORD, rank
from . import known, record
from .record import Record

SCHEMA = SCHEMAS["scan"]
FIELDS = record.FIELDS  # every field of a record, in the order the JSON document lists them
PY_PATH = re.compile(r"\S*/([^/\s]+\.py:\d+)")  # "transformers/models/x/modeling_x.py:12" -> "modeling_x.py:12"


def counts(records: Sequence[Record]) -> dict[str, int]:
    out = {str(v): 0 for v in RECORD}
    for r in records:
        out[r.verdict] = out.get(r.verdict, 0) + 1
    return out


def _cut(text: str, width: int) -> str:
    text = "" if text is None else str(text)
    return text if len(text) <= width else text[:width - 1] + "~"


def err_cell(r: Record) -> str:
    v = r.max_abs
    return "-" if v is None else f"{v:.2g}"


def f64_cell(r: Record) -> str:
    """The finding's error in float64 with the float32 islands lifted (`evidence.confirm`)."""
    v = r.confirmation.float64_lifted if r.confirmation is not None else None
    return "-" if v is None else f"{v:.2g}"


def cell(text, n: Optional[int] = 120) -> str:
    """`text` as one cell of a Markdown table: on one line, at most `n` characters of it (a page
    keeps its width; None: all), its bars escaped so that they read as written ("max |d log-prob|")
    and do not end the cell. Every page's table cells go through it."""
    return str(text or "").replace("\n", " ")[:n].replace("|", "\\|")


def sort_key(r: Record):
    return (rank(r.verdict), r.model_type)


COLUMNS = (("architecture", 16), ("verdict", 9), ("worst schedule", 20), ("error", 7), ("shape / why", 16),
           ("at pos", 6))  # the first position off (`born_at`); the module is on the line under a finding
SHORT = {"state dropped at chunk starts": "state dropped", "decode path differs": "decode path",
         "positions restart": "positions", "context lost": "context lost", "mask wrong": "mask wrong",
         "padding leaks into a row": "padding leaks", "state not rolled back": "not rolled back"}


def short_reason(reason: str) -> str:
    """"modeling_x.py:12" from a crash's frame; the reason's first words otherwise."""
    head = (reason or "").split(": ")[0]
    if ".py:" in head:
        return head.split("/")[-1].split(" in ")[0]
    return reason or ""


def engine_of(records: Sequence[Record]):
    """The engine the records ran on (`census.engines.of_records`), for what it adds to the table and
    the JSON document; None where the records mix engines or name one not registered here (the
    rows and fields are still shown, without its additions)."""
    from . import engines

    try:
        return engines.of_records(records)
    except UserError:
        return None


def table(records: Sequence[Record], width: int = 80) -> str:
    """One line per architecture (bugs first), then the counts; every line within `width`."""
    def line(cells):
        return " ".join(_cut(c, w).ljust(w) for c, (_, w) in zip(cells, COLUMNS)).rstrip()[:width]
    out = [line([c for c, _ in COLUMNS]), line(["-" * w for _, w in COLUMNS])]
    engine = engine_of(records)
    under = " " * (COLUMNS[0][1] + 1)  # what is said of a row goes under it, below its name
    for r in sorted(records, key=sort_key):
        v = r.verdict
        detail = SHORT.get(r.shape, r.shape) or ("" if v == OK else short_reason(r.reason))
        if v == BUG and r.init is not None:
            v = f"bug@{r.init:g}"
        out.append(line([r.model_type, v, r.worst_schedule or "-", err_cell(r),
                         detail or "-", (r.born_at or "-").split("@")[-1]]))
        for said in engine.row_lines(r) if engine else []:  # the engine's own (transformers: where it was born)
            out.append(_cut(under + said, width))
        if known.console(r):  # what upstream knows of it: new, or the thread
            out.append(_cut(under + known.console(r), width))
    c = counts(records)
    out += [_cut(x, width) for x in (engine.table_footer(records) if engine else [])]
    out.append(_cut(f"{len(records)} architectures: " + ", ".join(f"{n} {k}" for k, n in c.items() if n), width))
    return "\n".join(out)


def document(records: Sequence[Record], meta: Optional[dict] = None) -> dict:
    """The --json document (schema smearcli.scan/1): one record per architecture, sorted."""
    engine = engine_of(records)
    recs = [r.to_json() for r in sorted(records, key=lambda r: r.model_type)]
    return header("scan", **(meta or {}), counts=counts(records), groups=engine.root_causes(records) if engine else [],
                  architectures=recs)


def markdown(records: Sequence[Record], meta: Optional[dict] = None, engine=None) -> str:
    """The census as Markdown, on any engine (`census.engines`; default: the one its records ran
    on): the engine's title, the counts, then the engine's own sections. A version the meta lacks
    (a `--merge`) is read from the records."""
    from . import engines

    engine = engine or engines.of_records(records)
    versions = {k: getattr(r, k) for r in reversed(records) for k in record.VERSIONS if getattr(r, k)}
    meta = {**versions, **{k: v for k, v in (meta or {}).items() if v is not None}}
    c = counts(records)
    out = [engine.page_title(meta), "",
           f"{len(records)} {engine.counted}: " + ", ".join(f"{n} {k}" for k, n in c.items() if n) + ".", ""]
    if known.summary(records):  # the new findings first: what the census adds to what upstream knows
        out += [known.summary(records), ""]
    return "\n".join(out + engine.page_sections(records, meta)) + "\n"
