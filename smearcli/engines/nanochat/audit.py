"""The audit of a user's nanochat code: every schedule on their own GPT and KVCache, measured
against their own full forward pass; what is wrong, in findings a person can act on; with our
model on the same weights, which of our two logics their code behaves like; its JSON document
(schema `smearcli.audit/1`), `--save` payload and console report.

```python
from smearcli.gpt import weights
from smearcli.engines.nanochat import adapter, audit, sandbox
code = sandbox.import_nanochat("~/src/nanochat")
ours = weights.random_model(seed=0).model
theirs = adapter.nanochat_from_model(code, ours)
a = audit.audit(theirs, tokens, reference=ours)
print(a.verdict)
```
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence

from torch import Tensor

from ...measure import compare as cmp
from ...measure import jsondoc, runplan
from ...measure.metrics import RunMetrics
from ...util.defaults import DEFAULT_SCHEDULES, LOGIC_NAMES, NOISE_MARGIN
from ...render.table import left_out_note, print_analytic, print_table_of, say
from ...measure.steps import ScheduleOptions
from ...util.formatters import compact, sci
from ...judging.verdicts import BUG, CRASHED, INCONCLUSIVE, UNCONFIRMED, line
from .adapter import NanochatModel, NanochatRunner
from .sandbox import FIRST_CAPTURE

SCHEMA = jsondoc.SCHEMAS["audit"]


@dataclass
class Finding:
    kind: str  # "chunk-smear", "engine-expansion" or "divergence"
    runs: list[str]  # schedules
    text: str


@dataclass
class ScheduleLikeness:
    schedule: str
    separation: float  # ours/old vs ours/fixed per-position logits error, max, x noise
    to_old: float  # the user's per-position logits error vs ours/old, max, x noise
    to_fixed: float
    like: str  # "old", "fixed", "both" (the logics agree here and so does the code), "neither"

    @property
    def informative(self) -> bool:
        return self.separation > 2 * NOISE_MARGIN


@dataclass
class Likeness:
    """Which of our logics the user's code behaves like, from per-position error patterns."""
    behaves_like: str  # "old", "fixed", "neither" or "undetermined"
    schedules: list[ScheduleLikeness]
    noise: float  # the larger of the two logits noise floors: the unit of every distance
    full_forward_diff: float  # max |user full - ours full| logits: do the two models agree at all
    summary: str


def likeness(user: cmp.Comparison, ours: cmp.Comparison, margin: float = NOISE_MARGIN) -> Likeness:
    noise = max(user.noise.per_layer[-1], ours.noise.per_layer[-1])
    rows = []
    for m in user.metrics:
        try:
            old, fixed = ours.get(m.schedule, "old"), ours.get(m.schedule, "fixed")
        except KeyError:
            continue
        e = m.abs_err[-1]
        sep = float((old.abs_err[-1] - fixed.abs_err[-1]).abs().max()) / noise
        d_old = float((e - old.abs_err[-1]).abs().max()) / noise
        d_fixed = float((e - fixed.abs_err[-1]).abs().max()) / noise
        if sep > 2 * margin:
            like = "old" if d_old <= margin else "fixed" if d_fixed <= margin else "neither"
        else:
            like = "both" if min(d_old, d_fixed) <= margin else "neither"
        rows.append(ScheduleLikeness(m.schedule, sep, d_old, d_fixed, like))
    full_diff = float((user.reference.logits - ours.reference.logits.to(user.reference.logits.device)).abs().max())
    informative = [r for r in rows if r.informative]
    labels = {r.like for r in informative}
    if not informative:
        behaves = "neither" if any(r.like == "neither" for r in rows) else "undetermined"
    elif len(labels) == 1 and labels <= {"old", "fixed"}:
        behaves = labels.pop()
    else:
        behaves = "neither"
    names = ", ".join(r.schedule for r in informative)
    if behaves in ("old", "fixed"):
        near = max(getattr(r, f"to_{behaves}") for r in informative)
        other = "fixed" if behaves == "old" else "old"
        far = min(getattr(r, f"to_{other}") for r in informative)
        close = "identical to" if near == 0 else f"within {compact(near)}x noise of"
        summary = (f"your code behaves like the {behaves}{' (buggy)' if behaves == 'old' else ''} logic: "
                   f"on {names} its per-position error is {close} ours/{behaves} "
                   f"and at least {compact(far)}x noise from ours/{other}")
    elif behaves == "undetermined":
        summary = ("no schedule in this run tells the old logic from the fixed one "
                   "(add the chunked or speculative schedule)")
    else:
        odd = [r for r in rows if r.like == "neither"] or informative
        summary = ("your code behaves like neither logic: on " + ", ".join(
            f"{r.schedule} its per-position error is {compact(r.to_old)}x noise from ours/old and "
            f"{compact(r.to_fixed)}x from ours/fixed" for r in odd))
    deviant = [r.schedule for r in rows if not r.informative and r.like == "neither"]
    if behaves in ("old", "fixed") and deviant:
        summary += f"; it also departs from both on {', '.join(deviant)}"
    return Likeness(behaves, rows, noise, full_diff, summary)


