"""The one progress bar of every command: on stderr, only when stderr is a terminal (piped
output and CI logs stay clean), and never with --quiet.

Two kinds: counted in runs (`advance`, `update`), or in tokens (`label` names the run under way,
`tokens(done, total)` moves the bar inside it and shows tokens per second and the time left)."""

from __future__ import annotations

import contextlib
import sys


class Bar:
    """Driven one unit at a time (`advance(description)`, called before each unit of work), with
    absolute counts (`update(description, done, total)`, a total that may grow), or in tokens
    (`label(description)` before each run, `tokens(done, total)` after each forward step)."""

    def __init__(self, progress=None, task=None):
        self._p, self._task, self._started = progress, task, False

    @property
    def shown(self) -> bool:
        return self._p is not None

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

    def label(self, desc: str) -> None:
        if self._p is not None:
            self._p.update(self._task, description=desc)

    def tokens(self, done: int, total: int) -> None:
        if self._p is not None:
            self._p.update(self._task, completed=done, total=total)


def token_rate(speed) -> str:
    """The speed column of a token bar: '1,234 tok/s', or '' before there is a rate."""
    return "" if not speed else f"{speed:,.0f} tok/s"


def _token_columns():
    from rich.progress import ProgressColumn, TimeRemainingColumn
    from rich.text import Text

    class Rate(ProgressColumn):
        def render(self, task):
            return Text(token_rate(task.speed))

    class Done(ProgressColumn):
        def render(self, task):
            total = "?" if task.total is None else f"{int(task.total):,}"
            return Text(f"{int(task.completed):,}/{total} tokens")

    return [Done(), Rate(), TimeRemainingColumn()]


def wants_bar(quiet: bool = False, stream=None) -> bool:
    """A bar is drawn on a terminal's stderr, unless --quiet."""
    stream = stream or sys.stderr
    return not quiet and stream.isatty()


@contextlib.contextmanager
def progress_bar(label: str, total=None, quiet: bool = False, unit: str = "runs"):
    """Yields a `Bar`; `total` None when it is only known as the work goes. `unit` "tokens" shows
    tokens done, tokens per second and the time left instead of runs done."""
    if not wants_bar(quiet):
        yield Bar()
        return
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    counts = _token_columns() if unit == "tokens" else [MofNCompleteColumn()]
    with Progress(TextColumn(f"{label} [progress.description]{{task.description}}"), BarColumn(),
                  *counts, TimeElapsedColumn(), console=Console(stderr=True),
                  transient=True) as p:
        yield Bar(p, p.add_task("", total=total))
