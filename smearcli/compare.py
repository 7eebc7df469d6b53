"""`compare` as a library call: every schedule on every runner against the full forward pass.

Owns the one result type, `Comparison` (runs, metrics, noise floor, analytic checks, what ran), the
plan of runs it makes, its verdict and its plain-text table; `smearcli.documents` writes its JSON
document (schema `smearcli.compare/1`) and the payload `--save` writes. `smearcli.testing`, the Hugging Face adapter and the audit of a user's nanochat
checkout are thin layers on it.

```python
from smearcli import compare, inputs, weights
lm = weights.tiny_model()
result = compare.compare(lm.model, inputs.random_tokens(lm.model.config, 256))
print(result.verdict)
```

The first argument is our GPT (run under each of `logics`), one `smearcli.runner.Runner`, or a
list of them: one series each, all measured against the first runner's full forward pass, or
against `reference`'s when given (a runner that is the yardstick only: its full pass is the
reference, its decode the noise floor, and it runs no schedule of its own).

A run whose `outcome` is set (the engine crashed, or checked nothing) is not measured: it is kept
in `Comparison.unmeasured`, printed under the table and named in the verdict; a crash fails it.
"""

from __future__ import annotations

import dataclasses
import functools
import threading
from dataclasses import dataclass, field
from typing import Callable, Optional, Sequence

import torch
from torch import Tensor

from . import profile
from .boundaries import SHAPES
from .errors import CannotRun
from .metrics import AnalyticCheck, NoiseFloor, RunMetrics, analytic_check, measure, noise_floor
from .names import DEFAULT_SCHEDULES, LOGIC_NAMES, NOISE_MARGIN, REFERENCE, ROLLBACK
from .runner import Described, Runner
from .runplan import NOISE_SCHEDULE, PlannedRun, forward_runs, plan, run_planned
from .schedules import CRASHED, RunResult, ScheduleOptions, missing, run_schedule, runnable
from .units import sci, sig3, times
from .wording import born_where, fmt_steps, starts_phrase

# token-by-token decode this many ulps (of the dtype, at the logits' scale) off the full pass is
# no longer rounding: the floor measured from it would hide real errors, so the verdict says so
SUSPECT_NOISE_ULPS = 1e3


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

    @property
    def failures(self) -> list[RunMetrics]:
        return [m for m in self.metrics if not m.passed]

    @property
    def crashed(self) -> list[RunResult]:
        return [r for r in self.unmeasured if r.outcome == CRASHED]

    @property
    def passed(self) -> bool:
        return not self.failures and not self.crashed

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

    @functools.cached_property
    def decode_ulps(self) -> float:
        """Token-by-token decode's logits distance from the full pass, in ulps at the logits' scale
        (computed once: at d12 each scan of the reference's logits took 0.16 s)."""
        scale = float(self.reference.logits.abs().max()) * torch.finfo(self.dtype).eps
        d = self.noise.measured_logits
        return d / scale if scale > 0 else (0.0 if d == 0 else float("inf"))

    @property
    def noise_suspect(self) -> bool:
        return self.decode_ulps > SUSPECT_NOISE_ULPS

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
                         f"{m.positions_above_noise}/{T}", "ok" if m.passed else "BUG"])
        widths = [max(len(r[i]) for r in [head] + rows) for i in range(len(head))]
        text = len(head) - 3  # born at, spread, verdict: left-aligned like the names
        line = lambda r: "  ".join(c.ljust(w) if i < 2 + several or i >= text else c.rjust(w)
                                   for i, (c, w) in enumerate(zip(r, widths))).rstrip()
        src = "token-by-token decode" if self.noise.source == NoiseFloor.source else self.noise.source
        out = [f"{self.tokens.size(0)} x {T} tokens; noise floor (logits) {sci(self.noise.per_layer[-1])} "
               f"from {src}; a run passes within {self.tolerance:g}x",
               line(head)] + [line(r) for r in rows]
        out += [self.outcome_line(r) for r in self.unmeasured]
        out += self.notes
        out += ["BUG: " + self.describe(m) for m in self.failures]
        out.append(self.verdict)
        return "\n".join(out)


def as_runners(target, logics: Sequence[str] = LOGIC_NAMES, name: Optional[str] = None) -> list[Runner]:
    """A list of runners from a runner, a list of them, or our GPT (one runner per logic)."""
    if isinstance(target, Runner):
        return [target]
    if isinstance(target, (list, tuple)):
        if not target or not all(isinstance(r, Runner) for r in target):
            raise TypeError("compare takes our GPT, a Runner, or a non-empty list of Runners")
        return list(target)
    from .ours import runners  # our GPT

    return runners(target, logics, name)


