"""A bug-report draft per finding (smearcli scan, issue 21): versions, what is wrong, the shape,
the reproducer, and the suspect lines of the architecture's modeling file where a pattern points
at them (`suspects`): a branch on a one-token step or on "has previous state", a scan started
from `initial_state=None`, positions from `arange(T)` without the cache offset."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Optional

PATTERNS = (
    ("a branch on a one-token step", re.compile(r"(seq_len|shape\[1\]|size\(1\)|q_len)\s*==\s*1")),
    ("a branch on having a previous state", re.compile(r"has_previous_state|\bis_(conv|recurrent)_states?_initialized")),
    ("a scan started from no state", re.compile(r"initial_state\s*=\s*None")),
    ("positions from arange(T) without the cache offset",
     re.compile(r"^(?!.*(past|cache|seen|offset|start)).*position_ids\s*=\s*torch\.arange\(")),
)

TITLES = {"padded": "a row beside padded rows differs from the row alone",
          "rollback": "rejected drafts are not taken back out of the cache"}
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


def suspects(path: Optional[Path], limit: int = 8) -> list[tuple[str, int, str]]:
    """(what the pattern means, line number, the line) in the modeling file, at most `limit`."""
    if path is None or not path.is_file():
        return []
    out = []
    for i, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
        for what, rx in PATTERNS:
            if rx.search(line):
                out.append((what, i, line.strip()))
                break
        if len(out) >= limit:
            break
    return out


def write(record: dict, path: Path, versions: dict) -> Path:
    """The Markdown draft of one finding."""
    src = modeling_file(record.get("model_class"))
    rel = str(src).split("site-packages/")[-1] if src else "?"
    how = BOUNDARY_WORDS.get(record.get("worst_schedule"),
                             f"Feeding the same tokens through the model's own cache in the steps "
                             f"{record.get('worst_schedule')!r} ({record.get('steps')})")
    lines = [f"# {record.get('model_class') or record['model_type']}: "
             f"{TITLES.get(record.get('worst_schedule'), 'cached steps disagree with the full pass')}", "",
             ", ".join(f"{k} {v}" for k, v in versions.items()), "",
             f"{how} gives logits up to {record.get('max_abs') or 0:.3g} away from one call "
             "without a cache (tiny random config, float32, CPU; the float32 rounding floor is measured from "
             "the same pass in float64).", "",
             f"Shape of the error: **{record.get('shape')}**" + (f"; first off at {record['born_at']}" if record.get("born_at") else ""),
             ""]
    lines += [f"- {n}" for n in record.get("notes") or [] if "cache passed back" not in n]
    if record.get("reproducer"):
        lines += ["", f"Reproducer (torch and transformers only, exits 1 while the bug is there): "
                  f"`python {Path(record['reproducer']).name}`"]
    found = suspects(src)
    if found:
        lines += ["", f"Suspect lines in `{rel}`:", ""]
        lines += [f"- line {n}: `{text}` ({what})" for what, n, text in found]
    path = Path(path)
    path.write_text("\n".join(lines) + "\n")
    return path
