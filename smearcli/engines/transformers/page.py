"""The transformers engine's census page (its `registration` names `sections` for it): the findings
with their reproducers, the root causes, the findings about their API, the boundaries, then every
architecture. `census.report.markdown` puts the frame (title, counts, what upstream knows) around it."""

from __future__ import annotations

from typing import Sequence

from ...census import known
from ...census.record import Record, born_module
from ...census.report import PY_PATH, cell, err_cell, f64_cell, short_reason, sort_key
from ...measure.schedules import census_schedules
from ...judging.verdicts import (
    BUG, BY_DESIGN, CRASHED, LEFT_UNSUPPORTED, NOT_JUDGED, NOT_JUDGED_WHY, NOT_RUN, UNCONFIRMED,
)
from . import reach
from .groups import api_findings, groups


def sections(records: Sequence[Record], meta: dict) -> list[str]:
    """The transformers engine's page: the findings with their reproducers, their root causes,
    the findings about the API, the boundaries, then every row."""
    out = []
    bugs = [r for r in sorted(records, key=sort_key) if r.verdict in (BUG, UNCONFIRMED, BY_DESIGN)]
    if bugs:
        out += ["## Findings", "", "Each finding was rerun with the model in float64 and every float32 request inside "
                "its code lifted to float64: a bug keeps its size, rounding vanishes (`smearcli.judging.evidence`). "
                "An unconfirmed one shrank without vanishing, or could not run lifted.", "",
                # the init scale rides in the error's cell where it is not the default, and the float64
                # rerun beside the error: two columns fewer keep the page at 1280 px
                "| architecture | verdict | worst schedule | max abs dlogit (float64, lifted) | shape | born in | "
                "public API | upstream | reproducer (exit) |", "|---|---|---|---|---|---|---|---|---|"]
        for r in bugs:
            rep = r.reproducer
            rep = f"`{rep.split('/')[-1]}` ({r.reproducer_status})" if rep else "-"
            b = born_module(r)
            # the class alone: the module's qualified name and the forward's file and lines, which
            # cannot wrap, would widen the table past a page; they are in the Root causes table,
            # the JSON, the draft and the console's line
            where = f"`{b.class_name}`" if b else "-"
            init = "" if r.init is None else f" at init {r.init}"
            out.append(f"| {r.model_type} | {r.verdict} | {r.worst_schedule} | {err_cell(r)} ({f64_cell(r)}){init} | "
                       f"{r.shape} | {where} | {reach.summary(r.reach)} | {known.cell(r)} | {rep} |")
        out.append("")
        out += groups_md(records)
    out += api_md(records)
    out += boundaries_md(records)
    out += ["## Every architecture", "", "| architecture | verdict | worst schedule | error | shape or reason | "
            f"{' / '.join(census_schedules())} | upstream |", "|---|---|---|---|---|---|---|"]
    for r in sorted(records, key=sort_key):
        why = r.shape or r.reason or "; ".join(
            n for n in (r.notes or []) if n.startswith(("would see", "power not")) or "rounding" in n) or ""
        why = PY_PATH.sub(r"\1", why)  # a frame by its file's name: a whole path does not wrap on a page
        why = cell(why)
        # one column for both (the section above lists every one that is not ok, with why): the
        # page keeps its width at 1280 px
        cells = " / ".join(cell(boundary_cell(r, b), 40) for b in census_schedules())
        out.append(f"| {r.model_type} | {r.verdict} | {r.worst_schedule or '-'} | {err_cell(r)} | {why} | "
                   f"{cells} | {known.cell(r)} |")
    return out


def boundaries_md(records: Sequence[Record]) -> list[str]:
    """The padded and rollback section: counts by status (and rollback's mode), then every
    architecture where one failed, crashed, did not run or could not be left-padded, with why."""
    if not any(r.boundaries for r in records):
        return []
    *rest, last = census_schedules()
    out = [f"## {', '.join(rest).capitalize()} and {last}" if rest else f"## {last.capitalize()}", ""]
    for name in census_schedules():
        b = boundary_counts(records, name)
        out.append(f"- {name}: " + (", ".join(f"{n} {k}" for k, n in sorted(b.items())) or "not run") + ".")
    if any(e and e.status == NOT_JUDGED for r in records for e in (r.boundaries or {}).values()):
        out.append(f"- {NOT_JUDGED}: the boundary agreed, but {NOT_JUDGED_WHY} (or beside it), so the power "
                   "check that an ok needs never ran.")
    rows = []
    for r in sorted(records, key=sort_key):
        for name in census_schedules():
            e = (r.boundaries or {}).get(name)
            if e and e.status in (BUG, UNCONFIRMED, CRASHED, NOT_RUN, LEFT_UNSUPPORTED):
                why = (e.shape or "") + ("; " if e.shape and e.why else "") + (e.why or "")
                rows.append(f"| {r.model_type} | {name} | {boundary_cell(r, name).split(':')[0]} | "
                            f"{cell(why, 160)} | {known.cell(r, name)} |")
    if rows:
        out += ["", "| architecture | boundary | result | shape / why | upstream |", "|---|---|---|---|---|", *rows]
    return out + [""]