@dataclass
class Audit:
    model: NanochatModel
    comparison: cmp.Comparison  # the user's code: every schedule against its own full forward
    ours: Optional[cmp.Comparison] = None  # our model on the same weights and tokens (--impl both)
    likeness: Optional[Likeness] = None

    @property
    def word(self):
        """The verdict word: the comparison's, from `smearcli.judging.judge` (the audit derives none)."""
        return self.comparison.word

    @property
    def failed(self) -> bool:
        """Whether `--check` fails: anything but ok, as for `compare`."""
        return not self.comparison.passed

    @property
    def findings(self) -> list[Finding]:
        return findings(self.comparison)

    @property
    def verdict(self) -> str:
        return audit_verdict(self.comparison)


def audit(model: NanochatModel, tokens: Tensor, schedules: Sequence[str] = DEFAULT_SCHEDULES,
          options: ScheduleOptions = ScheduleOptions(), tolerance: float = NOISE_MARGIN,
          reference=None, progress=None, tokens_progress=None, name: str = "model") -> Audit:
    """Run every schedule on the user's code; with `reference` (our GPT with the same weights),
    also run ours under both logics and say which one the user's code behaves like."""
    c = cmp.compare(NanochatRunner(model, name), tokens, schedules, options=options, tolerance=tolerance,
                    progress=progress, tokens_progress=tokens_progress)
    ours = like = None
    if reference is not None:
        ours = cmp.compare(reference, tokens, schedules, LOGIC_NAMES, options, tolerance, progress,
                           tokens_progress=tokens_progress, name=name)
        like = likeness(c, ours, tolerance)
    return Audit(model, c, ours, like)


def planned(model: NanochatModel, schedules: Sequence[str], reference=None) -> list:
    """The forward runs `audit` makes (`runplan.plan` of each comparison), for progress totals."""
    runs = runplan.plan([NanochatRunner(model)], schedules)
    if reference is not None:
        runs += runplan.plan(cmp.as_runners(reference, LOGIC_NAMES), schedules)
    return runs


def merged(a: Audit) -> cmp.Comparison:
    """One Comparison holding ours (old, fixed) and the user's runs (logic "yours"), for figures.
    Reference and noise floor are ours; each run keeps its own metrics. The first capture point
    is our post-smear embedding and the user's block-0 input, so it is named for both."""
    if a.ours is None:
        return a.comparison
    o = a.ours
    layers = [f"emb | {FIRST_CAPTURE}"] + list(o.layers[1:])
    return cmp.Comparison(o.described + a.comparison.described, o.tokens, o.options, layers, o.noise,
                          o.reference, o.runs + a.comparison.runs, o.metrics + a.comparison.metrics,
                          dict(o.analytic), o.tolerance, o.dtype)


