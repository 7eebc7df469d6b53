"""The census on llama.cpp (`smearcli scan --engine llamacpp`): every architecture llama.cpp's
converter registers that transformers has a causal-LM class for, each on the census's tiny config,
run by llama.cpp under its schedules against the same weights' full pass in transformers.

- `names_for(python)`: the model types (the converter's registry, `worker.py archs` in llama.cpp's
  environment, mapped to transformers model types by `reference.model_types`, the census's rule
  for an engine's architecture names);
- `check(model_type, python, ...)`: one architecture's record. The tiny config is the census's
  (`derive.derive`), built seeded at the first init of `check.INIT_LADDER` that shows power on
  transformers' side (as the census on vLLM does); the model is saved as safetensors and
  `impls.llamacpp.LlamaCppRunner` converts it to a float32 GGUF (synthetic vocabulary of the
  config's `vocab_size`) and runs prefill, ubatch (n_ubatch around the conv width and odd ones),
  chunked, decode, prefix (`seq_cp`), rollback (`seq_rm`) and batched, KV cache in float32, one
  worker process per model with its watchdog. `compare.compare` measures every run against the
  transformers full pass with the float64 floor and `smearcli.judge` gives the word, as for
  `compare --impl llamacpp`; `impls.llamacpp.own_prefill` holds every cached path to llama.cpp's
  own one-call prefill:
  * llama.cpp has no float64: a departure is `unconfirmed`, never `bug`;
  * a departure already in the one-call prefill is the implementation's (its kernels, its
    conversion), said so in the reason: not a cache finding;
  * a cached path past the threshold against that prefill (and against transformers) is the
    finding: `shape` names the kind of boundary and `born_at` the first position;
  * what the converter or llama.cpp's loader refuses is `not built` with the reason; a partial
    `seq_rm` llama.cpp refuses on recurrent memory (its documented limit) is the rollback
    schedule's `unsupported`, not a crash; a worker that dies is `crashed` with llama.cpp's frame.
- `Session` / `open_session`: the engine as `census.engines` runs it (registered there as
  "llamacpp"; `isolate.census` checks each architecture in its own forked process, `--timeout`);
- `summary(records, wall_s)`: the benchmark (conversion, load, runs); `sections(records, meta)`: the
  page under the title `report.markdown` gives it.

A finding's reproducer is `census.llamacpp_repro` (llama.cpp's environment only, no smearcli).
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path
from typing import Optional, Sequence

import torch

from ..defaults import NOISE_MARGIN
from ..verdicts import CRASHED, NOT_BUILT, OK, UNCONFIRMED, UNSUPPORTED
from . import derive
from .boundary import transformers_frame
from .check import NO_POWER_NOTE, init_note, text_config, vocab_of
from .record import Record, new as record
from .report import sort_key
from .reference import model_types, powered, save

T = 48  # tokens: room for micro-batches of 3 to 7, three 16-token calls and drafts of the default size
ENGINE = "llamacpp"
THREADS = 1  # llama.cpp's threads per model: its workers spin while they wait, so on a loaded machine two
# threads made one tiny model's schedules take 67 s instead of 7 s (load 8, 2 cores); --jobs runs models side by side
# the boundary each of llama.cpp's cached paths crosses, in words (a finding's shape)
BOUNDARY = {"ubatch": "a micro-batch boundary inside one llama_decode (n_ubatch)",
            "chunked": "a boundary between successive llama_decode calls",
            "decode": "one llama_decode call per token",
            "prefix": "a sequence continued after llama_memory_seq_cp",
            "rollback": "a sequence continued after llama_memory_seq_rm of rejected drafts",
            "batched": "two sequences of different lengths in one llama_decode call"}
FINDING = "cache finding"
OWN = "the implementation's own departure, not a cache finding"


def names_for(python: str) -> list[str]:
    """Every model type this census can check: the converter's architectures with a
    transformers causal-LM class."""
    from ..impls.llamacpp.environment import archs

    return model_types(archs(python))


def check(model_type: str, python: str, timeout: float = 240.0, seed: int = 0, tolerance: float = NOISE_MARGIN,
          repro_dir: Optional[Path] = None, threads: int = THREADS) -> Record:
    """One architecture's record (the module docstring says how it is judged); the llama.cpp worker
    is ended `timeout` - 15 s after the start at the latest."""
    t0 = time.monotonic()
    got = derive.derive(model_type)
    base = dict(engine=ENGINE)
    if got.error:
        return record(model_type, NOT_BUILT, reason=got.error, **base)
    config = got.config
    text = text_config(config)
    vocab = int(getattr(text, "vocab_size", 0) or 0)
    if vocab < 2:
        return record(model_type, NOT_BUILT, reason="the tiny config has no vocab_size for llama.cpp's vocabulary",
                      **base)
    base.update(config=got.summary(), vocab=vocab_of(config))
    tokens = torch.randint(0, vocab_of(config), (1, T), generator=torch.Generator().manual_seed(seed))
    got = powered(config, tokens, seed, tolerance)
    if got.why:
        return record(model_type, NOT_BUILT, reason=got.why, **base)
    model, ref_runner, floor, power, init = got.model, got.runner, got.floor, got.power, got.init
    base.update(model_class=type(model).__name__, init=init, floor=floor.per_layer[-1], floor_source=floor.source)
    with tempfile.TemporaryDirectory(prefix=f"smearcli-llamacpp-{model_type}-") as d:
        try:
            save(model, Path(d) / "model", model_type)
        except Exception as e:
            return record(model_type, NOT_BUILT, reason="the tiny model cannot be saved: " + transformers_frame(e),
                          **base)
        gguf = Path(d) / "model.gguf"
        rec, finding, c, runner = judged(model_type, model, Path(d) / "model", python, tokens, ref_runner, power, tolerance,
                                base, max(30.0, timeout - 15.0 - (time.monotonic() - t0)), threads, gguf)
        if rec.reason:  # the converter names files in the temporary directory: not the record's business
            for spelt in {str(Path(d).resolve()), d}:  # the worker is sent the resolved path
                rec.reason = str(rec.reason).replace(spelt, "MODEL_DIR")
        if init is not None and rec.verdict == str(OK):
            rec.notes.append(init_note(init))
        if repro_dir is not None and finding and gguf.is_file():
            from . import llamacpp_repro

            try:
                llamacpp_repro.attach(rec, c, runner, gguf, Path(repro_dir), python)
            except OSError as e:  # the finding stands; its reproducer could not be written
                rec.reproducer_output = f"the reproducer was not written: {e.strerror or e}"
    return rec


def judged(model_type, model, model_dir: Path, python: str, tokens, ref_runner, power, tolerance, base,
           timeout_s: float, threads: int, gguf: Path):
    """(the record, whether it is a finding to reproduce, the comparison or None, the runner): llama.cpp's runs measured by
    `compare.compare` and judged by `smearcli.judge`, then held to llama.cpp's own prefill."""
    from .. import compare
    from ..errors import UserError
    from ..impls import llamacpp
    from ..impls.llamacpp.own_prefill import against_prefill
    from ..judge import Run, status
    from ..steps import UNCHECKED
    from ..steps import ScheduleOptions

    settings = llamacpp.Settings(python=python, model=str(model_dir), vocab=int(text_config(model.config).vocab_size),
                                 widths=llamacpp.widths_for(text_config(model.config), T), f16_too=False,
                                 threads=threads, timeout_s=timeout_s, stuck_s=min(120.0, timeout_s),
                                 keep_gguf=str(gguf))
    runner = llamacpp.LlamaCppRunner(settings)
    opts = ScheduleOptions()
    try:
        c = compare.compare([runner], tokens, runner.schedules, options=opts, tolerance=tolerance,
                            reference=ref_runner, power=False)
    except UserError as e:  # the environment's answer outside the protocol: not the model's
        return record(model_type, CRASHED, reason=f"llama.cpp's worker: {e}", llamacpp=timing(runner), **base), \
            False, None, runner
    res = runner.result or {}
    if res.get("not_built"):
        return record(model_type, NOT_BUILT, reason="llama.cpp: " + res["not_built"], llamacpp=timing(runner),
                      **base), False, None, runner
    c.power = power
    own = against_prefill(c, runner.label)
    word = c.word
    schedules, steps = {}, {}
    by_name = {d.schedule: d for d in own.runs}
    for r, m in zip(c.runs, c.metrics):
        e = {"status": str(c.status(m)), "max_abs": m.max_abs_logits, "multiple": m.logits_multiple}
        d = by_name.get(r.schedule)
        if d is not None:
            e.update(vs_prefill=d.max_abs, first=d.first)
        if len(r.steps) > 1:
            e["steps"] = ",".join(map(str, r.steps[:12]))
        schedules[r.schedule], steps[r.schedule] = e, list(r.steps)
    for r in c.unmeasured:
        refused = r.outcome == UNCHECKED  # llama.cpp's documented refusal (a partial seq_rm on recurrent memory)
        schedules[r.schedule] = {"status": str(UNSUPPORTED) if refused else str(status(Run(r.schedule, outcome=r.outcome))),
                                 "why": r.message}
    notes = [n for n in runner.notes() if not n.startswith("ubatch")] + own.lines()
    notes += [f"ubatch widths: {n.split(';', 1)[1].strip()}" for n in runner.notes() if n.startswith("ubatch")]
    notes += [f"rollback: {s['why']}" for s in schedules.values() if s.get("status") == str(UNSUPPORTED)]
    failed = {m.schedule for m in c.failures}
    found = [d for d in own.findings if d.schedule in failed]
    out = dict(base, schedules=schedules, notes=notes, llamacpp=timing(runner))
    if power is not None and power.measured:
        out["power"] = power.to_json()
    if word is CRASHED:
        first = c.crashed[0]
        return record(model_type, CRASHED, worst_schedule=first.schedule, steps=steps.get(first.schedule),
                      reason=f"{first.schedule}: {first.message}", **out), True, c, runner
    metrics = {m.schedule: m for m in c.metrics}
    if found:
        worst = max(found, key=lambda d: d.max_abs)
        m = metrics[worst.schedule]
        return record(model_type, word, worst_schedule=worst.schedule, max_abs=m.max_abs_logits,
                      multiple=m.logits_multiple, steps=steps.get(worst.schedule),
                      shape=BOUNDARY.get(worst.schedule, worst.schedule)
                      + (", first at one of the run's boundaries" if worst.at_boundary else ""),
                      born_at=f"logits@{worst.first}",
                      reason=f"{FINDING}: {worst.schedule} departs from llama.cpp's own one-call prefill by "
                             f"{worst.max_abs:.3g} from position {worst.first} (threshold {own.threshold:.3g}); "
                             + (f"that prefill itself departs from transformers by {own.prefill_max:.3g} (the "
                                "implementation's); " if own.prefill_departs else "")
                             + "llama.cpp has no float64 to confirm it in",
                      **out), True, c, runner
    worst = "prefill" if own.prefill_departs and "prefill" in metrics else max(
        failed or metrics, key=lambda n: metrics[n].max_abs_logits, default=None)
    fields = dict(worst_schedule=worst, max_abs=metrics[worst].max_abs_logits if worst else None,
                  multiple=metrics[worst].logits_multiple if worst else None, steps=steps.get(worst))
    if word is UNCONFIRMED and own.prefill_departs:
        fields["reason"] = (f"{OWN}: llama.cpp's one-call prefill departs from transformers by {own.prefill_max:.3g} "
                            f"and every cached path matches that prefill within {own.threshold:.3g}")
    elif word is UNCONFIRMED:
        fields["reason"] = "a cached path departs from transformers, not from llama.cpp's own one-call prefill"
    elif word is not OK:
        j = c.judgement
        fields["reason"] = j.why
        if power is not None and power.measured:
            notes.append(NO_POWER_NOTE)
    return record(model_type, word, **fields, **out), False, c, runner


