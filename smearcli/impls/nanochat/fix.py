"""A patch for the chunk-boundary smear bug (nanochat issue #756) in a user's nanochat checkout.

The audit (`smearcli compare --impl nanochat`) says whether a checkout has the bug; this module
writes the fix as a unified diff the maintainer can read and apply (`git apply` or `patch -p1`
from the checkout root), or applies it itself with a backup.

Standard library only: the user's code is read and parsed (`ast`), never imported or run. Split in
three: `fix_find` (where the smear is, by structure), `fix_source` (the rewritten text) and this
module (the diff, and applying it with a backup).

What is found, and how
----------------------
In `nanochat/gpt.py`, the `forward` method of class `GPT` (or, failing that, of the one class
whose forward uses `smear_gate`), and in it the smear block: the `if` that tests the forward's
`kv_cache` argument against None and whose code uses `smear_gate`/`smear_lambda` or the cache's `prev_embedding`. Its cached
branch must

  * read the cache's previous embedding into a local (`prev = kv_cache.prev_embedding`, or a
    tuple assignment that also stores the new one),
  * store the chunk's last pre-smear embedding (`kv_cache.prev_embedding = x[:, -1:]`), once,
    before it dispatches, and
  * dispatch on the number of tokens T (bound by `B, T = idx.size()` / `idx.shape`).

The bug, in that branch: the cached previous embedding is used only when one token is fed, so a
chunk of T > 1 tokens on a filled cache is smeared as if it began the sequence. "Already fixed"
is recognised by the same analysis: the previous embedding is used on a path that a multi-token
step can take (any shape: the one this module writes, the one proposed in the issue, a guarded
extra smear of the first token, ...).

Shapes this module rewrites (anything else is reported, never guessed at)
-------------------------------------------------------------------------
The dispatch must be exactly

    if T > 1:                     # also T >= 2, 1 < T, T != 1
        <prefill: shifts within the chunk, never uses prev>
    elif prev is not None:
        [gate = <expression over every position of the chunk>]
        x = x + gate * prev       # also `x + prev * gate`

where the gate the decode step uses covers every token of the chunk: either computed in the
decode branch from the whole chunk (`self.smear_gate(x[:, :, :24])`, `x[..., :24]`, `x[:, :, :C]`;
upstream nanochat at commit 92d63d4, SHAPE_UPSTREAM) or computed once before the dispatch from the
whole chunk, the prefill using `gate[:, 1:]` (smearcli's test stand-in, SHAPE_GATE_BEFORE). Local
names (x, prev, gate, T, kv_cache), whitespace and comments may differ.

The rewrite swaps the two branches and makes the decode branch general:

    if prev is not None:
        [gate = ...]                                   # unchanged
        x = x + gate * torch.cat([prev, x[:, :-1]], dim=1)
    elif T > 1:
        <prefill, unchanged>

With one token, `torch.cat([prev, x[:, :-1]], dim=1)` is `prev`, so decode is unchanged; with an
empty cache the prefill is unchanged; a chunk on a filled cache now gets its first token's
predecessor from the cache. The cache write stays where it is (it already stores the chunk's last
embedding on every step).

`nanochat/engine.py`: `KVCache` must define `prev_embedding` (upstream's and the stand-in's do, in
`__init__`, and copy it in `prefill`). One thing matters more once the fix is in: `reset()` must
clear `prev_embedding`, or the first chunk after a reset would be smeared with the last token of
the previous sequence (before the fix a multi-token first step ignored it). Upstream's reset does
clear it; where a checkout's does not, the same diff adds `self.prev_embedding = None` there.
"""

from __future__ import annotations

import difflib
import os
import re
import tempfile
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Optional

from .fix_find import (  # noqa: F401 - the statuses and shapes are part of this module's interface
    ALREADY_FIXED, FIXABLE, KNOWN_SHAPES, MARK, NO_SMEAR, SHAPE_GATE_BEFORE, SHAPE_UPSTREAM, STATUSES,
    UNRECOGNISED, SourceFix,
)
from .fix_source import fix_engine_source, fix_gpt_source  # noqa: F401

PACKAGE = "nanochat"
GPT_FILE = "gpt.py"
ENGINE_FILE = "engine.py"
BACKUP_SUFFIX = ".orig"
MAX_SOURCE_BYTES = 1 << 20  # per file: ast.parse of a 4 MiB file takes over a GiB and seconds


class FixError(ValueError):
    """The fix could not be read or written (not a checkout, a backup in the way, ...)."""


