"""Findings grouped by root cause.

transformers copies code between models: `# Copied from` and modular files give FalconMamba,
Jamba and Zamba a mixer that is Mamba's with a few lines changed, and the bug with it. A census
that lists each copy as its own finding asks a maintainer to read one bug four times. So
`groups(records)` joins the findings whose born-in modules (`born`) run the same code:

- the same `forward` once its model's names are normalised (`born_in["code"]`, a digest of the
  text with decorators, docstring and comments out and model prefixes made generic), or
- the same suspect line inside that forward (`born_in["suspects"]`, normalised the same way),
  with the same shape: a line such as `if seq_len == 1:` recurs in code that breaks in other ways
  (NemotronH's Mamba-2 mixer carries both of the Mamba mixer's one-token branches, and its
  finding is a decode path, not a dropped state).

- the same piece of their cache API where a finding is a rollback headed by their crop, on a path
  the library declares unsupported, that left the state as the draft left it (`api_at`): the
  fix is in that `crop`, not in each architecture.

- a declared copy: the born-in class says, in transformers' source, that it copies another
  finding's born-in class (a `# Copied from transformers.models.X.modeling_X.Class` comment above
  the class or its `forward`, or a modular file's `class Mine(Theirs)`), followed through chains
  (Jamba's mixer from FalconMamba's from Mamba's), with the same shape. `copies(file, cls, root)`
  reads the declarations when the finding is made, into its `born_in["copies"]`.

Findings linked through any chain of these are one group. It is computed from the records alone,
so `scan --merge` of shards groups as one scan does. Each group names the shared code and every
architecture it breaks; its draft and reproducer are those of the original where the others declare
they copy it (`origin`: Mamba's mixer, which FalconMamba's and Jamba's copy), else of its first
architecture by name.
"""

from __future__ import annotations

import ast
import os
import re
from typing import Optional, Sequence

from ...judging.verdicts import FINDINGS
from ...census.record import BornIn, BoundaryResult, Record, born_module


def findings(records: Sequence[Record]) -> list[Record]:
    """The records that are findings (bug or unconfirmed), by name."""
    return sorted((r for r in records if r.verdict in FINDINGS), key=lambda r: r.model_type)


COPIED = re.compile(r"^\s*# Copied from transformers\.models\.(\w+)\.modeling_\w+\.(\w+)")


def ident(file: Optional[str], cls: Optional[str]) -> Optional[str]:
    """"mamba.MambaMixer" for a class in transformers/models/mamba/modeling_mamba.py (None elsewhere)."""
    parts = (file or "").replace("\\", "/").split("/")
    if not cls or len(parts) < 2 or "models" not in parts[:-2]:
        return None
    return f"{parts[-2]}.{cls}"


def declared(root: str, model: str, cls: str) -> list[str]:
    """The classes ("dir.Class") that `cls` of models/`model` declares it copies, one step: a
    `# Copied from` comment above `class cls` or above its `def forward`, and its bases in the
    modular file imported from another model (the modular converter copies it in)."""
    out: list[str] = []
    base = os.path.join(root, "models", model)
    try:
        lines = open(os.path.join(base, f"modeling_{model}.py"), encoding="utf-8").read().splitlines()
    except OSError:
        lines = []
    start = next((i for i, line in enumerate(lines) if re.match(rf"class {cls}\b", line)), None)
    if start is not None:
        above = start - 1
        while above >= 0 and (lines[above].startswith("#") or lines[above].startswith("@")):
            m = COPIED.match(lines[above])
            out += [f"{m.group(1)}.{m.group(2)}"] if m else []
            above -= 1
        for i in range(start + 1, len(lines)):
            if lines[i] and not lines[i][0].isspace() and not lines[i].startswith("#"):
                break  # the class ended
            if re.match(r"\s+def forward\b", lines[i]):
                m = COPIED.match(lines[i - 1]) or (COPIED.match(lines[i - 2]) if lines[i - 1].strip().startswith("@") else None)
                out += [f"{m.group(1)}.{m.group(2)}"] if m else []
    try:
        tree = ast.parse(open(os.path.join(base, f"modular_{model}.py"), encoding="utf-8").read())
    except (OSError, SyntaxError):
        return list(dict.fromkeys(out))
    imported = {}
    for node in tree.body:
        if isinstance(node, ast.ImportFrom) and node.module:
            src = node.module.split(".")
            if node.level == 2 and len(src) == 2 or src[:2] == ["transformers", "models"] and len(src) == 4:
                for a in node.names:
                    imported[a.asname or a.name] = f"{src[-2]}.{a.name}"
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == cls:
            # a base imported from another model is copied into this model's modeling file
            out += [imported[b.id] for b in node.bases if isinstance(b, ast.Name) and b.id in imported]
    return list(dict.fromkeys(out))


