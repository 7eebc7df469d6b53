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
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


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
    if not os.access(parent, os.W_OK):
        raise UserError(f"{path}: directory {parent} is not writable")
    if path.is_dir():
        raise UserError(f"{path}: is a directory")
