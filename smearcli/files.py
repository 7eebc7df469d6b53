"""Atomic file output: write to a temporary file beside the target, then rename over it.

A run that fails half way never leaves a partial file, and an existing file is only ever
replaced by a complete one."""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path


@contextlib.contextmanager
def atomic_write(path, mode: str = "w", **kwargs):
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, mode, **kwargs) as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, _final_mode(path))  # mkstemp's 0600 would make outputs private
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def _final_mode(path: Path) -> int:
    """An existing file keeps its permissions; a new one gets the usual 0666 minus the umask."""
    try:
        return path.stat().st_mode & 0o7777
    except OSError:
        mask = os.umask(0)
        os.umask(mask)
        return 0o666 & ~mask


def check_output_path(path, suffixes: tuple[str, ...]) -> None:
    """Refuse, before any work, an output path we could not write: wrong suffix, missing or
    read-only directory."""
    from .errors import UserError

    path = Path(path)
    if path.suffix.lower() not in suffixes:
        raise UserError(f"{path}: unknown suffix {path.suffix or '(none)'}; use {', '.join(suffixes)}")
    parent = path.parent if str(path.parent) else Path(".")
    if not parent.is_dir():
        raise UserError(f"{path}: directory {parent} does not exist")
    if path.is_dir():
        raise UserError(f"{path}: is a directory")
    if not os.access(parent, os.W_OK):
        raise UserError(f"{path}: directory {parent} is not writable")
    try:  # the real test (root passes os.access even on a read-only file system)
        fd, probe = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=parent)
    except OSError as e:
        raise UserError(f"{path}: cannot write in directory {parent} ({e.strerror or e})") from e
    os.close(fd)
    os.unlink(probe)
