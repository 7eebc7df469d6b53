"""What an engine measured of one architecture, as the census records it: one set of rules for the
record's schedules and its headline, whichever engine ran them (vLLM's census and llama.cpp's, each
held to the transformers reference; the toy engine's).

An engine says what it ran, never a word: each schedule is a `Ran`, measured against the reference
(its `RunMetrics`, and where it departed the float64 rerun that was made of it, an
`evidence.Confirmation`: an engine without a float64 form makes one that says so) or not, and why
(one of `judge.OUTCOMES`, with the engine's words). From those runs:

- `judged(runs, power, unusable)`: the judge's word and each run's status (`judge.judge`);
- `entries(runs, judgement)`: the record's `schedules`, a `census.record.ScheduleResult` each, in the
  order the engine ran them: a measured run's status and numbers (and the engine's own fields on it,
  `Ran.extra`, then its step sizes when it took more than one step), an unmeasured run's status and why;
- `headline(runs, names)`: the run the record is headed by, the largest error among `names` (every
  measured run where none is named), as the record's `worst_schedule`, `max_abs`, `multiple`, `steps`;
- `crash(runs, judgement)`: a crashed record's headline, the first run the judge calls crashed and why;
- `verdict_fields(runs, judgement, power, names)`: what every engine's record of a measured verdict
  carries, by one rule: the headline (a crash's where the word is `crashed`), the headline run's
  float64 rerun as the record's `confirmation` where that run departed, and `power` wherever the
  power check measured it, whatever the word.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional, Sequence

from ..judging import judge
from ..judging.verdicts import CRASHED
from .record import ScheduleResult


@dataclass
class Ran:
    """One schedule as an engine ran it: measured (`metrics`: a `measure.metrics.RunMetrics`,
    `confirmation`: the float64 rerun of a departure, None where it passed) or not (`outcome`, one
    of `judge.OUTCOMES`, and `why`, in the engine's words); the step sizes it took; `extra`: the
    engine's own fields on its entry (llama.cpp's distance from its one-call prefill)."""
    schedule: str
    steps: list = field(default_factory=list)
    metrics: Optional[object] = None
    confirmation: Optional[object] = None
    outcome: Optional[str] = None
    why: str = ""
    extra: dict = field(default_factory=dict)

    def as_judged(self) -> judge.Run:
        if self.metrics is None:
            return judge.Run(self.schedule, outcome=self.outcome)
        return judge.Run(self.schedule, self.metrics.passed, self.confirmation)


def judged(runs: Sequence[Ran], power=None, unusable: Optional[str] = None) -> judge.Judgement:
    """The judge's word on `runs` (`power`: the check's `evidence.Power`; `unusable`: why the
    reference cannot be measured against, `evidence.unusable`)."""
    return judge.judge([r.as_judged() for r in runs], power, unusable)


def entries(runs: Sequence[Ran], judgement: judge.Judgement) -> dict[str, ScheduleResult]:
    """name -> the record's entry of each run (module docstring)."""
    out = {}
    for r in runs:
        status = str(judgement.statuses[r.schedule])
        if r.metrics is None:
            out[r.schedule] = ScheduleResult(status, why=r.why)
            continue
        e = out[r.schedule] = ScheduleResult(status, r.metrics.max_abs_logits, r.metrics.logits_multiple)
        for name, value in r.extra.items():
            setattr(e, name, value)
        if len(r.steps) > 1:
            e.steps = ",".join(map(str, r.steps[:12]))
    return out


def headline(runs: Sequence[Ran], names: Sequence[str] = ()) -> dict:
    """The record's headline fields: the run among `names` with the largest error (the first of
    equals), every measured run where `names` is empty; all None when there is none."""
    pool = [r for r in runs if r.metrics is not None and (not names or r.schedule in names)]
    worst = max(pool, key=lambda r: r.metrics.max_abs_logits, default=None)
    if worst is None:
        return dict(worst_schedule=None, max_abs=None, multiple=None, steps=None)
    return dict(worst_schedule=worst.schedule, max_abs=worst.metrics.max_abs_logits,
                multiple=worst.metrics.logits_multiple, steps=list(worst.steps))


def crash(runs: Sequence[Ran], judgement: judge.Judgement) -> dict:
    """A crashed record's headline: the first run the judge calls crashed, its steps and why (a
    crash measures nothing)."""
    crashed = judgement.named(CRASHED)
    first = next(r for r in runs if r.schedule in crashed)
    return dict(worst_schedule=first.schedule, steps=list(first.steps), max_abs=None, multiple=None,
                reason=f"{first.schedule}: {first.why}")


def verdict_fields(runs: Sequence[Ran], judgement: judge.Judgement, power=None, names: Sequence[str] = ()) -> dict:
    """The record's fields of a measured verdict, one rule for every engine (module docstring):
    `crash` where the judge's word is crashed, else `headline(runs, names)`; `confirmation`, the
    headline run's float64 rerun where it departed (an unconfirmed record says why it could not be
    confirmed, as a bug says how it was); `power` (`evidence.Power`) wherever it was measured: a
    departure or a crash does not make the check's power unknown."""
    out = crash(runs, judgement) if judgement.word == CRASHED else headline(runs, names)
    head = next((r for r in runs if r.schedule == out["worst_schedule"] and r.metrics is not None), None)
    if head is not None and head.confirmation is not None and not head.metrics.passed:
        out["confirmation"] = head.confirmation.to_json()
    if power is not None and power.measured:
        out["power"] = power.to_json()
    return out
