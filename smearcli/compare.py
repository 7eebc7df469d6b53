"""`compare` as a library call: every schedule under every logic against the full forward pass.

Owns the `Comparison` (runs, metrics, noise floor, analytic checks), its one-line verdict, its
JSON document (schema `smearcli.compare/1`) and the payload `--save` writes.

```python
from smearcli import compare, inputs, weights
lm = weights.tiny_model()
result = compare.compare(lm.model, inputs.random_tokens(lm.model.config, 256))
print(result.verdict)
```

`model` is anything with our GPT's interface (see `smearcli.impls`): our own model, or a user's
nanochat code behind its adapter.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Callable, Optional, Sequence

from torch import Tensor

from .metrics import (AnalyticCheck, NoiseFloor, RunMetrics, analytic_check, layer_names, measure,
                      noise_floor)
from .names import DEFAULT_SCHEDULES, LOGIC_NAMES, NOISE_MARGIN, REFERENCE
from .schedules import RunResult, ScheduleOptions, run_schedule
from .smear import same_one_token_step
from .units import sig3

SCHEMA = "smearcli.compare/1"


@dataclass
class Comparison:
    model: object  # our GPT or an adapter with its interface (smearcli.impls)
    tokens: Tensor
    options: ScheduleOptions
    layers: list[str]
    noise: NoiseFloor
    reference: RunResult
    runs: list[RunResult]
    metrics: list[RunMetrics]
    analytic: dict[str, list[AnalyticCheck]] = field(default_factory=dict)  # schedule -> checks
    tolerance: float = NOISE_MARGIN

    def get(self, schedule: str, logic: str) -> RunMetrics:
        for m in self.metrics:
            if m.schedule == schedule and m.logic == logic:
                return m
        raise KeyError((schedule, logic))

    @property
    def failures(self) -> list[RunMetrics]:
        return [m for m in self.metrics if not m.passed]

    @property
    def verdict(self) -> str:
        return verdict(self)


def compare(model, tokens: Tensor, schedules: Sequence[str] = DEFAULT_SCHEDULES,
            logics: Sequence[str] = LOGIC_NAMES, options: ScheduleOptions = ScheduleOptions(),
            tolerance: float = NOISE_MARGIN, progress=None, first_capture: str = "emb",
            check_runs: Optional[Callable[[RunMetrics], bool]] = None,
            tokens_progress: Optional[Callable[[int, int], None]] = None) -> Comparison:
    """Run the reference, the noise-floor pair and every (schedule, logic); measure each.

    `progress`, if given, is called with a short label before each run; `tokens_progress(done,
    total)` after every forward step, with the positions fed so far over all runs. `first_capture`
    names the model's first capture point; `check_runs` picks the runs that get the analytic
    check (default: those of the old logic).

    The decode schedule runs once when every logic's one-token step is the same code
    (`smear.same_one_token_step`, checked by tests) and the model takes its logics from that
    registry: the one result then stands for each logic."""
    tokens = tokens.to(model.device)
    step = progress or (lambda label: None)
    share = shares_decode(model, schedules, logics)
    total = planned_runs(schedules, logics, share) * tokens.size(1)
    done = [0]

    def run(sched, logic):
        base = done[0]

        def on_step(n, _T):
            done[0] = base + n
            if tokens_progress is not None:
                tokens_progress(done[0], total)
        r = run_schedule(model, tokens, sched, logic, options, progress=on_step)
        done[0] = base + tokens.size(1)
        return r

    step("full (reference)")
    ref = run(REFERENCE, "fixed")
    runs: list[RunResult] = []
    decode_for_noise = None
    for sched in schedules:
        for logic in logics:
            if sched == "decode" and share and decode_for_noise is not None:
                r = dataclasses.replace(decode_for_noise, logic=logic)  # the same computation
            else:
                step(f"{sched} / {logic}")
                r = run(sched, logic)
            runs.append(r)
            if sched == "decode" and decode_for_noise is None:
                decode_for_noise = r
    if decode_for_noise is None:
        step("decode (noise floor)")
        decode_for_noise = run("decode", "fixed")
    noise = noise_floor(ref, decode_for_noise, model.dtype)
    metrics = [measure(ref, r, noise, tolerance) for r in runs]
    pick = check_runs or (lambda m: m.logic == "old")
    analytic = {r.schedule: analytic_check(model, tokens, ref, r) for r, m in zip(runs, metrics) if pick(m)}
    layers = [first_capture] + layer_names(model.config.n_layer)[1:]
    return Comparison(model, tokens, options, layers, noise, ref, runs,
                      metrics, {k: v for k, v in analytic.items() if v}, tolerance)


def shares_decode(model, schedules: Sequence[str], logics: Sequence[str]) -> bool:
    """Whether `compare` runs decode once for all `logics`: several logics, one one-token step
    (`smear.same_one_token_step`), and a model whose `smear=` picks from smearcli's registry."""
    return ("decode" in schedules and len(set(logics)) > 1 and same_one_token_step(logics)
            and getattr(model, "smear_registry", None) == "smearcli")


def planned_runs(schedules: Sequence[str], logics: Sequence[str], share_decode: bool) -> int:
    """Forward runs `compare` makes: the reference, each (schedule, logic) (decode once when it is
    shared), and a decode for the noise floor when no schedule is decode."""
    n = 1 + len(schedules) * len(logics) + ("decode" not in schedules)
    return n - (len(logics) - 1 if share_decode and "decode" in schedules else 0)