def copies(file: Optional[str], cls: Optional[str], root: str) -> list[str]:
    """Every class ("dir.Class") the born-in class declares it copies (`declared`), through chains,
    nearest first; `root` is transformers' package directory, `file` relative to its parent."""
    me = ident(file, cls)
    out: list[str] = []
    todo = [me] if me else []
    while todo:
        model, name = todo.pop(0).split(".", 1)
        for found in declared(root, model, name):
            if found != me and found not in out:
                out.append(found)
                todo.append(found)
    return out


def api_at(rec: Record) -> Optional[str]:
    """Where in their cache API the finding's headline departed: a rollback headed by their crop on
    a path the library declares unsupported (`engines.transformers.boundary.declared`: its `api_finding`), or None."""
    rollback = (rec.boundaries or {}).get("rollback")
    crop = rollback.their_crop if rollback is not None and rec.worst_schedule == "rollback" else None
    found = crop.api_finding if isinstance(crop, BoundaryResult) and crop.status in FINDINGS else None
    return str(found.at or "?") if found is not None and rollback.mode == "crop" else None


def links(rec: Record) -> set:
    """What another finding must share with this one to be its group: its code, one of its
    suspect lines beside its shape, or the cache API code its headline departed in (`api_at`: one
    `crop` leaves every architecture's recurrent state as the draft left it)."""
    b = born(rec)
    out = {("code", b.code)} if b.code else set()
    for s in b.suspect_lines():
        out.add(("line", s[1], rec.shape))
    if api_at(rec):
        out.add(("api", api_at(rec), rec.shape))
    return out


def born(rec: Record) -> BornIn:
    """A finding's born-in module (`census.record.born_module`), or an empty one (every field None)
    where it names none: a boundary finding, a trace that found none."""
    return born_module(rec) or BornIn()


def _root(parent: list, i: int) -> int:
    while parent[i] != i:
        parent[i] = parent[parent[i]]
        i = parent[i]
    return i


def groups(records: Sequence[Record]) -> list[dict]:
    """One entry per root cause among the findings, in order of their first architecture's name
    (see the module docstring): `architectures`, `first`, `by` (what they share, in words),
    `lines` (the suspect lines they all share), `code` (the first's module, class and forward), `members`
    (each architecture's born-in module), and the first's `reproducer`, `reproducer_status` and
    `report_draft`."""
    found = findings(records)
    parent = list(range(len(found)))
    owner: dict = {}
    for i, rec in enumerate(found):
        for key in links(rec):
            if key in owner:
                parent[_root(parent, i)] = _root(parent, owner[key])
            else:
                owner[key] = i
    born_here = {}
    for i, rec in enumerate(found):
        b = born(rec)
        me = ident(b.file, b.class_name)
        if me:
            born_here.setdefault((me, rec.shape), []).append(i)
    for i, rec in enumerate(found):  # a declared copy of another finding's born-in class, same shape
        for c in born(rec).copied():
            for j in born_here.get((c, rec.shape), []):
                parent[_root(parent, i)] = _root(parent, j)
    members: dict[int, list[Record]] = {}
    for i, rec in enumerate(found):
        members.setdefault(_root(parent, i), []).append(rec)
    return [entry(recs) for recs in sorted(members.values(), key=lambda rs: rs[0].model_type)]


