"""`compare` as a library call: every schedule under every logic against the full forward pass.

    from smearcli import compare, models
    lm = models.random_model()
    result = compare.compare(lm.model, compare.random_tokens(lm.model.config, 256))
    print(result.verdict)
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional, Sequence

import torch
from torch import Tensor

from .metrics import (NOISE_MARGIN, AnalyticCheck, NoiseFloor, RunMetrics, analytic_check,
                      layer_names, measure, noise_floor)
from .model import GPT
from .schedules import REFERENCE, SCHEDULES, RunResult, ScheduleOptions, run_schedule
from .smear import LOGICS

SCHEMA = "smearcli.compare/1"
DEFAULT_SCHEDULES = tuple(s for s in SCHEDULES if s != REFERENCE)


def random_tokens(config, seq_len: int, batch: int = 1, seed: int = 0) -> Tensor:
    """(batch, seq_len) token ids, uniform over the real vocabulary, from a fixed seed."""
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, config.vocab_size, (batch, seq_len), generator=g)


@dataclass
class Comparison:
    model: GPT
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


def compare(model: GPT, tokens: Tensor, schedules: Sequence[str] = DEFAULT_SCHEDULES,
            logics: Sequence[str] = tuple(LOGICS), options: ScheduleOptions = ScheduleOptions(),
            tolerance: float = NOISE_MARGIN, progress=None) -> Comparison:
    """Run the reference, the noise-floor pair and every (schedule, logic); measure each.

    `progress`, if given, is called with a short label before each run."""
    tokens = tokens.to(model.device)
    step = progress or (lambda label: None)
    step("full (reference)")
    ref = run_schedule(model, tokens, REFERENCE, "fixed", options)
    runs: list[RunResult] = []
    decode_for_noise = None
    for sched in schedules:
        for logic in logics:
            step(f"{sched} / {logic}")
            r = run_schedule(model, tokens, sched, logic, options)
            runs.append(r)
            if sched == "decode" and decode_for_noise is None:
                decode_for_noise = r
    if decode_for_noise is None:
        step("decode (noise floor)")
        decode_for_noise = run_schedule(model, tokens, "decode", "fixed", options)
    noise = noise_floor(ref, decode_for_noise, model.dtype)
    metrics = [measure(ref, r, noise, tolerance) for r in runs]
    analytic = {r.schedule: analytic_check(model, tokens, ref, r)
                for r in runs if r.logic == "old" and r.chunk_starts}
    return Comparison(model, tokens, options, layer_names(model.config.n_layer), noise, ref, runs,
                      metrics, {k: v for k, v in analytic.items() if v}, tolerance)


def _fmt(x: float) -> str:
    return f"{x:.3g}"


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
    where = f" at chunk starts {', '.join(map(str, worst.chunk_starts[:4]))}" if worst.chunk_starts else ""
    msg = (f"BUG: {names} diverge from the full forward pass: max |dlogit| "
           f"{_fmt(worst.max_abs_logits)} ({_fmt(worst.logits_multiple)}x noise){where}")
    good = sorted({m.logic for m in c.metrics} - set(logics))
    if good:
        msg += f"; the {'/'.join(good)} logic matches every schedule"
    return msg


def _floats(t) -> list[float]:
    return [float(f"{v:.6g}") for v in (t.tolist() if isinstance(t, Tensor) else t)]


def to_json(c: Comparison, model_info: Optional[dict] = None) -> dict:
    """The stable `--json` document (schema "smearcli.compare/1", see docs/json-schema.md)."""
    runs = []
    for m in c.metrics:
        fd = m.first_departure
        runs.append({
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
            "first_departure": None if fd is None else {"layer": c.layers[fd[0]], "position": fd[1]},
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
        })
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