@dataclass(frozen=True)
class FixResult:
    """What `make_fix` / `apply_fix` found and did.

    status: one of STATUSES; message: one paragraph for a person; diff: the unified diff (paths
    a/nanochat/... b/nanochat/..., for `git apply` / `patch -p1` from the checkout root), empty
    unless status is FIXABLE; files: the relative paths the diff changes; shape: the known shape
    of the smear block that was rewritten (None if gpt.py needs no change); notes: remarks that
    need no change; root: the checkout; written: the files written (apply_fix with write=True);
    backups: the backups made of them."""
    status: str
    message: str
    diff: str = ""
    files: tuple[str, ...] = ()
    shape: Optional[str] = None
    notes: tuple[str, ...] = ()
    fixed: dict = field(default_factory=dict, repr=False)  # relative path -> new text
    root: Optional[Path] = None
    written: tuple[Path, ...] = ()
    backups: tuple[Path, ...] = ()

    @property
    def changed(self) -> bool:
        return bool(self.diff)


# ---------------------------------------------------------------------------------------------
# Small AST helpers


def patch_lines(text: str) -> list[str]:
    """The lines of a file as `patch` and `git apply` see them: ended by \\n alone (a \\r before
    it, a form feed or a \\u2028 is part of the line). A file with CR-only line endings is one line
    to them, so its diff replaces that one line."""
    return re.findall(r"[^\n]*\n|[^\n]+\Z", text)


def unified_diff(old: str, new: str, path: str) -> str:
    """A unified diff of one file, `a/<path>` -> `b/<path>`, that `git apply` and `patch -p1`
    accept (a last line without a newline is marked as such)."""
    out = []
    for line in difflib.unified_diff(patch_lines(old), patch_lines(new), f"a/{path}", f"b/{path}"):
        if not line.endswith("\n"):
            line += "\n\\ No newline at end of file\n"
        out.append(line)
    return "".join(out)


def make_fix(gpt_text: str, engine_text: Optional[str] = None) -> FixResult:
    """The fix for a checkout given the texts of its nanochat/gpt.py and (optionally)
    nanochat/engine.py: FIXABLE with a diff over both files, or a status that changes nothing. A
    UTF-8 byte order mark (which Python accepts at the start of a file) is kept, and left out of
    what is parsed."""
    g = _keeping_bom(fix_gpt_source, gpt_text)
    notes = list(g.notes)
    if "\r" in gpt_text and "\n" not in gpt_text:
        notes.append("gpt.py ends its lines with CR alone, so patch and git apply see it as one line: the "
                     "diff replaces that line whole")
    if g.status in (NO_SMEAR, UNRECOGNISED):
        return FixResult(g.status, g.message, notes=tuple(notes))
    fixed = {}
    messages = [g.message]
    if g.status == FIXABLE:
        fixed[f"{PACKAGE}/{GPT_FILE}"] = (gpt_text, g.fixed)
    if engine_text is None:
        notes.append("engine.py was not given, so KVCache was not checked")
    else:
        e = _keeping_bom(fix_engine_source, engine_text)
        notes += e.notes
        if e.status == UNRECOGNISED:
            return FixResult(UNRECOGNISED, f"{g.message}. But {e.message}; nothing changed", notes=tuple(notes))
        if e.status == FIXABLE:
            fixed[f"{PACKAGE}/{ENGINE_FILE}"] = (engine_text, e.fixed)
            messages.append(e.message)
    if not fixed:
        return FixResult(ALREADY_FIXED, g.message, notes=tuple(notes))
    diff = "".join(unified_diff(old, new, path) for path, (old, new) in fixed.items())
    return FixResult(FIXABLE, ". ".join(m.rstrip(".") for m in messages) + ".", diff, tuple(fixed), g.shape,
                     tuple(notes), {path: new for path, (_, new) in fixed.items()})


BOM = "\ufeff"


def _keeping_bom(fix_source, text: str) -> SourceFix:
    """fix_source's verdict on `text` without its byte order mark, the mark put back in the fix."""
    if not text.startswith(BOM):
        return fix_source(text)
    r = fix_source(text[len(BOM):])
    return replace(r, fixed=BOM + r.fixed) if r.fixed is not None else r


def checkout_root(path) -> Path:
    """The directory holding nanochat/gpt.py (`path` may also be the nanochat/ package itself)."""
    p = Path(os.path.expanduser(str(path)))
    if not p.is_dir():
        if p.exists():  # a file (a dangling link is not found)
            raise FixError(f"{path}: not a directory; give the checkout (the directory holding "
                           f"{PACKAGE}/{GPT_FILE})")
        raise FixError(f"{path}: directory not found")
    p = p.resolve()
    if not (p / PACKAGE / GPT_FILE).is_file() and p.name == PACKAGE and (p / GPT_FILE).is_file():
        p = p.parent
    if not (p / PACKAGE / GPT_FILE).is_file():
        raise FixError(f"{path}: not a nanochat checkout (no {PACKAGE}/{GPT_FILE} in {p})")
    return p