def verdict(c: Comparison) -> str:
    """One line a person can act on."""
    bad = c.failures
    if not bad:
        lam = float(c.model.smear_lambda.detach().abs().max())
        tail = " (smear_lambda is 0: this model cannot show the bug)" if lam == 0.0 else ""
        return f"OK: every schedule matches the full forward pass within {c.tolerance:g}x the noise floor{tail}"
    worst = max(bad, key=lambda m: m.max_abs_logits)
    logics = sorted({m.logic for m in bad})
    names = ", ".join(f"{m.schedule}/{m.logic}" for m in bad)
    where = f" at {starts_phrase(worst.chunk_starts, worst.schedule)}" if worst.chunk_starts else ""
    msg = (f"BUG: {names} diverge from the full forward pass: max |dlogit| "
           f"{sig3(worst.max_abs_logits)} ({sig3(worst.logits_multiple)}x noise){where}")
    good = sorted({m.logic for m in c.metrics} - set(logics))
    if good:
        msg += f"; the {'/'.join(good)} logic matches every schedule"
    return msg


def starts_phrase(starts: Sequence[int], schedule: str, shown: int = 4) -> str:
    """"the 3 chunk starts of chunked: 64, 128, 192", the list cut after `shown` with a count."""
    more = f" and {len(starts) - shown} more" if len(starts) > shown else ""
    what = "chunk start" if len(starts) == 1 else f"{len(starts)} chunk starts"
    return f"the {what} of {schedule}: {', '.join(map(str, starts[:shown]))}{more}"


def _floats(t) -> list[float]:
    return [float(f"{v:.6g}") for v in (t.tolist() if isinstance(t, Tensor) else t)]


def run_json(m: RunMetrics, layers: Sequence[str]) -> dict:
    """One entry of a document's `runs` (schema compare/1, reused by hf/1)."""
    fd = m.first_departure
    return {
        "schedule": m.schedule,
        "logic": m.logic,
        "steps": m.steps,
        "chunk_starts": m.chunk_starts,
        "passed": m.passed,
        "max_abs_logits": float(f"{m.max_abs_logits:.6g}"),
        "logits_noise_multiple": float(f"{m.logits_multiple:.6g}"),
        "max_abs_per_layer": _floats(m.abs_err.amax(dim=1)),
        "max_rel_per_layer": _floats(m.rel_err.amax(dim=1)),
        "noise_multiple_per_layer": _floats(m.multiple_of_noise),
        "chunk_start_share": None if m.chunk_start_share is None else float(f"{m.chunk_start_share:.6g}"),
        "first_departure": None if fd is None else {"layer": layers[fd[0]], "position": fd[1]},
        "positions_above_noise": m.positions_above_noise,
        "kl_max": float(f"{m.kl_max:.6g}"),
        "kl_mean": float(f"{m.kl_mean:.6g}"),
        "top1_agreement": float(f"{m.top1_agreement:.6g}"),
        "per_position": {
            "abs_logits": _floats(m.abs_err[-1]),
            "abs_emb": _floats(m.abs_err[0]),
            "kl": _floats(m.kl),
        },
        "rel_error": [_floats(row) for row in m.rel_err],
    }


def to_json(c: Comparison, model_info: Optional[dict] = None) -> dict:
    """The stable `--json` document (schema "smearcli.compare/1", see
    [docs/json-schema.md](../json-schema.md))."""
    runs = [run_json(m, c.layers) for m in c.metrics]
    cfg = c.model.config
    return {
        "schema": SCHEMA,
        "model": {**(model_info or {}), "config": cfg.to_dict(), "dtype": str(c.model.dtype).removeprefix("torch."),
                  "device": str(c.model.device), "smear_lambda": float(f"{float(c.model.smear_lambda):.6g}")},
        "input": {"batch": int(c.tokens.size(0)), "seq_len": int(c.tokens.size(1))},
        "options": {"chunks": c.options.chunks,
                    "chunk_sizes": list(c.options.chunk_sizes) if c.options.chunk_sizes else None,
                    "samples": c.options.samples, "gen_len": c.options.gen_len, "draft": c.options.draft},
        "layers": c.layers,
        "tolerance": c.tolerance,
        "noise_floor": {"source": c.noise.source, "per_layer": _floats(c.noise.per_layer)},
        "runs": runs,
        "analytic_check": {s: [{"position": a.position, "predicted": float(f"{a.predicted:.6g}"),
                                "measured": float(f"{a.measured:.6g}"), "residual": float(f"{a.residual:.3g}")}
                               for a in checks] for s, checks in c.analytic.items()},
        "verdict": c.verdict,
    }


def save_payload(document: dict, comparisons: dict) -> dict:
    """What `--save` writes: the JSON `document`, the tokens, and every run's logits, keyed
    `logits_{prefix}full` and `logits_{prefix}{schedule}_{logic}` for each `prefix -> Comparison`
    in `comparisons` (prefix "" for the main one)."""
    first = next(iter(comparisons.values()))
    payload = {"meta": document, "tokens": first.tokens.cpu()}
    for prefix, c in comparisons.items():
        payload[f"logits_{prefix}full"] = c.reference.logits.cpu()
        for r in c.runs:
            payload[f"logits_{prefix}{r.schedule}_{r.logic}"] = r.logits.cpu()
    return payload