def compare(target, tokens: Tensor, schedules: Sequence[str] = DEFAULT_SCHEDULES,
            logics: Sequence[str] = LOGIC_NAMES, options: ScheduleOptions = ScheduleOptions(),
            tolerance: float = NOISE_MARGIN, progress=None,
            check_runs: Optional[Callable[[RunMetrics], bool]] = None,
            tokens_progress: Optional[Callable[[int, int], None]] = None,
            name: Optional[str] = None, notes: Sequence[str] = (),
            reference: Optional[Runner] = None, floor: Optional[RunResult] = None,
            floor_source: str = "", overlap: bool = False) -> Comparison:
    """Run the reference, the noise-floor pair and every (schedule, runner); measure each.

    `target`: our GPT (with `logics`), a Runner or a list of Runners (see `as_runners`); the first
    runner's full forward pass is the reference and its decode the noise floor. `progress`, if
    given, is called with a short label before each run; `tokens_progress(done, total)` after
    every forward step, with the positions fed so far over all runs. `check_runs` picks the runs
    that get the analytic check (default: those that fail, on runners that give smear terms).

    Decode runs once for runners whose `one_token_step` keys are equal (our GPT's logics share it,
    checked by tests): the one result then stands for each of them. `overlap`: run that decode on
    a second thread beside the other runs (CPU, `Runner.thread_safe` runners; see `run_planned`):
    the same numbers, sooner on two cores. It is off while a `smearcli.profile` session is open,
    whose sections time one run at a time, and when torch is held to one thread."""
    runners = as_runners(target, logics, name)
    ref_runner = reference or runners[0]
    for s in schedules:
        for r in runners:
            if not runnable(r, s):
                raise CannotRun(f"{r.label} cannot run the {s} schedule ({missing(r, s)})")
    tokens = tokens.to(ref_runner.device)
    step = progress or (lambda label: None)
    planned = plan(runners, schedules, reference, floor_given=floor is not None)
    total = forward_runs(planned) * tokens.size(1)
    fed = [0] * len(planned)  # positions fed so far by each planned run
    lock = threading.Lock()  # the side run reports progress from its own thread

    def run(i: int, p: PlannedRun, stop: Callable[[], None]) -> RunResult:
        def on_step(n, _T):
            stop()
            with lock:
                fed[i] = n
                if tokens_progress is not None:
                    tokens_progress(sum(fed), total)
        step(p.label)
        r = run_schedule(p.runner, tokens, p.schedule, opts=options, progress=on_step)
        fed[i] = tokens.size(1)
        return r

    # a profile times one run at a time; a compare held to one thread keeps to one core
    results = run_planned(planned, run, overlap and profile.active() is None and torch.get_num_threads() > 1)
    ref, decode_for_noise, runs = None, None, []
    by_runner: dict = {}
    for p, r in zip(planned, results):
        if p.same_as is not None:
            r = dataclasses.replace(by_runner[(id(p.same_as), p.schedule)], logic=p.runner.label)
        by_runner[(id(p.runner), p.schedule)] = r
        if p.schedule == REFERENCE:
            ref = r
        elif p.measured:
            runs.append(r)
        if p.schedule == NOISE_SCHEDULE and p.runner is ref_runner:
            decode_for_noise = r
    unmeasured = [r for r in runs if r.outcome is not None]
    runs = [r for r in runs if r.outcome is None]
    layers = list(ref_runner.layers)
    for r in [ref] + runs:
        got = len(r.hiddens or []) + 1
        if got != len(layers) and r.hiddens is not None:
            raise ValueError(f"{r.logic} returned {got} capture points on {r.schedule}; its runner "
                             f"declares {len(layers)} ({', '.join(layers)})")
    if ref.hiddens is None or any(r.hiddens is None for r in runs):  # compare what all have
        layers = ["logits"]
        ref = dataclasses.replace(ref, hiddens=None)
        runs = [dataclasses.replace(r, hiddens=None) for r in runs]
        if decode_for_noise is not None:
            decode_for_noise = dataclasses.replace(decode_for_noise, hiddens=None)
    dtype = ref_runner.dtype or ref.logits.dtype
    if floor is not None:
        if ref.hiddens is None or floor.hiddens is None or len(floor.hiddens) != len(ref.hiddens):
            # layers the floor run lacks get the ulp minimum (the reference's own hidden states)
            floor = dataclasses.replace(floor, hiddens=ref.hiddens)
        noise = noise_floor(ref, floor, dtype)
        noise.source = floor_source or "a floor run given by the caller"
        noise.measured_logits = 0.0  # decode is a schedule here: its ulps are its own metric
    else:
        noise = noise_floor(ref, decode_for_noise, dtype)
    metrics = [measure(ref, r, noise, tolerance) for r in runs]
    pick = check_runs or (lambda m: not m.passed)
    by_label = {r.label: r for r in runners}
    analytic, checked = {}, {}
    for r, m in zip(runs, metrics):
        if r.schedule not in analytic and pick(m):
            checks = analytic_check(by_label[r.logic], tokens, ref, r)
            if checks:
                analytic[r.schedule], checked[r.schedule] = checks, r.logic
    notes = list(notes) + list(dict.fromkeys(n for r in runs for n in r.notes))  # rollback: crop or copy
    if reference is not None:
        notes += ["reference: " + n for n in reference.describe().notes]
    return Comparison([r.describe() for r in runners], tokens, options, layers, noise, ref, runs, metrics,
                      analytic, tolerance, dtype, notes, checked, unmeasured)