def _read(path: Path, shown: str) -> tuple[bytes, str]:
    """The bytes and text of a source file, at most MAX_SOURCE_BYTES (parsing a file of tens of
    megabytes takes gigabytes of memory); `shown` names it in messages."""
    size = path.stat().st_size
    if size <= MAX_SOURCE_BYTES:
        with open(path, "rb") as f:
            raw = f.read(MAX_SOURCE_BYTES + 1)
        size = len(raw)
    if size > MAX_SOURCE_BYTES:
        raise FixError(f"{shown}: {size / 2**20:.1f} MiB, larger than the {MAX_SOURCE_BYTES // 2**20} MiB "
                       f"fix reads (upstream's gpt.py is about 20 KB); nothing changed")
    try:
        return raw, raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise FixError(f"{shown}: not UTF-8 text ({e})") from None


def apply_fix(checkout_dir, write: bool = False) -> FixResult:
    """Read `<checkout_dir>/nanochat/gpt.py` (and engine.py beside it, if present) and return
    `make_fix`'s result. With write=True and a FIXABLE result, write the fixed files: each
    original is first copied to `<file>.orig` (refused, with nothing written, if such a backup
    exists or the file is a symbolic link), and each new text goes to a temporary file in the same
    directory that then replaces the original (os.replace), so no file is ever half-written. Files
    over MAX_SOURCE_BYTES are refused. Raises FixError."""
    root = checkout_root(checkout_dir)
    pkg = root / PACKAGE
    raw = {}

    def shown(rel: str) -> str:  # as the user named the checkout, not resolved
        return f"{checkout_dir}: {rel}"
    gpt_raw, gpt_text = _read(pkg / GPT_FILE, shown(f"{PACKAGE}/{GPT_FILE}"))
    raw[f"{PACKAGE}/{GPT_FILE}"] = gpt_raw
    engine_text = None
    if (pkg / ENGINE_FILE).is_file():
        raw[f"{PACKAGE}/{ENGINE_FILE}"], engine_text = _read(pkg / ENGINE_FILE, shown(f"{PACKAGE}/{ENGINE_FILE}"))
    r = make_fix(gpt_text, engine_text)
    r = replace(r, root=root)
    if not write or r.status != FIXABLE:
        return r
    targets = [root / rel for rel in r.files]
    for t, rel in zip(targets, r.files):  # os.replace would turn the link into a file, its target unfixed
        if t.is_symlink():
            raise FixError(f"{shown(rel)} is a symbolic link to {os.readlink(t)}; fix does not write through "
                           f"links: nothing written; without writing, fix prints the diff to apply to the file "
                           f"it points to")
    backups = [t.with_name(t.name + BACKUP_SUFFIX) for t in targets]
    there = [str(b) for b in backups if os.path.lexists(b)]
    if there:
        raise FixError(f"backup {', '.join(there)} already exists; move it away first (nothing written)")
    made_backups, temps, replaced = [], [], []
    try:
        for t, b, rel in zip(targets, backups, r.files):
            if t.read_bytes() != raw[rel]:
                raise FixError(f"{t} changed while the fix was being made; nothing written")
            with open(b, "xb") as f:  # exclusive: never overwrite a backup
                made_backups.append(b)
                f.write(raw[rel])
                f.flush()
                os.fsync(f.fileno())
            _copy_mode(t, b)
        for t, rel in zip(targets, r.files):
            fd, tmp = tempfile.mkstemp(prefix=f".{t.name}.", suffix=".smearcli-tmp", dir=t.parent)
            temps.append(Path(tmp))
            with os.fdopen(fd, "wb") as f:
                f.write(r.fixed[rel].encode("utf-8"))
                f.flush()
                os.fsync(f.fileno())
            _copy_mode(t, Path(tmp))
        for t, tmp in zip(targets, temps):
            os.replace(tmp, t)
            replaced.append(t)
    except BaseException:
        for t, b in zip(targets, backups):  # put back what was replaced
            if t in replaced:
                os.replace(b, t)
                made_backups.remove(b)
        for p in temps + made_backups:
            with _quiet():
                p.unlink()
        raise
    return replace(r, written=tuple(targets), backups=tuple(backups))


def _copy_mode(src: Path, dst: Path) -> None:
    with _quiet():
        os.chmod(dst, os.stat(src).st_mode & 0o7777)


class _quiet:
    def __enter__(self):
        return self

    def __exit__(self, kind, value, tb):
        return kind is not None and issubclass(kind, OSError)
