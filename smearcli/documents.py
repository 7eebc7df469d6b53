"""The JSON document of a `compare.Comparison` (schema `smearcli.compare/1`, see
[docs/json-schema.md](../json-schema.md)), its run entries (reused by hf/1 and audit/1), and the
payload `--save` writes."""

from __future__ import annotations

from typing import Optional, Sequence

from torch import Tensor

from .metrics import RunMetrics

SCHEMA = "smearcli.compare/1"


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
        "boundaries": {k: list(v) for k, v in sorted(m.marks.items())},
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


def to_json(c, model_info: Optional[dict] = None) -> dict:
    """The stable `--json` document (schema "smearcli.compare/1", see
    [docs/json-schema.md](../json-schema.md))."""
    d = c.description()
    model = {**(model_info or {}), "config": d.config, "dtype": d.dtype, "device": d.device,
             "smear_lambda": d.smear_lambda}
    if d.notes:
        model["notes"] = list(d.notes)
    return {
        "schema": SCHEMA,
        "model": model,
        "input": {"batch": int(c.tokens.size(0)), "seq_len": int(c.tokens.size(1))},
        "options": {"chunks": c.options.chunks,
                    "chunk_sizes": list(c.options.chunk_sizes) if c.options.chunk_sizes else None,
                    "samples": c.options.samples, "gen_len": c.options.gen_len, "draft": c.options.draft},
        "layers": c.layers,
        "tolerance": c.tolerance,
        "noise_floor": {"source": c.noise.source, "per_layer": _floats(c.noise.per_layer)},
        "runs": [run_json(m, c.layers) for m in c.metrics],
        "not_measured": [{"schedule": r.schedule, "logic": r.logic, "outcome": r.outcome, "message": r.message,
                          "steps": r.steps} for r in c.unmeasured],
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