def boundary_cell(r: Record, name: str) -> str:
    """One boundary's result in a few words: "ok", "bug 2.3e+04x", "crashed: modeling_x.py:12",
    "not run: why"; rollback adds its mode ("(crop)", "(copy)"); "-" when it has no entry."""
    e = (r.boundaries or {}).get(name)
    if not e:
        return "-"
    st = e.status if e.given("status") else "?"
    if st == "bug":
        text = f"bug {e.multiple or 0:.2g}x"
    elif st in (CRASHED, NOT_RUN):
        text = f"{st}: {short_reason(e.why or '') if st == CRASHED else e.why or '?'}"
    elif st == NOT_JUDGED:  # it agreed, but beside a failure no power check ran: no verdict of its own
        text = f"{st}: {e.why or NOT_JUDGED_WHY}"
    else:
        text = st
    return text + (f" ({e.mode})" if e.mode else "")


def boundary_counts(records: Sequence[Record], name: str) -> dict[str, int]:
    """status -> architectures, for one boundary (rollback: "ok (crop)", "ok (copy)", ...)."""
    out: dict[str, int] = {}
    for r in records:
        e = (r.boundaries or {}).get(name)
        if e:
            key = (e.status if e.given("status") else "?") + (f" ({e.mode})" if e.mode else "")
            out[key] = out.get(key, 0) + 1
    return out


def table_lines(records: Sequence[Record]) -> list[str]:
    """The console table's lines after its rows (`census.engines.Engine.footer`): each boundary's
    counts by status, then one line per piece of their API's code found wrong (`api_lines`)."""
    out = []
    for name in census_schedules():
        b = boundary_counts(records, name)
        if b:
            out.append(f"{name}: " + ", ".join(f"{n} {k}" for k, n in sorted(b.items())))
    return out + api_lines(records)


def under_row(r: Record) -> list[str]:
    """What the console table says under an architecture's row (`census.engines.Engine.under`):
    the module its finding was born in, too long for a column of its own."""
    b = born_module(r)
    return [f"born in {b.module} ({b.class_name})"] if b else []


def api_lines(records: Sequence[Record]) -> list[str]:
    """One line per piece of their API's code found wrong (`groups.api_findings`), not one per
    architecture: the console table's last lines before its count."""
    return [f"their API, declared unsupported: {g['at'].split('/')[-1]}: {g['what']} "
            f"({len(g['architectures'])} architectures)" for g in api_findings(records)]


def api_md(records: Sequence[Record]) -> list[str]:
    """Declared unsupported, done anyway: one row per piece of their API's code
    (`groups.api_findings`), with every architecture it affects (each counted there too)."""
    found = api_findings(records)
    if not found:
        return []
    out = ["## Declared unsupported, done anyway: findings about the API", "",
           "Where the library declares the rollback unsupported (`generate` refuses assisted decoding) yet "
           "their `crop` returned without error and left the logits off, the state a user gets back is "
           "silently wrong: a finding on each architecture (its rollback boundary, counted as a bug, "
           "the declaration quoted beside it) and one finding about their API, at its code, for "
           "every architecture it affects (`smearcli.engines.transformers.groups.api_findings`).", "",
           "| their code | what it does | architectures | largest error | declared (first architecture) |",
           "|---|---|---|---|---|"]
    for g in found:
        big = "-" if g["largest"] is None else f"{g['largest']:.2g}x the floor"
        out.append(f"| `{g['at']}` | {g['what']} | {', '.join(g['architectures'])} | {big} | "
                   f"{cell(g['declared'] or '-', 200)} |")
    return out + [""]


def groups_md(records: Sequence[Record]) -> list[str]:
    """The root causes: findings whose born-in modules run the same code, one row per group with
    the shared code, every architecture it breaks, and the group's one reproducer and draft."""
    gs = groups(records)
    if not gs:
        return []
    n = sum(len(g["architectures"]) for g in gs)
    out = ["## Root causes", "", f"{n} finding{'s' * (n != 1)}, {len(gs)} root cause{'s' * (len(gs) != 1)}. Findings are one root cause when the modules "
           "they are born in run the same `forward` once model names are normalised, or share a suspect line "
           "inside it with the same shape, or one's class declares it copies the other's (`# Copied from`, a modular "
           "file's base) with the same shape (`smearcli.engines.transformers.groups`); each group has one reproducer and one draft, "
           "those of the code the others declare they copy, else of its first architecture by name.", "",
           "| root cause | architectures | shape | shared | reproducer, draft |", "|---|---|---|---|---|"]
    for g in gs:
        first = g["members"][g["first"]]
        others = [m["class"] for name, m in g["members"].items() if name != g["first"] and m.get("class")]
        code = (f"`{first['class']}.forward`, {short_where(first)}" if first.get("class") else "-") + \
            (f"; also {', '.join(f'`{c}`' for c in dict.fromkeys(others) if c != first['class'])}"
             if set(others) - {first["class"]} else "")
        what = g["by"] or "-"
        if g["lines"]:
            what += ": " + "; ".join(f"`{x}`" for x in g["lines"][:2])
        files = [f"`{p.split('/')[-1]}`" for p in (g.get("reproducer"), g.get("report_draft")) if p]
        out.append(f"| {cell(code, None)} | {', '.join(g['architectures'])} | {g.get('shape')} | "
                   f"{cell(what, None)} | {', '.join(files) or '-'} |")
    return out + [""]
def short_where(b: dict) -> str:
    """"modeling_mamba.py:358-484": a born-in forward's file by its name, and its lines."""
    lines = b.get("lines") or []
    return (b.get("file") or "?").split("/")[-1] + (f":{lines[0]}-{lines[1]}" if len(lines) == 2 else "")
