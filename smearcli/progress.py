"""A progress bar on stderr for long work; silent when stderr is not a terminal."""

from __future__ import annotations

import contextlib
import sys


@contextlib.contextmanager
def progress_bar(label: str, total: int):
    """Yields `advance(description)`: call it before each unit of work."""
    if not sys.stderr.isatty():
        yield lambda desc=None: None
        return
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    with Progress(TextColumn(f"{label} [progress.description]{{task.description}}"), BarColumn(),
                  MofNCompleteColumn(), TimeElapsedColumn(), console=Console(stderr=True),
                  transient=True) as p:
        task = p.add_task("", total=total)
        started = [False]

        def advance(desc=None):
            if started[0]:
                p.advance(task)
            started[0] = True
            if desc:
                p.update(task, description=desc)

        yield advance
