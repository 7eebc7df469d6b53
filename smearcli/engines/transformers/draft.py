"""A bug-report draft per finding: versions, what is wrong, the shape,
the reproducer, and the suspect lines of the architecture's modeling file where a pattern points
at them (`suspects`): a branch on a one-token step or on "has previous state", a scan started
from `initial_state=None`, positions from `arange(T)` without the cache offset."""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Optional, Sequence

from ...census import engines, known
from ...census.record import BornIn, Record, born_module
from ...measure.shapes import LEAK

PATTERNS = (
    ("a branch on a one-token step", re.compile(r"(seq_len|shape\[1\]|size\(1\)|q_len)\s*==\s*1")),
    ("a branch on having a previous state", re.compile(r"has_previous_state|\bis_(conv|recurrent)_states?_initialized")),
    ("a scan started from no state", re.compile(r"initial_state\s*=\s*None")),
    ("positions from arange(T) without the cache offset",
     re.compile(r"^(?!.*(past|cache|seen|offset|start)).*position_ids\s*=\s*torch\.arange\(")),
)

TITLES = {"padded": "a row beside padded rows differs from the row alone",
          "rollback": "rejected drafts are not taken back out of the cache",
          LEAK: "the full pass reads the tokens after each position"}
BOUNDARY_WORDS = {
    "padded": "Running a row in one batch beside its prefix right- and left-padded, with the attention mask",
    "rollback": "A prefill, then drafts whose last tokens are rejected and taken back out of the model's own cache",
}


def modeling_file(model_class: Optional[str]) -> Optional[Path]:
    """The source file of a transformers model class, by name (None when it is not found)."""
    if not model_class:
        return None
    import inspect

    import transformers

    cls = getattr(transformers, model_class, None)
    try:
        return Path(inspect.getsourcefile(cls)) if cls is not None else None
    except TypeError:
        return None


def suspect_kind(line: str) -> Optional[str]:
    """What a suspect line's pattern means, or None when no pattern matches it."""
    return next((what for what, rx in PATTERNS if rx.search(line)), None)


def suspects(path: Optional[Path], limit: int = 8) -> list[tuple[str, int, str]]:
    """(what the pattern means, line number, the line) in the modeling file, at most `limit`."""
    if path is None or not path.is_file():
        return []
    out = []
    for i, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
        what = suspect_kind(line)
        if what:
            out.append((what, i, line.strip()))
        if len(out) >= limit:
            break
    return out


def resolve(rel: Optional[str]) -> Optional[Path]:
    """The file a `born_in` names ("transformers/models/x/modeling_x.py"), found on sys.path."""
    if not rel:
        return None
    if Path(rel).is_absolute():
        return Path(rel) if Path(rel).is_file() else None
    for entry in sys.path:
        p = Path(entry or ".") / rel
        if p.is_file():
            return p
    return None


def quoted(born: BornIn) -> list[str]:
    """The lines of a `born_in`'s forward as the installed file has them ([] when it is not there)."""
    path, span = resolve(born.file), born.span()
    if path is None or not span:
        return []
    return path.read_text(errors="replace").splitlines()[span[0] - 1:span[1]]


