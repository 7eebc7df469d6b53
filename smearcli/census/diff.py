"""What changed between two censuses (`smearcli scan --against PREVIOUS`): another release of the
same engine, per architecture.

`compare(previous, current)` takes two lists of records (`census.records`: a scan's own, a record
file, merged shards) and gives one `Change` per architecture whose result moved:

- `fixed`: a bug before, `ok` now (an ok has power), with the path that failed then measured now
  (`path`: the schedule's numbers in the current record); a bug whose path is not measured now is
  a `verdict changed`, not a fix;
- `regressed`: `bug` or `crashed` now, where their code ran without failing before (`ok`,
  `inconclusive`, `unsupported`, `latent`, `tie artifact`: `RAN_CLEAN`); from a time-out, a model
  that did not build or a departure already there it is a `verdict changed`;
- `new`, `gone`: in one census only;
- `diagnosis changed`: the same failing verdict, another schedule, shape or born-in class;
- `verdict changed`: any other move (a crash that became a bug, time that became a verdict, ...).

Each change carries both censuses' numbers, and its cause where the records and sources tell it
(`cause`): time (`timed out` on one side), or what the engine's sources tell, where both
releases' are given (`sources`, anything with an `explain(change)`: transformers' is
`engines.transformers.sources.Sources`, the lines of the modeling file and of the cache API that
changed between them). `regressions(changes)` is what `--check` gates on. Torch-free: it reads
records only.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional, Sequence

from ..util.errors import UserError
from ..judging.verdicts import BUG, CRASHED, FAILURES, OK, RAN_CLEAN, TIMED_OUT
from . import engines
from .record import Record
from .report import cell

FIXED, REGRESSED, NEW, GONE = "fixed", "regressed", "new", "gone"
DIAGNOSIS, VERDICT = "diagnosis changed", "verdict changed"
KINDS = (REGRESSED, FIXED, VERDICT, DIAGNOSIS, NEW, GONE)  # the order the report lists them in
@dataclass
class Change:
    """One architecture whose result moved between the censuses."""

    model_type: str
    kind: str  # one of KINDS
    before: Optional[dict]  # the previous record's numbers (`numbers`), None when it was not there
    after: Optional[dict]  # the current record's, None when it is gone
    path: Optional[dict] = None  # fixed: the path that failed before, as measured now
    cause: Optional[str] = None  # what the records and the sources tell of why
    lines: dict = field(default_factory=dict)  # file -> its changed lines (the sources'), quoted

    def to_json(self) -> dict:
        return {"model_type": self.model_type, "change": self.kind, "before": self.before, "after": self.after,
                "path": self.path, "cause": self.cause, "lines": self.lines}


def numbers(rec: Record) -> dict:
    """What a change shows of one side: verdict, schedule, error, multiple, shape, where born, why."""
    return {"verdict": rec.verdict, "worst_schedule": rec.worst_schedule, "max_abs": rec.max_abs,
            "multiple": rec.multiple, "shape": rec.shape,
            "born_in": rec.born_in.class_name if rec.born_in is not None else None,
            "reason": rec.reason, "release": engines.release_of(rec)}


def release(records: Sequence[Record]) -> str:
    """"transformers 5.24.0", "vLLM 0.32.0", "llama-cpp-python 0.3.36" (releases joined by "/" where
    the records differ): the release each record's engine says made it (`census.engines`)."""
    eng = engines.of_records(records)
    found = sorted({str(eng.release(r) or "?") for r in records})
    return f"{eng.product} {'/'.join(found) or '?'}"


def _path(before: Record, after: Record) -> Optional[dict]:
    """The schedule that failed before, as the current record measured it (None: not measured)."""
    name = before.worst_schedule
    if not name:
        return None
    got = (after.schedules or {}).get(name) or (after.boundaries or {}).get(name)  # a step plan's, or a boundary's
    if got is None or got.max_abs is None:
        return None
    return {"schedule": name, "max_abs": got.max_abs, "multiple": got.multiple}