def timing(runner) -> dict:
    """What the record keeps of llama.cpp's side: its version, the GGUF, the times (the benchmark's)."""
    r = runner.result or {}
    conv = r.get("convert") or {}
    return {"llama_cpp_python": r.get("llama_cpp_python"), "arch": conv.get("arch"),
            "gguf_mb": round(conv.get("bytes", 0) / 1e6, 2) if conv else None, "convert_s": conv.get("convert_s"),
            "load_s": r.get("load_s"), "schedules_s": round(sum(float(e.get("wall_s") or 0)
                                                                 for e in r.get("schedules") or []), 2),
            "worker_s": r.get("total_s"), "wall_s": r.get("wall_s"),
            "recurrent": r.get("recurrent"), "hybrid": r.get("hybrid"), "deaths": len(r.get("deaths") or [])}


def summary(recs: Sequence[Record], wall_s: float) -> dict:
    """The benchmark: the census's wall time and llama.cpp's share of it (conversion, load, runs)."""
    ll = [r.llamacpp or {} for r in recs]
    total = (lambda k: round(sum(float(x.get(k) or 0) for x in ll), 1))
    return {"wall_s": round(wall_s, 1), "architectures": len(recs), "convert_s": total("convert_s"),
            "load_s": total("load_s"), "runs_s": total("schedules_s"), "worker_wall_s": total("wall_s"),
            "architecture_s": total("wall_s") and round(sum(float(r.wall_s or 0) for r in recs), 1)}


