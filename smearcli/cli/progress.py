"""The one progress bar of every command: on stderr, only when stderr is a terminal (piped
output and CI logs stay clean)."""

from __future__ import annotations

import contextlib
import sys


class Bar:
    """Driven either one unit at a time (`advance(description)`, called before each unit of work)
    or with absolute counts (`update(description, done, total)`, a total that may grow)."""

    def __init__(self, progress=None, task=None):
        self._p, self._task, self._started = progress, task, False

    def advance(self, desc=None) -> None:
        if self._p is None:
            return
        if self._started:
            self._p.advance(self._task)
        self._started = True
        if desc:
            self._p.update(self._task, description=desc)

    def update(self, desc: str, done: int, total: int) -> None:
        if self._p is not None:
            self._p.update(self._task, description=desc, completed=done, total=total)


@contextlib.contextmanager
def progress_bar(label: str, total=None):
    """Yields a `Bar`; `total` None when it is only known as the work goes."""
    if not sys.stderr.isatty():
        yield Bar()
        return
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    with Progress(TextColumn(f"{label} [progress.description]{{task.description}}"), BarColumn(),
                  MofNCompleteColumn(), TimeElapsedColumn(), console=Console(stderr=True),
                  transient=True) as p:
        yield Bar(p, p.add_task("", total=total))