def verdict(c: Comparison) -> str:
    """One line a person can act on."""
    if c.inconclusive and not c.failures:
        return (f"INCONCLUSIVE: every schedule matches the full forward pass within {c.tolerance:g}x the "
                f"noise floor, but {c.inconclusive}")
    tail = ""
    if c.noise_suspect:
        tail = (f" (note: token-by-token decode itself is {c.decode_ulps:.3g} ulps off the full pass, "
                f"so the noise floor it sets may hide errors)")
    tail += "".join(f"; {c.outcome_line(r)}" for r in c.unmeasured if r.outcome != CRASHED)
    bad = c.failures
    if c.crashed:
        crash = "BUG: " + "; ".join(c.outcome_line(r) for r in c.crashed)
        if not bad:
            return crash + (f"; every run measured matches the full forward pass within {c.tolerance:g}x "
                            f"the noise floor" if c.metrics else "") + tail
        tail = "; " + crash.removeprefix("BUG: ") + tail
    if not bad:
        lams = [d.smear_lambda for d in c.described]
        if lams and all(lam == 0.0 for lam in lams):
            tail += " (smear_lambda is 0: this model cannot show the bug)"
        return f"OK: every schedule matches the full forward pass within {c.tolerance:g}x the noise floor{tail}"
    worst = max(bad, key=lambda m: m.max_abs_logits)
    labels = sorted({m.logic for m in bad})
    names = ", ".join(c.run_name(m) for m in bad)
    verb = "diverge" if len(c.labels) > 1 or len(bad) > 1 else "diverges"
    born = c.born_at(worst)
    on_start = born is not None and born[1] in worst.chunk_starts
    where = f" at {starts_phrase(worst.chunk_starts, worst.schedule)}" if on_start else ""
    msg = (f"BUG: {names} {verb} from the full forward pass: max |dlogit| "
           f"{sig3(worst.max_abs_logits)} ({sig3(worst.logits_multiple)}x noise){where}")
    if born is not None:
        msg += f"; born at {born[0]}@{born[1]}{born_where(born[1], worst.chunk_starts)}"
    shapes = list(dict.fromkeys(s for s in (shape_of(c, m) for m in bad) if s))
    if shapes:
        msg += f" ({', '.join(shapes)})"
    good = [lb for lb in c.labels if lb not in labels]
    if good and len(c.labels) > 1:
        msg += f"; the {'/'.join(sorted(good))} logic matches every schedule"
    return msg + tail


def shape_of(c: Comparison, m: RunMetrics) -> Optional[str]:
    """The shape of a failing run of a boundary schedule (`boundaries.SHAPES`): always for packed
    and padded; for rollback only when the error is born where a draft was taken back (born at the
    prompt's end it is the chunk-start bug, not the rollback)."""
    if m.schedule not in SHAPES:
        return None
    if m.schedule == "rollback":
        run = next(r for r, x in zip(c.runs, c.metrics) if x is m)
        born = c.born_at(m)
        if born is None or born[1] not in run.marks.get(ROLLBACK, ()):
            return None
    return SHAPES[m.schedule]