def _at_starts(m: RunMetrics) -> float:
    return float(m.abs_err[-1][m.chunk_starts].max()) if m.chunk_starts else 0.0


def findings(c: cmp.Comparison) -> list[Finding]:
    """What is wrong with the user's code, one finding per kind of failure: the runs the judge
    calls a bug or unconfirmed (a float32-rounding run is none)."""
    noise = c.noise.per_layer[-1]
    chunk, engine, other = [], [], []
    for m, r in zip(c.metrics, c.runs):
        if m not in c.failures:
            continue
        fd = m.first_departure
        if fd is not None and fd[0] == 0 and fd[1] in m.chunk_starts:
            chunk.append(m)
        elif fd is not None and m.schedule == "engine" and r.expand_at is not None and fd[1] == r.expand_at:
            engine.append((m, r))
        else:
            other.append(m)
    out = []
    if chunk:
        worst = max(chunk, key=_at_starts)
        err = _at_starts(worst)
        confirmed = all(m in c.bugs for m in chunk)
        text = (f"your code {'has the chunk-boundary smear bug' if confirmed else 'departs at chunk starts as the smear bug does'}"
                f": error {compact(err)} at chunk starts, "
                f"{compact(err / noise)} x noise floor ({', '.join(m.schedule for m in chunk)})")
        checks = [a for m in chunk for a in c.analytic.get(m.schedule, [])]
        if checks and max(a.residual for a in checks) <= 1e-3 * max(a.predicted for a in checks):
            text += "; at every chunk start the error is exactly the dropped smear term gate*x_prev"
        if not confirmed:
            text += _confirmed(c, worst)
        out.append(Finding("chunk-smear", [m.schedule for m in chunk], text))
    if engine:
        m, r = engine[0]
        err = float(m.abs_err[-1][r.expand_at])
        out.append(Finding("engine-expansion", ["engine"],
                           f"your code loses the smear state when the engine copies its cache: error "
                           f"{compact(err)} at position {r.expand_at} (the first token after the copy), "
                           f"{compact(err / noise)} x noise floor" + _confirmed(c, m)))
    if other:
        worst = max(other, key=lambda m: m.max_abs_logits)
        fd = worst.first_departure
        born = f", born at {c.layers[fd[0]]}@{fd[1]}" if fd else ""
        out.append(Finding("divergence", [m.schedule for m in other],
                           f"your code diverges from its own full forward pass on "
                           f"{', '.join(m.schedule for m in other)}: max |dlogit| {compact(worst.max_abs_logits)}, "
                           f"{compact(worst.logits_multiple)} x noise floor{born}" + _confirmed(c, worst)))
    return out


def _confirmed(c: cmp.Comparison, m: RunMetrics) -> str:
    """"; keeps its size in float64 (...)": what the float64 rerun of `m` said, if one ran."""
    conf = c.confirmation(m)
    return "" if conf is None else f"; {conf.phrase()}"


def audit_verdict(c: cmp.Comparison) -> str:
    """The audit's verdict line, led by the judge's word (`Comparison.judgement`), with the
    findings for a bug or an unconfirmed departure; a crash or a reference nothing can be
    measured against reads as `compare` says it."""
    judged = c.judgement
    word = judged.word
    rounding = ""
    if c.rounding:
        rounding = (f"; {', '.join(m.schedule for m in c.rounding)} left the tolerance in "
                    f"{str(c.dtype).removeprefix('torch.')} only: float32 rounding, gone in float64")
    if word in (BUG, UNCONFIRMED):
        return line(word, "; ".join(f.text for f in findings(c)) + rounding)
    if word is CRASHED or c.inconclusive or not c.metrics:
        return c.verdict
    names = ", ".join(m.schedule for m in c.metrics)
    worst = max((m.max_abs_logits for m in c.metrics if m.passed), default=0.0)
    msg = (f"your code is consistent across all schedules ({names}): max |dlogit| {compact(worst)}, "
           f"within {c.tolerance:g}x the noise floor{rounding}")
    if not any(m.chunk_starts for m in c.metrics):
        msg += " (no schedule here feeds several tokens to a non-empty cache: add chunked to test for the bug)"
    if c.description().smear_lambda == 0.0:
        msg += " (smear_lambda is 0: this model cannot show the bug)"
    if word is INCONCLUSIVE:
        return line(word, f"{msg}, but {judged.why}")
    return line(word, f"{msg}; it {c.power.describe()}")