def summary_line(s: dict) -> str:
    return (f"census on llama.cpp: {s['architectures']} architectures in {s['wall_s']:g} s; in llama.cpp's workers "
            f"{s['worker_wall_s']:g} s (converting {s['convert_s']:g} s, loading {s['load_s']:g} s, running the schedules "
            f"{s['runs_s']:g} s, the rest starting Python and importing torch and the converter); "
            f"{s['architecture_s']:g} s in the per-architecture processes (the transformers reference and its float64 "
            "floor included)")


def _cell(text, n: int = 160) -> str:
    """`text` as one Markdown table cell: one line, at most `n` characters, its pipes escaped (a
    "max |d log-prob|" reads as written, not as "/d log-prob/")."""
    return str(text or "").replace("\n", " ")[:n].replace("|", "\\|")


def sections(recs: Sequence[Record], meta: Optional[dict] = None) -> list[str]:
    """The census on llama.cpp's page after its title and count line (`report.markdown` frames it):
    what ran, the benchmark, the cache findings and crashes (with reproducers), the implementation's
    own departures, what was not built and why, then every architecture with its verdict or reason."""
    meta = meta or {}
    version = meta.get("llama_cpp_python") or next(((r.llamacpp or {}).get("llama_cpp_python") for r in recs
                                                   if (r.llamacpp or {}).get("llama_cpp_python")), "?")
    out = [f"llama-cpp-python {version} (CPU build, one thread per model), float32 GGUF, float32 KV cache, {T} "
           "tokens per architecture.", ""]
    b = meta.get("benchmark")
    if b:
        out += [f"Benchmark: {summary_line(b)}" + (f"; load {meta['load']}" if meta.get("load") else "") + ".", ""]
    found = [r for r in sorted(recs, key=sort_key) if str(r.reason or "").startswith(FINDING)
             or r.verdict == str(CRASHED)]
    if found:
        out += ["## Findings", "", "A cached path of llama.cpp past the threshold against its own one-call prefill "
                "(llama.cpp has no float64, so unconfirmed), or a crash with llama.cpp's frame. Each reproducer needs "
                "only llama.cpp's environment and the GGUF beside it, and exits 1 while the bug is there.", "",
                "| architecture | verdict | schedule | shape | first position | reason | reproducer (exit) |",
                "|---|---|---|---|---|---|---|"]
        for r in found:
            rep = f"`{Path(r.reproducer).name}` ({r.reproducer_status})" if r.reproducer else "-"
            out.append(f"| {r.model_type} | {r.verdict} | {r.worst_schedule or '-'} | "
                       f"{_cell(r.shape or '-')} | {(r.born_at or '-').split('@')[-1]} | "
                       f"{_cell(r.reason, 240)} | {rep} |")
        out.append("")
    own = [r for r in sorted(recs, key=sort_key) if str(r.reason or "").startswith(OWN)]
    if own:
        out += ["## The implementation's own departures", "", "llama.cpp's one-call prefill already departs from "
                "the transformers full pass, and every cached path matches that prefill: its kernels or its "
                "conversion, not its cache.", "", "| architecture | prefill vs transformers | x floor |", "|---|---|---|"]
        for r in own:
            p = (r.schedules or {}).get("prefill") or {}
            out.append(f"| {r.model_type} | {p.get('max_abs', 0):.2g} | {p.get('multiple', 0):.3g} |")
        out.append("")
    skipped = [r for r in sorted(recs, key=lambda r: r.model_type) if r.verdict == str(NOT_BUILT)]
    if skipped:
        out += ["## Not built", "", "| architecture | why |", "|---|---|"]
        out += [f"| {r.model_type} | {_cell(r.reason, 240)} |" for r in skipped]
        out.append("")
    out += ["## Every architecture", "",
            "| architecture | verdict | worst schedule | error | x floor | rollback | reason or notes |",
            "|---|---|---|---|---|---|---|"]
    for r in sorted(recs, key=sort_key):
        err = "-" if r.max_abs is None else f"{r.max_abs:.2g}"
        mult = "-" if r.multiple is None else f"{r.multiple:.2g}"
        rb = ((r.schedules or {}).get("rollback") or {}).get("status") or "-"
        said = r.reason or "; ".join(n for n in r.notes or [] if "one-call prefill against" in n)
        out.append(f"| {r.model_type} | {r.verdict} | {r.worst_schedule or '-'} | {err} | {mult} | "
                   f"{rb} | {_cell(said)} |")
    return out


