"""One architecture checked in vLLM (`smearcli scan`'s vLLM engine): `check(model_type, worker)`.

The tiny config (`vllm_plan.tiny_config`: the census's, adjusted for vLLM's CPU backend) is built
seeded and saved as safetensors; the reference is its full pass in transformers, as
log-probabilities, and the noise floor that pass against its float64 twin (`evidence.floor`), as
`compare --impl vllm` has them. The worker runs the same directory in vLLM under every schedule
of `vllm_plan.schedule_entries` (prefill, chunked prefill at several budgets, prefix caching,
decode), and each run is measured against the reference:

- a run past the tolerance is `unconfirmed`: vLLM's engine has no float64 form to rerun it in,
  so it cannot be shown to keep its size (the same word `--impl vllm` gives);
- a schedule that raised inside vLLM is `crashed`, with vLLM's innermost frame;
- a prefix request that read nothing from the cache (`num_cached_tokens` 0) checked nothing: the
  record says so and the prefix is not counted as agreeing;
- every run within the tolerance is `ok` once the check had power (zeroing the transformers
  reference's cache moves the logits: vLLM exposes no cache, the same weights stand in). Power is
  measured first, on transformers' side: where the default init leaves the state too weak to
  show, the init scale is raised as the transformers census raises it (`check.INIT_LADDER`,
  seeded) and vLLM runs the weights that had power; where none had, `inconclusive`;
- a config or model that transformers cannot build, an engine vLLM does not start for it (a
  head size or layer kind the CPU backend lacks), or a prefill in one step that raises (a kernel
  the CPU build lacks: no cached path can be compared then) is `not built`, with the reason.

The record has the census's fields (`census.record.Record`) plus `engine` ("vllm"), `vllm_version` and
`vllm` (engine start and request times, the worker's memory).
"""

from __future__ import annotations

import dataclasses
import json
import tempfile
import time
from pathlib import Path
from typing import Optional

import torch

from .. import evidence
from ..judge import Run, judge, status
from ..metrics import measure
from ..defaults import NOISE_MARGIN
from ..steps import CRASHED as RUN_CRASHED, UNCHECKED
from ..verdicts import CRASHED, INCONCLUSIVE, NOT_BUILT, NOT_RUN, OK, UNCONFIRMED
from . import vllm_plan
from .boundary import transformers_frame
from .check import NO_POWER_NOTE, init_note, vocab_of
from .record import Record, new as record
from .reference import powered, save
from .vllm_engine import WorkerGone

NO_FLOAT64 = "not confirmed: vLLM's engine has no float64 form to rerun it in"
ENGINE_REFUSED = "vLLM did not start an engine for the tiny model: "


def request(model_dir: Path, tokens: torch.Tensor, vocab: int, entries: list, one_engine: bool = False) -> dict:
    """The worker's request (`impls.vllm.payload`, as `compare --impl vllm` sends it), with the
    census's cache budget; the worker's Python is not part of it."""
    from ..impls.vllm import Settings, payload

    return payload(Settings("", str(model_dir), vocab, kv_cache_memory_bytes=vllm_plan.KV_CACHE_BYTES), tokens,
                   entries, one_engine)


def check(model_type: str, worker, timeout: float = 240.0, memory: Optional[int] = None, seed: int = 0,
          tolerance: float = NOISE_MARGIN, repro_dir: Optional[Path] = None) -> Record:
    """The record of one architecture in vLLM (the module docstring says how it is judged), its
    waits on vLLM all ending within `timeout` seconds of the start."""
    deadline = time.monotonic() + timeout
    config, changes = vllm_plan.tiny_config(model_type)
    base = dict(engine="vllm", vllm_version=(worker.ready or {}).get("vllm"))
    if config is None:
        return record(model_type, NOT_BUILT, reason=changes, vllm={"answered": True}, **base)
    vocab = vocab_of(config)
    base.update(config=changes, vocab=vocab)
    tokens = torch.randint(0, vocab, (1, vllm_plan.length(config)), generator=torch.Generator().manual_seed(seed))
    got = powered(config, tokens, seed, tolerance)
    if got.model is not None:
        base.update(model_class=type(got.model).__name__, init=got.init)
    if got.why:
        return record(model_type, NOT_BUILT, reason=got.why, vllm={"answered": True}, **base)
    model, ref, floor, power = got.model, got.ref, got.floor, got.power
    with tempfile.TemporaryDirectory(prefix=f"smearcli-vllm-{model_type}-") as d:
        try:
            save(model, Path(d) / "model", model_type)
        except Exception as e:
            return record(model_type, NOT_BUILT, reason="the tiny model cannot be saved: "
                          + transformers_frame(e), vllm={"answered": True}, **base)
        entries = vllm_plan.schedule_entries(config)
        req = request(Path(d) / "model", tokens, vocab, entries, vllm_plan.one_engine(config))
        (Path(d) / "request.json").write_text(json.dumps(req))
        try:
            res = worker.ask({"op": "run", "request": str(Path(d) / "request.json"), "outdir": d},
                             max(1.0, deadline - time.monotonic()), memory)
        except WorkerGone as e:
            return record(model_type, CRASHED, reason=str(e), vllm={"answered": False}, **base)
        rec = judged(model_type, res["result"], Path(d), tokens, req, ref, floor, power, tolerance, base)
    if repro_dir is not None and rec.verdict in (CRASHED, UNCONFIRMED) and rec.worst_schedule:
        from . import vllm_repro

        vllm_repro.attach(rec, config, Path(repro_dir), worker, seed, req, max(1.0, deadline - time.monotonic() - 5))
    return rec