def kind(before: Optional[dict], after: Optional[dict]) -> Optional[str]:
    """The change between two records of one architecture (None: nothing moved)."""
    if before is None:
        return NEW
    if after is None:
        return GONE
    v0, v1 = before.verdict, after.verdict
    if v0 in RAN_CLEAN and v1 in (BUG, CRASHED):
        return REGRESSED
    if v0 == BUG and v1 == OK and _path(before, after) is not None:
        return FIXED
    if v0 != v1:
        return VERDICT
    if v1 in FAILURES and any(numbers(before)[k] != numbers(after)[k] for k in ("worst_schedule", "shape", "born_in")):
        return DIAGNOSIS
    return None


def compare(previous: Sequence[dict], current: Sequence[dict], sources=None) -> list[Change]:
    """One `Change` per architecture whose result moved, in `KINDS` order then by name; both
    censuses must be of one engine (a UserError otherwise)."""
    was, now = engines.of_records(previous).name, engines.of_records(current).name
    if was != now:
        raise UserError(f"the previous census is on {was}, this one is on {now}: a diff is between releases of "
                        "one engine (their verdicts rest on different paths)")
    old = {r.model_type: r for r in previous}
    new = {r.model_type: r for r in current}
    out = []
    for name in sorted(set(old) | set(new)):
        a, b = old.get(name), new.get(name)
        k = kind(a, b)
        if k is None:
            continue
        c = Change(name, k, numbers(a) if a else None, numbers(b) if b else None,
                   path=_path(a, b) if k == FIXED else None)
        explain(c, sources)
        out.append(c)
    return sorted(out, key=lambda c: (KINDS.index(c.kind), c.model_type))


def explain(c: Change, sources) -> None:
    """`c.cause` (and `c.lines`): time where one side timed out; else what the sources say, where given."""
    if any(s["verdict"] == TIMED_OUT for s in (c.before, c.after) if s):
        c.cause = "time: one census ran out of time on it (the record says the limits and the load), not their code"
    elif sources is not None and c.kind not in (NEW, GONE):
        sources.explain(c)


def regressions(changes: Sequence[Change]) -> list[Change]:
    """The changes `--check --against` fails on: `regressed` and nothing else."""
    return [c for c in changes if c.kind == REGRESSED]


def _num(side: Optional[dict]) -> str:
    if not side:
        return "-"
    v = side["verdict"]
    if v in FAILURES and side.get("max_abs") is not None:
        return f"{v} {side['max_abs']:.2g} ({side.get('worst_schedule')})"
    return str(v)


def lines(changes: Sequence[Change], was: str, now: str, width: int = 100) -> list[str]:
    """The console's lines: a heading, then one line per change (and its cause under it)."""
    if not changes:
        return [f"against {was}: nothing changed"]
    head = f"against {was} (now {now}): " + ", ".join(
        f"{sum(c.kind == k for c in changes)} {k}" for k in KINDS if any(c.kind == k for c in changes))
    out = [head[:width]]
    for c in changes:
        row = f"  {c.model_type:<18} {c.kind:<17} {_num(c.before)} -> {_num(c.after)}"
        if c.path:
            row += f"; {c.path['schedule']} now {c.path['max_abs']:.2g}"
        out.append(row[:width])
        if c.cause:
            out.append(f"  {'':<18} {c.cause}"[:width])
    return out


def markdown(changes: Sequence[Change], was: str, now: str, why: Optional[dict] = None) -> str:
    """The diff as Markdown: counts, then a row per change with both sides' numbers, the cause the
    records and sources give, and `why` (model type -> one line of explanation), where given."""
    why = why or {}
    out = [f"Against {was}: " + (", ".join(f"{sum(c.kind == k for c in changes)} {k}" for k in KINDS
                                           if any(c.kind == k for c in changes)) or "nothing changed") + ".", ""]
    if not changes:
        return "\n".join(out) + "\n"
    out += [f"| architecture | change | {was} | {now} | why |", "|---|---|---|---|---|"]
    for c in changes:
        said = why.get(c.model_type) or c.cause or "-"
        if c.path:
            said = f"{c.path['schedule']} now {c.path['max_abs']:.2g}; {said}"
        out.append(f"| {c.model_type} | {c.kind} | {_num(c.before)} | {_num(c.after)} | {cell(said, None)} |")
    return "\n".join(out) + "\n"
