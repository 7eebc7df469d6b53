"""What a run of an implementation hands the commands: a `Job` to run, and its `Report`.

A `Job` runs with a progress bar and returns a `Report`: the JSON document, the console report,
the `--save` payload, the figure's comparison and the verdict. `comparison_job` turns runners and
tokens into a Job whose Report is the standard one (`ComparisonReport`): all a new
implementation needs. Imports no torch until a job runs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional, Sequence


class Report:
    """What a finished run hands the commands."""
    verdict: str = ""
    failed: bool = False
    footer: str = ""  # the threads line, printed under tables and after "wrote FILE"
    # each finding placed against what upstream knows (`census.known.of_run`); None: not placed
    upstream: Optional[list] = None

    def failing(self, every: bool = False) -> bool:
        """Whether a check fails: the run failed, and (unless `every`) a finding of it is new or a
        regression, or it was not placed (an inconclusive run is no finding: it fails as before).
        A bug upstream already tracks (open, fixed later, by design) is listed, not failed."""
        if not self.failed or every or not self.upstream:
            return self.failed
        from ..census.known import gated

        return bool(gated(self.upstream))

    def document(self) -> dict:
        raise NotImplementedError

    def render(self, console) -> None:
        raise NotImplementedError

    def payload(self) -> Optional[dict]:
        """What --save writes; None: nothing ran, so nothing is saved."""
        return None

    def figure(self, schedule: str):
        """(Comparison, title or None, subtitle or "") for a figure of `schedule`; None: none."""
        return None

    def draw(self, schedule: str, kind: str):
        """The matplotlib Figure `plot` writes (`render.figures.figure` of `figure()`); None: none."""
        drawn = self.figure(schedule)
        if drawn is None:
            return None
        from ..render import figures

        comparison, title, subtitle = drawn
        return figures.figure(comparison, schedule, kind, title=title, subtitle=subtitle)


class ComparisonReport(Report):
    """The standard report of one `compare.Comparison`: the table, the compare/1 document (or
    another `document` function), `--save` and the figure."""

    def __init__(self, c, info: Optional[dict] = None, footer: str = "", document=None,
                 title: Optional[str] = None, subtitle: str = "", upstream: Optional[list] = None):
        self.comparison, self.info, self.footer = c, info or {}, footer
        self._document, self._title, self._subtitle = document, title, subtitle
        self.verdict, self.failed = c.verdict, not c.passed
        self.upstream = upstream

    def document(self) -> dict:
        from ..measure import jsondoc

        doc = self._document(self.comparison) if self._document else jsondoc.to_json(self.comparison, self.info)
        if self.upstream:
            doc["upstream"] = [u.to_json() for u in self.upstream]
        return doc

    def render(self, console) -> None:
        from ..render.table import print_comparison, title_line

        print_comparison(self.comparison, console, title_line(self.comparison), footer=self.footer)
        if self.upstream:
            from ..census.known import lines

            for line in lines(self.upstream):
                console.print(line, soft_wrap=True, highlight=False, markup=False)

    def payload(self) -> dict:
        from ..measure.jsondoc import save_payload

        return save_payload(self.document(), {"": self.comparison})

    def figure(self, schedule: str):
        title = None
        if self._title is not None:
            from ..render.figures import describe_steps

            steps = self.comparison.get(schedule, self.comparison.labels[0]).steps
            title = f"{self._title}\nschedule {schedule}: {describe_steps(steps)}, vs one call without a cache"
        return self.comparison, title, self._subtitle


class AnswerReport(Report):
    """An answer without runs (a checkpoint from before the smear existed): exit 0."""

    def __init__(self, verdict: str, document: dict):
        self.verdict, self._doc = verdict, document

    def document(self) -> dict:
        return self._doc

    def render(self, console) -> None:
        console.print(self.verdict, soft_wrap=True, highlight=False)


@dataclass
class Job:
    """A prepared run: `run(bar)` does the work (progress on a `cli.progress.Bar`)."""
    run: Callable
    name: str = ""  # the model, for a figure's title


def comparison_job(runners, tokens, schedules, options, tolerance: float, info: Optional[dict] = None,
                   footer: str = "", notes: Sequence[str] = (), reference=None, place=None, **report_kw) -> Job:
    """A Job that compares `runners` on `tokens` and reports with `ComparisonReport`; `reference`,
    if given, is the runner measured against (see `compare.compare`); `place(comparison)`, if
    given, places its findings against what upstream knows (`census.known.of_run`)."""
    def run(bar):
        from ..measure import compare

        c = compare.compare(list(runners), tokens, schedules, options=options, tolerance=tolerance,
                            progress=bar.label, tokens_progress=bar.tokens, notes=notes, reference=reference,
                            overlap=True)
        return ComparisonReport(c, info, footer, upstream=place(c) if place is not None else None, **report_kw)
    return Job(run, runners[0].name)


