"""The --threads option, applied by every command through `build_setup`: the rule itself is
`smearcli.util.threads` (torch's choice, or 1 thread when other processes keep every core busy)."""

from __future__ import annotations

import os
from typing import Optional

from ..util.errors import UserError

HELP = ("CPU threads for torch. Default: torch's choice, or 1 when other processes keep every "
        "core busy (load average >= cores). The footer says which.")


def apply_threads(threads: Optional[int]) -> str:
    """Check --threads, apply the thread rule, and return the footer line."""
    from ..util.threads import use_threads

    cores = os.cpu_count() or 1
    if threads is not None and threads < 1:
        raise UserError(f"--threads must be >= 1, got {threads}")
    if threads is not None and threads > 4 * cores:  # torch would spawn them all
        raise UserError(f"--threads {threads}: this machine has {cores} CPU cores; use at most {4 * cores}")
    return use_threads(threads).replace("(as asked;", "(--threads;")
