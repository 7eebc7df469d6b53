"""transformers' fast-kernel fallback warnings, collected instead of printed.

Without `causal_conv1d`, `mamba_ssm` or `flash-linear-attention` installed, every SSM and
linear-attention model warns that it falls back to its slow PyTorch path: "`causal_conv1d_fn` is
falling back to its reference PyTorch implementation because `causal_conv1d` is not installed"
in 5.24, "The fast path is not available because one of `(selective_state_update, ...)` is None"
in 5.0, several lines per architecture. The census runs each architecture in its own process, so
those lines land in the middle of its progress. `Fallbacks` is a logging filter that drops them and
keeps the names of the packages they miss; `note(missing)` says it once, as one line.
"""

from __future__ import annotations

import contextlib
import logging
import re

# the messages of every release from 5.0 on (each names its missing packages its own way)
FALLBACK = re.compile(r"falling back to its reference PyTorch implementation|fast path is not available")
NOT_INSTALLED = re.compile(r"`([\w.-]+)` is not installed")  # 5.24: the package by its own name
ALIASES = {  # how 5.0's messages name them: by their repositories
    "causal_conv1d": ("causal_conv1d", "causal-conv1d"),
    "mamba_ssm": ("mamba_ssm", "mamba-ssm", "state-spaces/mamba"),
    "flash-linear-attention": ("flash-linear-attention", "flash_linear_attention", "fla-org/"),
}


def missing_in(message: str) -> set[str]:
    """The packages a fallback message says are missing (none when it is no fallback message)."""
    if not FALLBACK.search(message):
        return set()
    found = set(NOT_INSTALLED.findall(message))
    found |= {name for name, aliases in ALIASES.items() if any(a in message for a in aliases)}
    return found or {"?"}


class Fallbacks(logging.Filter):
    """Drops transformers' fallback warnings and keeps what they say is missing (`missing`)."""

    def __init__(self):
        super().__init__()
        self.missing: set[str] = set()

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            found = missing_in(record.getMessage())
        except Exception:  # a record that cannot be formatted is not ours to judge
            return True
        self.missing |= found
        return not found


@contextlib.contextmanager
def collected():
    """Yields a `Fallbacks` on transformers' log handlers while the block runs (a filter on the
    library's logger would miss its modules' records: only handlers see what propagates)."""
    from transformers.utils import logging as tf_logging

    root = tf_logging.get_logger("transformers")  # configures the library's default handler
    handlers = root.handlers or [logging.lastResort]
    f = Fallbacks()
    for h in handlers:
        h.addFilter(f)
    try:
        yield f
    finally:
        for h in handlers:
            h.removeFilter(f)


def note(missing) -> str:
    """The one line a census says about the packages its architectures fell back without."""
    names = ", ".join(sorted(m for m in missing if m != "?")) or "not named"
    return f"note: transformers' fast SSM kernels are not installed ({names}): the census runs their slow paths"