def runs_of(result: dict, workdir: Path, tokens, req: dict) -> list:
    """The worker's answer as RunResults named as the record names them ("chunked@13")."""
    from ..impls.vllm import to_run

    out = []
    for entry, asked in zip(result["schedules"], req["schedules"]):
        run = to_run(entry, workdir, tokens, req)
        out.append(dataclasses.replace(run, schedule=vllm_plan.label(asked)))
    return out


def judged(model_type, result, workdir, tokens, req, ref, floor, power, tolerance, base) -> Record:
    """The record from the worker's answer: each run measured, then the verdict word from
    `smearcli.judge` (the runs vLLM crashed on or did not run are the judge's too)."""
    runs = runs_of(result, workdir, tokens, req)
    timing = {"answered": True, "engine_start_s": [e.get("start_s") for e in result.get("engines", [])],
              "total_s": result.get("total_s"), "peak_rss_mb": result.get("peak_rss_mb"),
              "stuck": bool(result.get("stuck"))}  # a request stuck in vLLM: the worker is ended after this model
    base = {**base, "vllm_version": result.get("vllm_version") or base.get("vllm_version"), "vllm": timing,
            "floor": floor.per_layer[-1], "floor_source": floor.source}
    engine_failed = [e for e in result["schedules"] if e.get("engine")]
    if engine_failed and any(e["name"] != "prefix" for e in engine_failed):
        return record(model_type, NOT_BUILT, reason=ENGINE_REFUSED + engine_failed[0].get("message", ""), **base)
    schedules, notes, metrics, judged = {}, [], {}, []
    for run, entry in zip(runs, result["schedules"]):
        if run.outcome == RUN_CRASHED and entry.get("engine"):  # prefix caching refused for this model
            why, outcome = "no engine with prefix caching: " + run.message, NOT_RUN
        elif run.outcome == RUN_CRASHED and entry.get("skipped"):  # after a schedule stuck inside vLLM
            why, outcome = run.message, NOT_RUN
        elif run.outcome == RUN_CRASHED:
            why, outcome = run.message, CRASHED
        elif run.outcome == UNCHECKED:
            why, outcome = run.message, NOT_RUN
            notes.append(f"{run.schedule} checked nothing: {run.message}")
        else:  # measured: a departure stays unconfirmed, vLLM's engine having no float64 form
            m = metrics[run.schedule] = measure(ref, run, floor, tolerance)
            judged.append(Run(run.schedule, m.passed, None if m.passed else no_float64(m)))
            schedules[run.schedule] = {"status": str(status(judged[-1])),
                                       "max_abs": m.max_abs_logits, "multiple": m.logits_multiple}
            if run.steps and len(run.steps) > 1:
                schedules[run.schedule]["steps"] = ",".join(map(str, run.steps[:12]))
            continue
        judged.append(Run(run.schedule, outcome=outcome))
        schedules[run.schedule] = {"status": str(status(judged[-1])), "why": why}
    if schedules.get("prefill", {}).get("status") == str(CRASHED):  # nothing to compare a cache against
        return record(model_type, NOT_BUILT, reason="vLLM's prefill in one step raises on the CPU backend: "
                      + schedules["prefill"]["why"], **{**base, "schedules": schedules})
    verdict = judge(judged, power)
    crashed = verdict.named(CRASHED)
    failed = verdict.named(UNCONFIRMED)
    steps = {r.schedule: list(r.steps) for r in runs}
    worst = max(failed or list(metrics), key=lambda n: metrics[n].max_abs_logits, default=None)
    out = dict(base, schedules=schedules, notes=notes, worst_schedule=worst,
               max_abs=metrics[worst].max_abs_logits if worst else None,
               multiple=metrics[worst].logits_multiple if worst else None, steps=steps.get(worst))
    if verdict.word is CRASHED:
        first = crashed[0]
        return record(model_type, CRASHED, **{**out, "worst_schedule": first, "steps": steps.get(first),
                                               "max_abs": None, "multiple": None,
                                               "reason": f"{first}: {schedules[first]['why']}"})
    if "prefill" in failed:  # the one-step path departs too: the model, not a cache
        out["notes"] = notes + ["prefill in one step departs as well: vLLM's implementation of the model computes "
                                "differently from transformers', beyond its caching paths"]
    if verdict.word is UNCONFIRMED:
        return record(model_type, UNCONFIRMED, confirmation=no_float64(metrics[worst]).to_json(), **out)
    if metrics:
        out["power"] = power.to_json()
    if verdict.word is INCONCLUSIVE:
        return record(model_type, INCONCLUSIVE, reason=verdict.why,
                      **{**out, "notes": notes + ([NO_POWER_NOTE] if metrics and power.measured else [])})
    if base.get("init") is not None:
        out["notes"] = notes + [init_note(base["init"])]
    return record(model_type, OK, **out)


def no_float64(m) -> evidence.Confirmation:
    """A departure in vLLM: unconfirmed, since its engine has no float64 form to rerun it in."""
    return evidence.Confirmation(m.max_abs_logits, "float32", why=NO_FLOAT64)
