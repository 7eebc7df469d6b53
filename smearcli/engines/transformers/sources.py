"""Why an architecture's census result moved between two transformers releases, read from both
releases' sources (`smearcli scan --against PREVIOUS --against-source DIR`).

`Sources(before, after)` holds the two releases' package directories (`.../site-packages/transformers`;
`installed(before)`: the release imported here is the later one) and is what `census.diff.compare`
asks for a change's cause (`explain`): the lines of the architecture's modeling file that changed
between them, and those of `cache_utils.py`, the cache API every architecture's cache is made of,
where a rollback (which runs through that API) is the path that moved. Torch-free: it reads files.
"""

from __future__ import annotations

import difflib
import functools
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

SHARED = "cache_utils.py"  # the cache API every architecture's cache is made of
MAX_LINES = 6  # changed lines quoted per file


def modeling_file(model_type: str) -> str:
    """The modeling file of a model type, relative to the transformers package."""
    return f"models/{model_type}/modeling_{model_type}.py"


@dataclass(frozen=True)
class Sources:
    """Both releases' transformers package directories, for the modeling files' changed lines."""

    before: Path
    after: Path

    @classmethod
    def installed(cls, before: Path) -> "Sources":
        import transformers

        return cls(Path(before), Path(transformers.__file__).parent)

    def changed(self, relative: str) -> Optional[list[str]]:
        """The changed lines of one file between the releases ("-123: old", "+125: new"), [] when it
        is the same, None when either release lacks it."""
        a, b = self.before / relative, self.after / relative
        if not (a.is_file() and b.is_file()):
            return None
        old, new = a.read_text().splitlines(), b.read_text().splitlines()
        out = []
        for tag, i1, i2, j1, j2 in difflib.SequenceMatcher(None, old, new, autojunk=False).get_opcodes():
            if tag == "equal":
                continue
            out += [f"-{i + 1}: {old[i].strip()}" for i in range(i1, i2) if old[i].strip()]
            out += [f"+{j + 1}: {new[j].strip()}" for j in range(j1, j2) if new[j].strip()]
        return out

    @functools.cached_property
    def shared(self) -> Optional[list[str]]:
        return self.changed(SHARED)

    def explain(self, c) -> None:
        """A `census.diff.Change`'s `cause` and `lines`: its modeling file's changed lines, and the
        cache API's where a rollback is the path on either side."""
        name = modeling_file(c.model_type).split("/")[-1]
        own = self.changed(modeling_file(c.model_type))
        said = []
        if own:
            c.lines[name] = own[:MAX_LINES]
            said.append(f"{len(own)} lines differ in {name}")
        elif own == []:
            said.append(f"{name} unchanged")
        if any(s.get("worst_schedule") == "rollback" for s in (c.before, c.after) if s) and self.shared:
            c.lines[SHARED] = self.shared[:MAX_LINES]
            said.append(f"{len(self.shared)} lines differ in {SHARED} (the cache API the rollback runs through)")
        c.cause = "; ".join(said) or None