def write(record: Record, path: Path, versions: dict, group: Optional[dict] = None) -> Path:
    """The Markdown draft of one finding; with its `group` (`groups.groups`) of more than one
    architecture, the draft of the whole root cause: every architecture it breaks, listed."""
    src = modeling_file(record.model_class)
    rel = str(src).split("site-packages/")[-1] if src else "?"
    how = BOUNDARY_WORDS.get(record.worst_schedule,
                             f"Feeding the same tokens through the model's own cache in the steps "
                             f"{record.worst_schedule!r} ({record.steps})")
    said = (f"{how} gives logits up to {record.max_abs or 0:.3g} away from one call "
            "without a cache (tiny random config, float32, CPU; the float32 rounding floor is measured from "
            "the same pass in float64).")
    if record.shape == LEAK:  # no cache involved: the full pass itself reads ahead
        said = (f"One call without a cache, run again with the last tokens removed or changed, moves the logits "
                f"of earlier positions by up to {record.max_abs or 0:.3g} (tiny random config, float32, "
                "CPU; the float32 rounding floor is measured from the same pass in float64): a position's logits "
                "depend on the tokens after it, so every caller of the forward over a whole sequence (scoring, "
                "the loss with labels, a prefill) sees the future.")
    lines = [f"# {record.model_class or record.model_type}: "
             f"{TITLES.get(LEAK if record.shape == LEAK else record.worst_schedule, 'cached steps disagree with the full pass')}", "",
             ", ".join(f"{k} {v}" for k, v in versions.items()), "", *reach_section(record.reach, record.shape == LEAK),
             said, "",
             f"Shape of the error: **{record.shape}**" + (f"; first off at {record.born_at}" if record.born_at else ""),
             ""]
    lines += [f"- {n}" for n in record.notes or [] if "cache passed back" not in n]
    born = born_module(record)
    lines += born_section(born) if born else []
    lines += group_section(group, record.model_type) if group and len(group["architectures"]) > 1 else []
    if record.reproducer:
        lines += ["", f"Reproducer (torch and transformers only, exits 1 while the bug is there): "
                  f"`python {Path(record.reproducer).name}`"]
    found = suspects(src)
    if found:
        span = born.span() if born and born.file and born.file in rel else None
        lines += ["", f"Suspect lines in `{rel}`:", ""]
        lines += [f"- line {n}: `{text}` ({what}" + (", inside the forward above)" if span and span[0] <= n <= span[1]
                                                      else ")") for what, n, text in found]
    path = Path(path)
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def reach_section(reach, leak: bool = False) -> list[str]:
    """The draft's lead: each public-API path as run (`engines.transformers.reach`), and what it gave; `leak`: the
    finding is a full pass that leaks (`reach.leak_paths`: who runs it)."""
    if not isinstance(reach, dict) or not reach:
        return []
    out = ["**Through the public API** (" + ("who runs the full pass that leaks, each run again with the last "
                                             "tokens removed and changed; `generate` against the prompt fed one "
                                             "token a step" if leak else
                                             "greedy `generate`, compared with the full pass over the tokens it made")
           + "):", ""]
    for name, e in reach.items():
        if e is None:
            continue
        num = f", max |dlogit| {e.max_abs:.3g}" if e.max_abs is not None else ""
        why = f": {e.why}" if e.why else ""
        toks = f"; its tokens against the row's own generate: {e.tokens}" if e.tokens else ""
        out.append(f"- `{name}`: **{e.result}**{num}{toks}{why}")
    return out + [""]


def born_section(born: BornIn) -> list[str]:
    """Where the error is born (`born.born_in`), with the lines of that module's forward quoted."""
    span = born.span() or (0, 0)
    out = ["", f"Born in `{born.module}` (`{born.class_name}`): the first module whose output "
           f"(at position {born.position}) leaves the floor while the inputs it receives agree with the "
           "full pass" + (f"; the first output off is `{born.first_off}`, whose inputs were already off"
                          if born.first_off and born.first_off != born.module else "") + "."]
    code = quoted(born)
    if code:
        out += ["", f"<details><summary><code>{born.class_name}.forward</code>, {born.file} lines "
                f"{span[0]}-{span[1]}</summary>", "", "```python", *code, "```", "", "</details>"]
    return out


def group_section(group: dict, me: str) -> list[str]:
    """The other architectures one root cause breaks (`groups.groups`), each with its born-in module."""
    others = [a for a in group["architectures"] if a != me]
    out = ["", f"The same code breaks {len(others)} more architecture{'s' * (len(others) != 1)} "
           f"({group.get('by')}" + (": " + "; ".join(f"`{x}`" for x in group.get("lines") or []) if group.get("lines") else "")
           + "):", ""]
    for a in others:
        m = group["members"].get(a) or {}
        span = m.get("lines") or []
        where = f", {m.get('file')} lines {span[0]}-{span[1]}" if len(span) == 2 else ""
        out.append(f"- {a}: `{m.get('module')}` (`{m.get('class')}`{where})" if m.get("module") else f"- {a}")
    return out + ["", "Each has its reproducer beside this one (`<model_type>.py`)."]


