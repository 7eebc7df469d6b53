"""`compare` as a library call: every schedule on every runner against the full forward pass.

Owns the one result type, `Comparison` (runs, metrics, noise floor, analytic checks, what ran), the
plan of runs it makes, its verdict and its plain-text table; `smearcli.measure.jsondoc` writes its JSON
document (schema `smearcli.compare/1`) and the payload `--save` writes. `smearcli.testing`, the Hugging Face adapter and the audit of a user's nanochat
checkout are thin layers on it.

```python
from smearcli.measure import compare, inputs
from smearcli.gpt import weights
lm = weights.tiny_model()
result = compare.compare(lm.model, inputs.random_tokens(lm.model.config, 256))
print(result.verdict)
```

The first argument is our GPT (run under each of `logics`), one `smearcli.measure.runner.Runner`, or a
list of them: one series each, all measured against the first runner's full forward pass, or
against `reference`'s when given (a runner that is the yardstick only: its full pass is the
reference, that pass in float64 the noise floor, and it runs no schedule of its own).

A run whose `outcome` is set (the engine crashed, or checked nothing) is not measured: it is kept
in `Comparison.unmeasured`, printed under the table and named in the verdict; a crash fails it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Optional, Sequence

import torch
from torch import Tensor

from ..judging import evidence, judge
from . import profile
from ..util.errors import CannotRun
from .metrics import AnalyticCheck, NoiseFloor, RunMetrics, analytic_check, measure_all
from ..util.defaults import DEFAULT_SCHEDULES, LOGIC_NAMES, NOISE_MARGIN
from .runner import Described, Runner
from .runplan import collect, common_layers, plan, run_all
from .schedules import missing, run_schedule, runnable, shape, shape_at
from .steps import RunResult, ScheduleOptions
from ..util.formatters import fmt_steps, sci, sig3, times
from ..judging.verdicts import BUG, CRASHED, INCONCLUSIVE, OK, ROUNDING, UNCONFIRMED, Verdict, line


@dataclass
class Comparison:
    """What `compare` measured. Everything a table, a figure or a JSON document needs is here;
    nothing reads the model again."""
    described: list[Described]  # one per runner, in series order
    tokens: Tensor
    options: ScheduleOptions
    layers: list[str]  # capture-point names, "logits" last
    noise: NoiseFloor
    reference: RunResult
    runs: list[RunResult]
    metrics: list[RunMetrics]  # one per run, same order
    analytic: dict[str, list[AnalyticCheck]] = field(default_factory=dict)  # schedule -> checks
    tolerance: float = NOISE_MARGIN
    dtype: torch.dtype = torch.float32  # the compute dtype: one ulp of it bounds the floor
    notes: list[str] = field(default_factory=list)  # what ran, for the report
    analytic_labels: dict[str, str] = field(default_factory=dict)  # schedule -> the checked run's label
    unmeasured: list[RunResult] = field(default_factory=list)  # runs with an outcome (crashed, ...)
    # why no schedule's agreement means anything (the state under test never mattered), or None
    inconclusive: Optional[str] = None
    # (schedule, label) of each run that left the tolerance -> its float64 rerun (`evidence.Confirmer`)
    confirmations: dict = field(default_factory=dict)
    power: Optional[evidence.Power] = None  # how small an error in the carried state could show

    @property
    def labels(self) -> list[str]:
        return [d.label for d in self.described]

    def description(self, label: Optional[str] = None) -> Described:
        """The Described of one series (default: the first, the reference's)."""
        return next((d for d in self.described if label is None or d.label == label), self.described[0])

    def get(self, schedule: str, label: Optional[str] = None) -> RunMetrics:
        """The metrics of one run; `label` may be left out when one runner ran."""
        for m in self.metrics:
            if m.schedule == schedule and (label is None or m.logic == label):
                return m
        raise KeyError((schedule, label))

    def confirmation(self, m: RunMetrics) -> Optional[evidence.Confirmation]:
        return self.confirmations.get((m.schedule, m.logic))

    def judged(self, m: RunMetrics) -> judge.Run:
        """One measured run as the judge sees it (`smearcli.judging.judge.Run`)."""
        return judge.Run(f"{m.schedule}/{m.logic}", m.passed, self.confirmation(m))

    @property
    def judgement(self) -> judge.Judgement:
        """The verdict word and every run's status, from `smearcli.judging.judge` (nowhere else)."""
        runs = [self.judged(m) for m in self.metrics]
        runs += [judge.Run(f"{r.schedule}/{r.logic}", outcome=r.outcome) for r in self.unmeasured]
        return judge.judge(runs, self.power, self.inconclusive)

    def status(self, m: RunMetrics) -> str:
        """One run's status (`judge.status`): ok, bug, unconfirmed, or rounding (left the
        tolerance in its own precision, gone in float64: counted as ok)."""
        return judge.status(self.judged(m))

    @property
    def failures(self) -> list[RunMetrics]:
        """Runs that leave the tolerance and are not float32 rounding (bugs and unconfirmed)."""
        return [m for m in self.metrics if self.status(m) in (BUG, UNCONFIRMED)]

    @property
    def bugs(self) -> list[RunMetrics]:
        return [m for m in self.metrics if self.status(m) == BUG]

    @property
    def rounding(self) -> list[RunMetrics]:
        return [m for m in self.metrics if self.status(m) == ROUNDING]

    @property
    def crashed(self) -> list[RunResult]:
        """The runs the judge calls crashed (their code raised in them)."""
        return [r for r in self.unmeasured if judge.unmeasured(r.outcome) == CRASHED]

    @property
    def word(self) -> Verdict:
        """The verdict word (`smearcli.judging.judge`): bug only when confirmed in float64, ok only with
        power."""
        return self.judgement.word

    @property
    def passed(self) -> bool:
        """True for an `ok` verdict alone (never for inconclusive, unconfirmed or crashed)."""
        return self.word is OK

    def outcome_line(self, r: RunResult) -> str:
        """"prefix/vllm crashed: IndexError: ..." for a run that was not measured."""
        name = f"{r.schedule}/{r.logic}" if len(self.labels) > 1 else r.schedule
        return f"{name} {r.outcome}: {r.message}"

    def run_name(self, m: RunMetrics) -> str:
        return f"{m.schedule}/{m.logic}" if len(self.labels) > 1 else m.schedule

    def born_at(self, m: RunMetrics) -> Optional[tuple[str, int]]:
        """(capture point, position) where the run first leaves NOISE_MARGIN x the floor."""
        fd = m.first_departure
        return None if fd is None else (self.layers[fd[0]], fd[1])

    def start_share(self, m: RunMetrics) -> Optional[float]:
        """Share of the error at the capture point where it is born that sits on chunk starts
        (None: no chunk starts, or a run that never leaves the noise)."""
        fd = m.first_departure
        return None if fd is None else m.chunk_start_share_at(fd[0])

    def describe(self, m: RunMetrics) -> str:
        """One sentence for one run: where its error is born, how big, how far it spreads."""
        T = self.tokens.size(1)
        born = self.born_at(m)
        first = m.chunk_starts[0] if m.chunk_starts else None
        msg = f"{self.run_name(m)} (steps {fmt_steps(m.steps)}) diverges from the full pass"
        if born is not None:
            msg += f": born at {born[0]}@{born[1]}{born_where(born[1], m.chunk_starts)}"
        elif first is not None:
            msg += f" (first chunk start: {first})"
        msg += (f"; max |dlogit| {m.max_abs_logits:.3g} ({times(m.logits_multiple)}x noise); "
                f"{m.positions_above_noise}/{T} positions above {NOISE_MARGIN:g}x noise")
        share = self.start_share(m)
        if share is not None and born is not None:
            msg += f"; {share:.0%} of the error at {born[0]} sits on chunk starts"
        conf = self.confirmation(m)
        if conf is not None:
            msg += f"; {conf.phrase()}"
        return msg

    @property
    def verdict(self) -> str:
        return verdict(self)

    def table(self) -> str:
        """A plain-text table, one row per run, the notes and the verdict (for assertion messages;
        `render.table` draws the rich one)."""
        T = self.tokens.size(1)
        several = len(self.labels) > 1
        head = ["schedule", *["logic"] * several, "steps", "max|dlogit|", "xnoise", "KL max", "top-1",
                "@starts", "born at", "spread", ""]
        rows = []
        for m in self.metrics:
            born, share = self.born_at(m), self.start_share(m)
            rows.append([m.schedule, *[m.logic] * several, fmt_steps(m.steps), sci(m.max_abs_logits),
                         times(m.logits_multiple), sci(m.kl_max), f"{m.top1_agreement:.1%}",
                         "-" if share is None else f"{share:.0%}",
                         "-" if born is None else f"{born[0]}@{born[1]}",
                         f"{m.positions_above_noise}/{T}", run_word(self.status(m))])
        widths = [max(len(r[i]) for r in [head] + rows) for i in range(len(head))]
        text = len(head) - 3  # born at, spread, verdict: left-aligned like the names
        row = lambda r: "  ".join(c.ljust(w) if i < 2 + several or i >= text else c.rjust(w)
                                  for i, (c, w) in enumerate(zip(r, widths))).rstrip()
        out = [f"{self.tokens.size(0)} x {T} tokens; noise floor (logits) {sci(self.noise.per_layer[-1])} "
               f"from {self.noise.source}; a run passes within {self.tolerance:g}x",
               row(head)] + [row(r) for r in rows]
        out += [self.outcome_line(r) for r in self.unmeasured]
        out += self.notes
        if self.power is not None:
            out.append(f"power: {self.power.describe()}")
        out += [f"{run_word(self.status(m))}: " + self.describe(m) for m in self.failures + self.rounding]
        out.append(self.verdict)
        return "\n".join(out)


# -- the phrases a verdict and the table share -------------------------------------------------------
def born_where(pos: int, starts: Sequence[int]) -> str:
    """", the first chunk start (16)", ", a chunk start (32)", ", not on a chunk start (first
    chunk start: 16)", or "" for a run without chunk starts."""
    if not starts:
        return ""
    if pos in starts:
        return f", {'the first chunk start' if pos == starts[0] else 'a chunk start'} ({pos})"
    return f", not on a chunk start (first chunk start: {starts[0]})"


def starts_phrase(starts: Sequence[int], schedule: str, shown: int = 4) -> str:
    """"the 3 chunk starts of chunked: 64, 128, 192", the list cut after `shown` with a count."""
    more = f" and {len(starts) - shown} more" if len(starts) > shown else ""
    what = "chunk start" if len(starts) == 1 else f"{len(starts)} chunk starts"
    return f"the {what} of {schedule}: {', '.join(map(str, starts[:shown]))}{more}"


def as_runners(target, logics: Sequence[str] = LOGIC_NAMES, name: Optional[str] = None) -> list[Runner]:
    """A list of runners from a runner, a list of them, or our GPT (one runner per logic)."""
    if isinstance(target, Runner):
        return [target]
    if isinstance(target, (list, tuple)):
        if not target or not all(isinstance(r, Runner) for r in target):
            raise TypeError("compare takes our GPT, a Runner, or a non-empty list of Runners")
        return list(target)
    from ..gpt.gpt_runners import runners  # our GPT

    return runners(target, logics, name)


def compare(target, tokens: Tensor, schedules: Sequence[str] = DEFAULT_SCHEDULES,
            logics: Sequence[str] = LOGIC_NAMES, options: ScheduleOptions = ScheduleOptions(),
            tolerance: float = NOISE_MARGIN, progress=None,
            check_runs: Optional[Callable[[RunMetrics], bool]] = None,
            tokens_progress: Optional[Callable[[int, int], None]] = None,
            name: Optional[str] = None, notes: Sequence[str] = (),
            reference: Optional[Runner] = None, overlap: bool = False,
            confirm: bool = True, power: bool = True) -> Comparison:
    """Run the reference and every (schedule, runner); measure each; judge by `smearcli.judging.evidence`.

    `target`: our GPT (with `logics`), a Runner or a list of Runners (see `as_runners`); the first
    runner's full forward pass is the reference, or `reference`'s when given (a runner that is
    the yardstick only). The noise floor is that full pass against itself in float64
    (`evidence.floor`); decode is a schedule like any other. A run that leaves `tolerance` x the
    floor is rerun in float64, lifted (`evidence.Confirmer`; `confirm=False` skips it and leaves it
    unconfirmed); when every run agrees, the state the cache carries is zeroed to show the check
    had power (`power=False` skips it).

    `progress`, if given, is called with a short label before each run; `tokens_progress(done,
    total)` after every forward step, with the positions fed so far over all runs. `check_runs`
    picks the runs that get the analytic check (default: those that fail, on runners that give
    smear terms). Decode runs once for runners whose `one_token_step` keys are equal (our GPT's
    logics share it): the one result stands for each. `overlap`: run that decode on a second
    thread beside the other runs (CPU, `Runner.thread_safe` runners; see `run_planned`): the same
    numbers, sooner on two cores; off inside a `smearcli.measure.profile` session and on one thread."""
    runners = as_runners(target, logics, name)
    ref_runner = reference or runners[0]
    for s in schedules:
        for r in runners:
            if not runnable(r, s):
                raise CannotRun(f"{r.label} cannot run the {s} schedule ({missing(r, s)})")
    tokens = tokens.to(ref_runner.device)
    step = progress or (lambda label: None)
    planned = plan(runners, schedules, reference)
    with profile.section("runs"):  # outside the forwards: caches, captures, the steps' stitching
        results = run_all(planned, tokens, options, step, tokens_progress,
                          overlap and profile.active() is None and torch.get_num_threads() > 1, run_schedule)
    ref, runs = collect(planned, results)
    unmeasured = [r for r in runs if r.outcome is not None]
    runs = [r for r in runs if r.outcome is None]
    layers = list(ref_runner.layers)
    ref, runs, layers = common_layers(ref, runs, layers)
    dtype = ref_runner.dtype or ref.logits.dtype
    f64 = evidence.Float64(ref_runner, tokens, capture=ref.hiddens is not None)  # floor and confirmations share it
    step("noise floor (float64)")
    with profile.section("float64 floor"):  # the float64 copy of the model, its full pass's forwards apart
        floor = evidence.floor(ref_runner, ref, tokens, dtype, f64)
    metrics = measure_all(ref, runs, floor, tolerance)
    by_label = {r.label: r for r in runners}
    with profile.section("analytic"):
        analytic, checked = analytic_checks(runs, metrics, by_label, tokens, ref,
                                            check_runs or (lambda m: not m.passed))
    notes = list(notes) + list(dict.fromkeys(n for r in runs for n in r.notes))  # rollback: crop or copy
    if reference is not None:
        notes += ["reference: " + n for n in reference.describe().notes]
    c = Comparison([r.describe() for r in runners], tokens, options, layers, floor, ref, runs, metrics,
                   analytic, tolerance, dtype, notes, checked, unmeasured)
    c.inconclusive = evidence.unusable(ref)
    if c.inconclusive:  # nothing measured against it means anything: no rerun, no power
        return c
    if confirm:
        with profile.section("confirmation"):
            c.confirmations.update(confirm_departures(runs, metrics, by_label, ref_runner, f64, tokens, options,
                                                      step))
    if power and c.judgement.wants_power:  # every run agrees: ok now needs power
        step("power")
        with profile.section("power"):
            c.power = measure_power(runners, reference, tokens, tolerance * floor.per_layer[-1])
    return c


def analytic_checks(runs, metrics, by_label: dict, tokens: Tensor, ref, pick) -> tuple[dict, dict]:
    """(schedule -> the analytic check of the first run `pick` chooses on it, schedule -> that
    run's logic), on runners that give smear terms (`metrics.analytic_check`)."""
    analytic, checked = {}, {}
    for r, m in zip(runs, metrics):
        if r.schedule not in analytic and pick(m):
            checks = analytic_check(by_label[r.logic], tokens, ref, r)
            if checks:
                analytic[r.schedule], checked[r.schedule] = checks, r.logic
    return analytic, checked


def confirm_departures(runs, metrics, by_label: dict, ref_runner: Runner, f64, tokens: Tensor,
                       options: ScheduleOptions, step) -> dict:
    """(schedule, logic) -> `evidence.Confirmation` of every run past the tolerance, rerun in
    float64 lifted; the reference runner's confirmer shares the floor's float64 full pass."""
    out, confirmers = {}, {id(ref_runner): evidence.Confirmer(ref_runner, tokens, f64)}
    for r, m in zip(runs, metrics):
        if not m.passed:
            step(f"{r.schedule} / {r.logic} in float64")
            runner = by_label[r.logic]
            confirmer = confirmers.setdefault(id(runner), evidence.Confirmer(runner, tokens))
            out[(m.schedule, m.logic)] = confirmer.schedule(r.schedule, options, m.max_abs_logits)
    return out


def measure_power(runners: Sequence[Runner], reference: Optional[Runner], tokens: Tensor,
                  threshold: float) -> evidence.Power:
    """`evidence.power` on the first runner that steps through a cache of its own (an engine that
    runs whole schedules has none to zero: then the reference's, the same weights)."""
    why = ""
    for r in [*runners, *([reference] if reference is not None else [])]:
        try:
            return evidence.power(r, tokens, threshold)
        except NotImplementedError as e:
            why = str(e) or f"{r.label} has no cache to zero"
    return evidence.Power(0, threshold, why=why or "no runner steps through a cache")


def run_word(status: str) -> str:
    """A run's status as the tables print it."""
    return {OK: str(OK), BUG: str(BUG).upper(), ROUNDING: f"{OK} (rounding)", UNCONFIRMED: str(UNCONFIRMED)}.get(
        status, str(status))


def verdict(c: Comparison) -> str:
    """One line a person can act on, led by the verdict word (`verdicts.line`)."""
    judged = c.judgement
    word = judged.word
    within = f"within {c.tolerance:g}x the noise floor"
    tail = "".join(f"; {c.outcome_line(r)}" for r in c.unmeasured if judge.unmeasured(r.outcome) != CRASHED)
    if c.rounding:
        tail += (f"; {', '.join(c.run_name(m) for m in c.rounding)} left the tolerance in "
                 f"{str(c.dtype).removeprefix('torch.')} only: float32 rounding, gone in float64")
    if word is OK or word is INCONCLUSIVE:
        lams = [d.smear_lambda for d in c.described]
        if lams and all(lam == 0.0 for lam in lams):
            tail += " (smear_lambda is 0: this model cannot show the bug)"
        if c.inconclusive or not c.metrics:  # an unusable reference, or nothing measured: no agreement to speak of
            return line(word, judged.why + tail)
        head = f"every schedule matches the full forward pass {within}"
        if word is INCONCLUSIVE:
            return line(word, f"{head}, but {judged.why}{tail}")
        return line(word, f"{head}{tail}; it {c.power.describe()}")
    if word is CRASHED:
        return line(word, "; ".join(c.outcome_line(r) for r in c.crashed)
                    + (f"; every run measured matches the full forward pass {within}" if c.metrics else "") + tail)
    bad = c.bugs or c.failures
    crashes = "".join(f"; {c.outcome_line(r)}" for r in c.crashed)
    worst = max(bad, key=lambda m: m.max_abs_logits)
    labels = sorted({m.logic for m in bad})
    names = ", ".join(c.run_name(m) for m in bad)
    verb = "diverge" if len(c.labels) > 1 or len(bad) > 1 else "diverges"
    born = c.born_at(worst)
    on_start = born is not None and born[1] in worst.chunk_starts
    where = f" at {starts_phrase(worst.chunk_starts, worst.schedule)}" if on_start else ""
    msg = (f"{names} {verb} from the full forward pass: max |dlogit| "
           f"{sig3(worst.max_abs_logits)} ({sig3(worst.logits_multiple)}x noise){where}")
    if born is not None:
        msg += f"; born at {born[0]}@{born[1]}{born_where(born[1], worst.chunk_starts)}"
    shapes = list(dict.fromkeys(s for s in (shape_of(c, m) for m in bad) if s))
    if shapes:
        msg += f" ({', '.join(shapes)})"
    conf = c.confirmation(worst)
    if conf is not None:
        msg += f"; {conf.phrase()}"
    if word is BUG and len(c.failures) > len(c.bugs):
        msg += f"; unconfirmed: {', '.join(c.run_name(m) for m in c.failures if m not in c.bugs)}"
    good = [lb for lb in c.labels if lb not in labels]
    if good and len(c.labels) > 1:
        msg += f"; the {'/'.join(sorted(good))} logic matches every schedule"
    return line(word, msg + crashes + tail)


def shape_of(c: Comparison, m: RunMetrics) -> Optional[str]:
    """The shape of a failing run of a boundary schedule (`steps.Schedule.shape`), where the error
    is born at one of its `shape_at` marks when the boundary names one (rollback: born at the
    prompt's end it is the chunk-start bug, not the rollback)."""
    words, at = shape(m.schedule), shape_at(m.schedule)
    if words is None or at is None:
        return words
    run = next(r for r, x in zip(c.runs, c.metrics) if x is m)
    born = c.born_at(m)
    return words if born is not None and born[1] in run.marks.get(at, ()) else None
