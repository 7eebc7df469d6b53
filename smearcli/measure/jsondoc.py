"""The JSON documents smearcli writes (`--json`, bench's `--output`, the scan's document), one
schema family: every document opens with the same header, written here (`header`), and names its
schema as `smearcli.<kind>/<version>` (`SCHEMAS`); each has a JSON Schema file under
docs/schemas/ and is described in [docs/json-schema.md](../json-schema.md). Also the comparison's
own document (`compare/1`, for every implementation: ours, a nanochat checkout, transformers,
vLLM), its run entries (reused by audit/1) and the payload `--save` writes.

Imports no torch: the scan's report and `--help` stay light (a tensor is read through `tolist`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Optional, Sequence

if TYPE_CHECKING:
    from .metrics import RunMetrics

# kind -> schema name; a version moves only when a field is renamed or removed
SCHEMAS = {kind: f"smearcli.{kind}/1" for kind in ("compare", "packed", "audit", "scan", "bench")}
SCHEMA = SCHEMAS["compare"]


def header(kind: str, model: Optional[dict] = None, **fields) -> dict:
    """The start of every document: `schema` (its name and version), then `model` (what was
    measured) when the document has one, then `fields` in the order given."""
    doc = {"schema": SCHEMAS[kind]}
    if model is not None:
        doc["model"] = model
    return {**doc, **fields}


def model_header(description, model_info: Optional[dict] = None, notes: bool = True) -> dict:
    """The `model` object of a nanochat-shaped run: what the caller knows (`model_info`: name,
    source, checkpoint...), then what the runner describes (`runner.Described`); its notes, if any
    and `notes` is set."""
    d = description
    model = {**(model_info or {}), "config": d.config, "dtype": d.dtype, "device": d.device,
             "smear_lambda": d.smear_lambda}
    if notes and d.notes:
        model["notes"] = list(d.notes)
    return model


def options_json(o) -> dict:
    """A `schedules.ScheduleOptions` as the documents write it."""
    return {"chunks": o.chunks, "chunk_sizes": list(o.chunk_sizes) if o.chunk_sizes else None,
            "samples": o.samples, "gen_len": o.gen_len, "draft": o.draft}


def _g(v: float) -> float:
    return float(f"{v:.6g}")


def _floats(t) -> list[float]:
    return [_g(v) for v in (t.tolist() if hasattr(t, "tolist") else t)]


def run_json(m: "RunMetrics", layers: Sequence[str]) -> dict:
    """One entry of a compare/1 document's `runs`."""
    fd = m.first_departure
    return {
        "schedule": m.schedule,
        "logic": m.logic,
        "steps": m.steps,
        "chunk_starts": m.chunk_starts,
        "boundaries": {k: list(v) for k, v in sorted(m.marks.items())},
        "passed": m.passed,
        "max_abs_logits": _g(m.max_abs_logits),
        "logits_noise_multiple": _g(m.logits_multiple),
        "max_abs_per_layer": _floats(m.abs_err.amax(dim=1)),
        "max_rel_per_layer": _floats(m.rel_err.amax(dim=1)),
        "noise_multiple_per_layer": _floats(m.multiple_of_noise),
        "chunk_start_share": None if m.chunk_start_share is None else _g(m.chunk_start_share),
        "first_departure": None if fd is None else {"layer": layers[fd[0]], "position": fd[1]},
        "positions_above_noise": m.positions_above_noise,
        "kl_max": _g(m.kl_max),
        "kl_mean": _g(m.kl_mean),
        "top1_agreement": _g(m.top1_agreement),
        "per_position": {
            "abs_logits": _floats(m.abs_err[-1]),
            "abs_emb": _floats(m.abs_err[0]),
            "kl": _floats(m.kl),
        },
        "rel_error": [_floats(row) for row in m.rel_err],
    }


def judged(entry: dict, status, confirmation) -> dict:
    """A run entry with the judge's `status` and the float64 rerun's `confirmation` (or None)
    right after `passed`, as a scan/1 record has them."""
    out = {}
    for k, v in entry.items():
        out[k] = v
        if k == "passed":
            out.update(status=str(status), confirmation=None if confirmation is None else confirmation.to_json())
    return out


def comparison_json(c, model: dict, options, runs: Optional[list] = None, **after_model) -> dict:
    """The compare/1 document of a `compare.Comparison` whose `model` object the caller wrote
    (each implementation knows different facts about its model); `after_model` goes right after
    it, `runs` replaces the standard run entries (an implementation that adds fields to them).
    Each run carries the judge's status and its confirmation, the document the verdict word and
    the power, as the scan's records do."""
    runs = [run_json(m, c.layers) for m in c.metrics] if runs is None else runs
    judgement = c.judgement
    return header(
        "compare", model, **after_model,
        input={"batch": int(c.tokens.size(0)), "seq_len": int(c.tokens.size(1))},
        options=options_json(options),
        layers=c.layers,
        tolerance=c.tolerance,
        noise_floor={"source": c.noise.source, "per_layer": _floats(c.noise.per_layer)},
        runs=[judged(entry, c.status(m), c.confirmation(m)) for entry, m in zip(runs, c.metrics)],
        not_measured=[{"schedule": r.schedule, "logic": r.logic, "outcome": r.outcome,
                       "status": str(judgement.statuses[f"{r.schedule}/{r.logic}"]), "message": r.message,
                       "steps": r.steps} for r in c.unmeasured],
        analytic_check={s: [{"position": a.position, "predicted": _g(a.predicted), "measured": _g(a.measured),
                             "residual": float(f"{a.residual:.3g}")} for a in checks]
                        for s, checks in c.analytic.items()},
        power=None if c.power is None else c.power.to_json(),
        word=str(judgement.word),
        verdict=c.verdict,
    )


def to_json(c, model_info: Optional[dict] = None) -> dict:
    """The stable `--json` document of a comparison of nanochat-shaped runners (schema
    "smearcli.compare/1", see [docs/json-schema.md](../json-schema.md))."""
    return comparison_json(c, model_header(c.description(), model_info), c.options)


def save_payload(document: dict, comparisons: dict) -> dict:
    """What `--save` writes: the JSON `document`, the tokens, and every run's logits, keyed
    `logits_{prefix}full` and `logits_{prefix}{schedule}_{logic}` for each `prefix -> Comparison`
    in `comparisons` (prefix "" for the main one)."""
    first = next(iter(comparisons.values()))
    payload = {"meta": document, "tokens": first.tokens.cpu()}
    for prefix, c in comparisons.items():
        payload[f"logits_{prefix}full"] = c.reference.logits.cpu()
        for r in c.runs:
            # written out: an engine's sample rows may be one row expanded (`schedules`)
            payload[f"logits_{prefix}{r.schedule}_{r.logic}"] = r.logits.cpu().contiguous()
    return payload