def write_groups(records, versions: dict) -> list[Path]:
    """After a scan: each root cause of more than one architecture gets the draft of the architecture
    that heads it (`groups.entry`: the original of declared copies, else the first by name) rewritten to name them all (`groups.groups`), and its reproducer notes them
    (`repro.note_group`). Only the drafts and reproducers this machine wrote are touched."""
    from . import groups, repro

    out = []
    by_name = {r.model_type: r for r in records}
    for g in groups.groups(records):
        rec = by_name[g["first"]]
        if len(g["architectures"]) < 2 or not rec.report_draft or not Path(rec.report_draft).is_file():
            continue
        out.append(write(rec, Path(rec.report_draft), versions, g))
        if rec.reproducer and Path(rec.reproducer).is_file():
            repro.note_group(Path(rec.reproducer), [a for a in g["architectures"] if a != g["first"]])
    return out


def after_run(records, meta: dict) -> None:
    """The transformers engine's step once a run is over (`after_run` in its `registration`):
    `write_groups`, then each draft as what upstream knows has it (`for_upstream`)."""
    write_groups(records, {"transformers": meta.get("transformers_version", "?"),
                           "torch": meta.get("torch_version", "?")})
    for_upstream(records)


def comment(record: Record, draft: str) -> Optional[str]:
    """A finding's draft for what upstream knows: for a known open bug, a comment for its thread
    (the census's evidence first, the draft below); for a regression, the draft citing the fix; for
    a departure by design, a fix made later or a duplicate, nothing (None: no draft is written)."""
    c = known.worst(record)
    if c in (None, known.NEW):
        return draft
    threads = [t for u in record.upstream for t in u.threads]
    if c == known.REGRESSION:
        fix = next(t for u in record.upstream if u.class_name == known.REGRESSION for t in u.threads)
        return (f"> **A regression.** {fix.url} ({fix.title or fix.id}) was {fix.status}; the census "
                f"finds it again on {engines.release_of(record) or 'this release'}.\n\n" + draft)
    if c == known.OPEN:
        t = threads[0]
        others = f" ({len(threads) - 1} more threads: {', '.join(x.url for x in threads[1:])})" if len(threads) > 1 else ""
        head = [f"# A comment for {t.url}", "",
                f"This is known upstream ({t.title or t.id}, {t.status}){others}: post what follows there, not "
                "as a new report. What the census adds: the release it was seen on, a reproducer that exits 1 while "
                "the bug is there, and the architectures that share the code (in the draft below).", "",
                f"- seen on: {known.engine_of(record)} {engines.release_of(record) or '?'}",
                "- findings: " + "; ".join(f"{u.path} ({u.shape or u.verdict})" for u in record.upstream),
                ""]
        return "\n".join(head) + "\n<details><summary>The census's draft</summary>\n\n" + draft + "\n</details>\n"
    return None


def for_upstream(records: Sequence[Record]) -> None:
    """After a run: each finding's draft as `comment` has it (a comment for a known open thread, a
    regression citing its fix), and no draft at all where upstream needs none (its file, which this
    run wrote, removed and the record's `report_draft` cleared)."""
    from ...util.files import atomic_write

    for r in records:
        path = Path(r.report_draft) if r.report_draft else None
        if path is None or not path.is_file() or known.worst(r) in (None, known.NEW):
            continue
        text = comment(r, path.read_text(encoding="utf-8"))
        if text is None:
            path.unlink()
            r.report_draft = None
            continue
        with atomic_write(path) as f:
            f.write(text)