def to_json(a: Audit, model_info: Optional[dict] = None) -> dict:
    """The `--json` document of an audit (schema "smearcli.audit/1"): the user's code and, with
    --impl both, ours, each as a full "smearcli.compare/1" document."""
    info = {**(model_info or {}), "impl": "nanochat"}
    doc = jsondoc.header(
        "audit",
        impl="both" if a.ours is not None else "nanochat",
        code=a.model.code.info(),
        nanochat=jsondoc.to_json(a.comparison, info),
        ours=None if a.ours is None else jsondoc.to_json(a.ours, {**(model_info or {}), "impl": "ours"}),
        likeness=None,
        findings=[{"kind": f.kind, "schedules": f.runs, "text": f.text} for f in a.findings],
        passed=not a.failed,
        verdict=a.verdict,
    )
    if a.likeness is not None:
        lk = a.likeness
        doc["likeness"] = {
            "behaves_like": lk.behaves_like,
            "noise": float(f"{lk.noise:.6g}"),
            "full_forward_max_abs": float(f"{lk.full_forward_diff:.6g}"),
            "schedules": [{"schedule": r.schedule, "informative": r.informative, "like": r.like,
                           "separation": float(f"{r.separation:.6g}"), "to_old": float(f"{r.to_old:.6g}"),
                           "to_fixed": float(f"{r.to_fixed:.6g}")} for r in lk.schedules],
            "summary": lk.summary,
        }
    return doc


def save_payload(a: Audit, model_info: Optional[dict] = None) -> dict:
    """What `--save` writes: the JSON document, the tokens and every run's logits (ours prefixed
    `ours_`)."""
    runs = {"": a.comparison} if a.ours is None else {"": a.comparison, "ours_": a.ours}
    return jsondoc.save_payload(to_json(a, model_info), runs)


def print_audit(a: Audit, console, title: str = "", footer: str = "") -> None:
    code = a.model.code
    c = a.comparison
    where = f"{code.root}" + (f" @ {code.commit[:12]}" if code.commit else "")
    left_out = print_table_of(c, console, f"your code ({where}): {title}")
    if a.ours is not None:
        print_table_of(a.ours, console, "smearcli's reference implementation, same weights and tokens")
    say(console, f"noise floor (logits): {sci(c.noise.per_layer[-1])} ({c.noise.source}); a run "
                  f"passes within {c.tolerance:g}x.")
    for text in (left_out_note(left_out, console.width), footer):
        if text:
            say(console, text)
    say(console, f"your code ran with attention {code.attention}, compute dtype "
                  f"{str(code.compute_dtype).removeprefix('torch.')} ({code.dtype_source}).")
    say(console, f"{FIRST_CAPTURE}: block 0's input = (resid_lambdas[0] + x0_lambdas[0]) x the post-smear "
                  f"embedding, which no hook can see.")
    if code.stand_ins:
        say(console, f"stood in at import for modules that are not installed and that inference does not "
                      f"use: {', '.join(code.stand_ins)}")
    print_analytic(c, console, "vs (r0 + l0)*gate*x_prev: residual at most")
    if a.likeness is not None:
        lk = a.likeness
        say(console, f"full forward pass, your code vs ours: max |Δlogit| {sci(lk.full_forward_diff)} "
                      f"({compact(lk.full_forward_diff / lk.noise)}x noise)")
        say(console, f"[bold]{lk.summary}[/]")
    style = "bold red" if a.failed else "bold green"
    say(console, f"[{style}]{a.verdict}[/]")