def markdown(recs: Sequence[Record], meta: Optional[dict] = None) -> str:
    """The whole page, as `report.markdown` frames every engine's."""
    from . import engines
    from .report import markdown as framed

    return framed(recs, meta, engines.get(ENGINE))


def load() -> str:
    """The machine's load average (1, 5, 15 minutes): what any time reported here ran beside."""
    import os

    try:
        return "%.1f, %.1f, %.1f" % os.getloadavg()
    except OSError:
        return "?"


class Session:
    """The llama.cpp engine (`census.engines`): its environment checked by the handshake, the
    converter's architectures listed there, each architecture checked with its own worker; the
    benchmark of the run in `meta()`."""

    def __init__(self, python: Optional[str], quiet: bool = False):
        from ..errors import UserError
        from ..impls.llamacpp import ENV_PYTHON
        from ..impls.llamacpp.environment import check_python

        if not python:
            raise UserError(f"the llama.cpp engine needs the Python of llama.cpp's environment (${ENV_PYTHON}); "
                            "scripts/make_llamacpp_env.sh DIR makes one (then DIR/bin/python)")
        self.python, self.quiet = python, quiet
        self.hello = check_python(python)
        self.names = names_for(python)
        self.t0, self.done = time.monotonic(), []

    def meta(self) -> dict:
        """llama-cpp-python's version, the benchmark and the load (the benchmark said on stderr unless quiet)."""
        bench, now = summary(self.done, time.monotonic() - self.t0), load()
        if not self.quiet:
            import sys

            sys.stderr.write(f"smearcli: {summary_line(bench)} (load {now})\n")
        return {"engine": ENGINE, "llama_cpp_python": self.hello.get("llama_cpp_python"),
                "llamacpp_python": self.python, "benchmark": bench, "load": now}

    def model_types(self) -> list[str]:
        return list(self.names)

    def check(self, model_type: str, repro_dir: Path, timeout: float, memory: Optional[int]) -> Record:
        return check(model_type, self.python, timeout=timeout, repro_dir=repro_dir)

    def checked(self, rec: Record, more: bool) -> bool:
        self.done.append(rec)
        return False

    def close(self) -> None:
        pass


open_session = Session