def shared(recs: list[Record]) -> tuple[Optional[str], list[str]]:
    """(the same code by digest for all of them, or None; the suspect lines all of them hold)."""
    codes = {born(r).code for r in recs}
    code = codes.pop() if len(codes) == 1 else None
    lines = None
    for r in recs:
        mine = [s[1] for s in born(r).suspect_lines()]
        lines = mine if lines is None else [x for x in lines if x in mine]
    return code, list(dict.fromkeys(lines or []))


def origin(recs: list[Record]) -> Optional[dict]:
    """The finding born in the class the others declare they copy, which copies none of theirs:
    the code a maintainer fixes (and `make fix-copies` carries to the copies). None without one."""
    def me(r):
        return ident(born(r).file, born(r).class_name)

    mine = {me(r) for r in recs} - {None}
    copied = {c for r in recs for c in born(r).copied()} & mine
    return next((r for r in recs if me(r) in copied and not set(born(r).copied()) & mine), None)


def entry(recs: list[Record]) -> dict:
    """The group of these findings (sorted by name; see `groups`), headed by the original where
    the others declare they copy it (`origin`), else by its first architecture by name."""
    first = origin(recs) or recs[0]
    b = born_module(first)
    code, lines = shared(recs)
    mine = {ident(born(r).file, born(r).class_name) for r in recs} - {None}
    declared = any(set(born(r).copied()) & mine for r in recs)
    apis = {api_at(r) for r in recs}
    if len(recs) == 1:
        by = None
    elif len(apis) == 1 and None not in apis:
        by = f"the same cache API code: `{apis.pop()}`"
    elif code:
        by = "the same forward" + ("" if len({born(r).class_name for r in recs}) == 1
                                   else ", once model names are normalised")
    elif lines:
        by = "the same suspect line" + ("s" if len(lines) > 1 else "")
    elif declared:
        by = "declared copies of the same code (`# Copied from`, modular inheritance)"
    else:
        by = "a chain of shared suspect lines"
    return {"architectures": [r.model_type for r in recs], "first": first.model_type, "by": by,
            "lines": lines if len(recs) > 1 else [], "shape": first.shape,
            "code": where(b) if b else None,
            "members": {r.model_type: member(born(r)) for r in recs},
            "reproducer": first.reproducer, "reproducer_status": first.reproducer_status,
            "report_draft": first.report_draft}


def member(b: BornIn) -> dict:
    """A group member's born-in module as the JSON document's `groups` lists it."""
    return {"module": b.module, "class": b.class_name, "file": b.file, "lines": list(b.span()) if b.span() else None}


def where(b: BornIn) -> str:
    """"MambaMixer.forward (transformers/models/mamba/modeling_mamba.py:358-484)"."""
    span = f":{b.span()[0]}-{b.span()[1]}" if b.span() else ""
    return f"{b.class_name}.forward ({b.file or '?'}{span})"


def of(records: Sequence[Record], model_type: str) -> Optional[dict]:
    """The group of one architecture (None when it is not a finding)."""
    return next((g for g in groups(records) if model_type in g["architectures"]), None)


def api_findings(records: Sequence[Record]) -> list[dict]:
    """Findings at an API's code: a rollback the library declares unsupported whose crop still ran
    and left the logits off (`engines.transformers.boundary.declared`), one per piece of their code
    (`api_finding["at"]`: the cache layer's `crop`), each with every architecture it affects (by
    name), the first one's declaration and the largest error. Each is also a finding on those
    architectures (their rollback boundary), counted there; records written before that rule
    kept it as `unsupported`, and are listed here all the same."""
    by: dict[str, dict] = {}
    for r in sorted(records, key=lambda r: r.model_type):
        rollback = (r.boundaries or {}).get("rollback")
        crop = rollback.their_crop if rollback else None
        found = crop.api_finding if isinstance(crop, BoundaryResult) else None
        if found is None:
            continue
        at = str(found.at or "?")
        g = by.setdefault(at, {"at": at, "what": found.what, "declared": crop.declared,
                               "architectures": [], "largest": None})
        g["architectures"].append(r.model_type)
        m = crop.multiple
        if isinstance(m, (int, float)) and (g["largest"] is None or m > g["largest"]):
            g["largest"] = m
    return sorted(by.values(), key=lambda g: (-len(g["architectures"]), g["at"]))
