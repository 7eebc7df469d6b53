"""The census on vLLM, `smearcli scan --engine vllm`: every architecture the installed vLLM
registers that transformers has a causal-LM class for, each on its tiny config in vLLM against
the same weights' full pass in transformers, with one vLLM process for them all
(`engines.vllm.serve.Worker`) and each architecture in its own forked process (`isolate`). The
engine's census is this one module, registered by the folder's `registration`; its sections, in order:

**What it runs.** Which architectures: `engines.transformers.reference.model_types` of the worker's answer
(vLLM's ModelRegistry). `tiny_config(model_type)`: the census's own tiny config (`derive.derive`,
unchanged) with what vLLM's CPU backend needs applied on top (`adjust`, each change with why);
`engines.transformers.reference.save` writes the directory vLLM loads. `schedule_entries(config)`: the worker's
schedules, chunked prefill at several budgets among them (`budgets`).

**One architecture, judged** (`check(model_type, worker)`). The tiny config is built seeded and
saved as safetensors; the reference is its full pass in transformers, as log-probabilities, and
the noise floor that pass against its float64 twin (`evidence.floor`), as `compare --impl vllm`
has them. The worker runs the same directory in vLLM under every schedule, and each run is
measured against the reference, the word coming from `smearcli.judging.judge`:

- a run past the tolerance is `unconfirmed`: vLLM's engine has no float64 form to rerun it in,
  so it cannot be shown to keep its size (the same word `--impl vllm` gives);
- a schedule that raised inside vLLM is `crashed`, with vLLM's innermost frame;
- a prefix request that read nothing from the cache (`num_cached_tokens` 0) checked nothing: the
  record says so and the prefix is not counted as agreeing;
- every run within the tolerance is `ok` once the check had power (zeroing the transformers
  reference's cache moves the logits: vLLM exposes no cache, the same weights stand in). Power is
  measured first, on transformers' side: where the default init leaves the state too weak to
  show, the init scale is raised as the transformers census raises it (`reference.INIT_LADDER`,
  seeded; `reference.powered`) and vLLM runs the weights that had power; where none had,
  `inconclusive`;
- a config or model that transformers cannot build, an engine vLLM does not start for it (a
  head size or layer kind the CPU backend lacks), or a prefill in one step that raises (a kernel
  the CPU build lacks: no cached path can be compared then) is `not built`, with the reason.

The record has the census's fields (`census.record.Record`) plus `engine` ("vllm"),
`vllm_version` and `vllm` (engine start and request times, the worker's memory).

**The census around it.** The engine's `Session` (`census.engines`) runs in the census's one loop
(`isolate.census`: the record file, resuming, shards and merging are every engine's), `summary(...)`
is the benchmark (the census's wall time and the shares spent importing vLLM and starting
engines), `sections(...)` the engine's own part of the census's page (`report.markdown`).

**A reproducer per finding.** `write(record, config, path, ...)` writes one Python file that needs
vLLM's environment only (vLLM with its own torch and transformers; never smearcli): it saves the
tiny model (the config embedded, the weights seeded), runs the two requests of the failing
schedule through vLLM's public API (a prefix of whole blocks, then the whole input reading it; or
the prompt at the chunk budget; or a one-token prompt decoded), prints the numbers, and exits 1
while the bug is there: vLLM raises, or its log-probabilities are further from the model's full
pass in transformers than `MARGIN` x that pass's own float32 rounding (against its float64 copy),
0 once fixed. `attach(...)` writes it and has the worker run it once in vLLM's interpreter with
`-I` (no PYTHONPATH, no user site), so the record holds its path and exit status.
"""

from __future__ import annotations

import dataclasses
import json
import sys
import time
from pathlib import Path
from typing import Optional, Sequence

import torch

from ...judging import evidence
from ...util.defaults import NOISE_MARGIN
from .implementation import BLOCK_SIZE, Settings, payload, to_run
from .serve import Worker, WorkerGone, archs
from ...judging.judge import (
    CANNOT_RUN, CHECKED_NOTHING, DERIVE, ENGINE, RAISED, REFERENCE, THEIRS_REFUSES, WORKER, stopped,
)
from ...measure.metrics import measure
from ...judging.verdicts import CRASHED, FAILURES, INCONCLUSIVE, UNCONFIRMED
from ...census import known
from ...tiny import derive
from ...tiny.derive import CONV_KEYS, first_int
from ...census import measured
from ...census.measured import Ran
from ...census.record import Record, new as record
from .data import VllmData
from ..transformers.reference import NO_POWER_NOTE, arch_of, init_note, model_types, prepared, stamp
from ...census.report import cell, sort_key


# -- what it runs: the architectures, the tiny config, the schedules ------------------------------

T = 64  # two cache blocks of BLOCK_SIZE (32): the prefix request reads the first
STATE_T = 128  # a model with a conv state: vLLM raises its block until a page holds the Mamba state's (64
# tokens for the tiny hybrids) and caches whole blocks only, so the input is two of those
HEAD = 32  # the smallest head size vLLM's CPU attention takes (32, 64, 80, ... 512); derive's is 16
ODD = 13  # an odd chunk budget that straddles no block, conv width or window edge
DEFAULT_CONV = 4  # the conv width budgets stand on when the model has none
KV_CACHE_BYTES = 16 << 20  # a 64-token sequence of a tiny model needs kilobytes; Mamba states a few MB
HEAD_COUNT_KEYS = ("num_attention_heads", "n_head", "n_heads")  # attention heads, as configs spell them


def adjust(d: dict) -> dict:
    """vLLM's CPU needs on one (text) config dict, as changes {key: new value}:

    - attention heads of HEAD (32): derive makes 4 heads of 16, which the CPU attention refuses,
      so the same width (64) is 2 heads of 32 and the key/value heads 1 (grouped query attention
      kept: 2 query heads share it); a config that spells the head size out gets it as well;
    - positions for the longest request (`length` + 1 rounded up to a block) at least.
    A config without attention heads (Mamba), or with latent attention (MLA), is left as derived."""
    heads_key = next((k for k in HEAD_COUNT_KEYS if isinstance(d.get(k), int)), None)
    width = next((d[k] for k in ("hidden_size", "d_model", "n_embd") if isinstance(d.get(k), int)), None)
    if heads_key is None or width is None:  # "num_heads" alone is an SSM's (Mamba2, xLSTM): left alone
        return {}
    if isinstance(d.get("kv_lora_rank"), int):  # MLA: its head sizes are the rope and nope parts (16 + 16),
        return {}  # and one key/value head per query head, as derived; a head_dim of 32 breaks its rotary
    attn_width = d.get("attention_hidden_size") if isinstance(d.get("attention_hidden_size"), int) else width
    out = {heads_key: max(1, attn_width // HEAD)}
    if isinstance(d.get("head_dim"), int):
        out["head_dim"] = HEAD
    for k in ("num_key_value_heads", "n_head_kv", "num_kv_heads", "multi_query_group_num"):
        if isinstance(d.get(k), int) and d[k] > 1:
            out[k] = 1
    for k in ("max_position_embeddings", "n_positions"):
        if isinstance(d.get(k), int) and d[k] < 2 * STATE_T:
            out[k] = 2 * STATE_T
    return out


def tiny_config(model_type: str):
    """(config, changes {key: value}) of one architecture for vLLM, or (None, why)."""
    got = derive.derive(model_type)
    if got.error:
        return None, got.error
    cfg = got.config
    d = {k: v for k, v in cfg.to_dict().items() if k not in ("transformers_version",)}
    changes = {}
    for key in ("text_config", "language_config", "llm_config"):  # a composite's text part
        if isinstance(d.get(key), dict):
            ch = adjust(d[key])
            d[key] = {**d[key], **ch}
            changes.update({f"{key}.{k}": v for k, v in ch.items()})
    ch = adjust(d)
    d.update(ch)
    changes.update(ch)
    try:
        new = type(cfg)(**{k: v for k, v in d.items() if k != "architectures"})
    except Exception as e:
        return None, f"the tiny config adjusted for vLLM's CPU backend is refused: {type(e).__name__}: {str(e)[:160]}"
    return new, {**got.summary(), **changes}


def conv_width(config) -> Optional[int]:
    return first_int(config, CONV_KEYS)


def length(config) -> int:
    """The input's length: T, or STATE_T for a model with a conv (so a recurrent) state."""
    return STATE_T if conv_width(config) else T


def budgets(config) -> list[int]:
    """Chunked prefill's token budgets: below and at the conv width, one cache block, an odd size.
    Without a conv, one small budget (3) stands for both: nothing in the model has that width."""
    cw = conv_width(config)
    small = (cw - 1, cw) if cw else (DEFAULT_CONV - 1,)
    return sorted({b for b in (*small, BLOCK_SIZE, ODD) if 1 <= b < length(config)})


def one_engine(config) -> bool:
    """Whether one engine, prefix caching on (vLLM's default), serves every schedule: yes without
    a conv state. A model with one gets a second for the prefix schedule: caching on switches vLLM's
    Mamba layers to another path (`mamba_cache_mode` "align"), and the other schedules must run
    the path a model without caching runs."""
    return conv_width(config) is None


def schedule_entries(config) -> list[dict]:
    """The worker's schedules: prefill, chunked at each budget, decode, then prefix (a block) last
    (on the engine the others ran on, or a second: `one_engine`)."""
    return ([{"name": "prefill"}] + [{"name": "chunked", "budget": b} for b in budgets(config)]
            + [{"name": "decode"}, {"name": "prefix", "prefix": BLOCK_SIZE}])


def label(entry: dict) -> str:
    """A schedule's name in the record: "chunked@13" for chunked prefill at a budget of 13."""
    return f"chunked@{entry['budget']}" if entry["name"] == "chunked" else entry["name"]

# -- one architecture, judged -------------------------------------------------------------------

NO_FLOAT64 = "not confirmed: vLLM's engine has no float64 form to rerun it in"
# one request of the census's tiny models: seconds (the whole vLLM side of an architecture that ran,
# engine starts and every schedule, took at most 18 s in the census of 2026-12-06); past this it is
# stuck (`compare --impl vllm`, on a user's model, waits 120 s)
CENSUS_STUCK_S = 45
ENGINE_REFUSED = "vLLM did not start an engine for the tiny model: "


def request(model_dir: Path, tokens: torch.Tensor, vocab: int, entries: list, one_engine: bool = False) -> dict:
    """The worker's request (`engines.vllm.payload`, as `compare --impl vllm` sends it), with the
    census's cache budget; the worker's Python is not part of it."""
    return payload(Settings("", str(model_dir), vocab, kv_cache_memory_bytes=KV_CACHE_BYTES, stuck_s=CENSUS_STUCK_S,
                            prefill_decides=True), tokens, entries, one_engine)


def check(model_type: str, worker, timeout: float = 240.0, memory: Optional[int] = None, seed: int = 0,
          tolerance: float = NOISE_MARGIN, repro_dir: Optional[Path] = None) -> Record:
    """The record of one architecture in vLLM (the module docstring says how it is judged), its
    waits on vLLM all ending within `timeout` seconds of the start."""
    deadline = time.monotonic() + timeout
    config, changes = tiny_config(model_type)
    base = dict(engine="vllm", vllm_version=(worker.ready or {}).get("vllm"))
    if config is None:
        return record(model_type, stopped(DERIVE), reason=changes, vllm={"answered": True}, **base)
    with prepared(model_type, config, changes, length(config), seed, tolerance, f"smearcli-vllm-{model_type}-") as p:
        base.update(p.fields)
        if p.stop:
            return record(model_type, stopped(p.stop), reason=p.why, vllm={"answered": True}, **base)
        d, tokens, got = p.directory, p.tokens, p.got
        entries = schedule_entries(config)
        req = request(d / "model", tokens, base["vocab"], entries, one_engine(config))
        (d / "request.json").write_text(json.dumps(req), encoding="utf-8")
        try:
            res = worker.ask({"op": "run", "request": str(d / "request.json"), "outdir": str(d)},
                             max(1.0, deadline - time.monotonic()), memory)
        except WorkerGone as e:
            return record(model_type, stopped(WORKER), reason=str(e), vllm={"answered": False}, **base)
        rec = judged(model_type, res["result"], d, tokens, req, got.ref, got.floor, got.power, tolerance, base)
    if repro_dir is not None and rec.verdict in (CRASHED, UNCONFIRMED) and rec.worst_schedule:
        attach(rec, config, Path(repro_dir), worker, seed, req, max(1.0, deadline - time.monotonic() - 5))
    return rec


def runs_of(result: dict, workdir: Path, tokens, req: dict) -> list:
    """The worker's answer as RunResults named as the record names them ("chunked@13")."""
    out = []
    for entry, asked in zip(result["schedules"], req["schedules"]):
        run = to_run(entry, workdir, tokens, req)
        out.append(dataclasses.replace(run, schedule=label(asked)))
    return out


def judged(model_type, result, workdir, tokens, req, ref, floor, power, tolerance, base) -> Record:
    """The record from the worker's answer: each run measured, then the verdict word from
    `smearcli.judging.judge` (the runs vLLM crashed on or did not run are the judge's too)."""
    runs = runs_of(result, workdir, tokens, req)
    timing = {"answered": True, "engine_start_s": [e.get("start_s") for e in result.get("engines", [])],
              "total_s": result.get("total_s"), "peak_rss_mb": result.get("peak_rss_mb"),
              "stuck": bool(result.get("stuck"))}  # a request stuck in vLLM: the worker is ended after this model
    base = {**base, "vllm_version": result.get("vllm_version") or base.get("vllm_version"), "vllm": timing,
            "floor": floor.per_layer[-1], "floor_source": floor.source}
    engine_failed = [e for e in result["schedules"] if e.get("engine")]
    if engine_failed and any(e["name"] != "prefix" for e in engine_failed):
        return record(model_type, stopped(ENGINE), reason=ENGINE_REFUSED + engine_failed[0].get("message", ""),
                      **base)
    ran, notes = [], []
    for run, entry in zip(runs, result["schedules"]):
        steps = list(run.steps)
        if run.outcome == RAISED and entry.get("engine"):  # vLLM refuses prefix caching for this model
            ran.append(Ran(run.schedule, steps, outcome=THEIRS_REFUSES, why="no engine with prefix caching: " + run.message))
        elif run.outcome == RAISED and entry.get("skipped"):  # after a schedule stuck inside vLLM
            ran.append(Ran(run.schedule, steps, outcome=CANNOT_RUN, why=run.message))
        elif run.outcome is not None:  # it raised, or checked nothing
            ran.append(Ran(run.schedule, steps, outcome=run.outcome, why=run.message))
            if run.outcome == CHECKED_NOTHING:
                notes.append(f"{run.schedule} checked nothing: {run.message}")
        else:  # measured: a departure stays unconfirmed, vLLM's engine having no float64 form
            m = measure(ref, run, floor, tolerance)
            ran.append(Ran(run.schedule, steps, m, None if m.passed else no_float64(m)))
    verdict = measured.judged(ran, power)
    schedules = measured.entries(ran, verdict)
    prefill = schedules.get("prefill")
    if prefill is not None and prefill.status == str(CRASHED):  # nothing to compare a cache against
        return record(model_type, stopped(REFERENCE), reason="vLLM's prefill in one step raises on the CPU backend: "
                      + prefill.why, **{**base, "schedules": schedules})
    failed = verdict.named(UNCONFIRMED)
    out = dict(base, schedules=schedules, notes=notes, **measured.verdict_fields(ran, verdict, power, failed))
    if verdict.word is CRASHED:
        return record(model_type, verdict.word, **out)
    if "prefill" in failed:  # the one-step path departs too: the model, not a cache
        out["notes"] = notes + ["prefill in one step departs as well: vLLM's implementation of the model computes "
                                "differently from transformers', beyond its caching paths"]
    if verdict.word is INCONCLUSIVE:
        metrics = any(r.metrics is not None for r in ran)
        out.update(reason=verdict.why, notes=notes + ([NO_POWER_NOTE] if metrics and power.measured else []))
    elif verdict.word is not UNCONFIRMED and base.get("init") is not None:
        out["notes"] = notes + [init_note(base["init"])]
    return record(model_type, verdict.word, **out)


def no_float64(m) -> evidence.Confirmation:
    """A departure in vLLM: unconfirmed, since its engine has no float64 form to rerun it in."""
    return evidence.Confirmation(m.max_abs_logits, "float32", why=NO_FLOAT64)

# -- the census around it: the session, the benchmark, the page ---------------------------------

SKIP = str(stopped(ENGINE))  # an architecture the census could not run, with why


def names_for(worker: Worker) -> list[str]:
    """Every model type this census can check: vLLM's architectures with a transformers
    causal-LM class."""
    return model_types(archs(worker))


def check_one(name: str, worker: Worker, timeout: float, memory: Optional[int], repro_dir: Path) -> Record:
    """One architecture's record, in its forked process; its wait on vLLM ends before isolate's."""
    rec = check(name, worker, timeout=max(5.0, timeout - 10.0), memory=memory, repro_dir=repro_dir)
    # the imports so far, as this process saw them: a census stopped early still has its benchmark
    rec.vllm = (rec.vllm or VllmData()).but(import_s_so_far=round(worker.import_s, 2), starts=worker.starts)
    return rec


# where a refusal is the model's own whatever the process served before: vLLM validating the
# config (`ModelConfig`), before any engine or kernel state exists
CONFIG_FRAMES = ("(at vllm/engine/arg_utils.py:", "(at vllm/config/")


def refused_by_the_process(rec: Record) -> bool:
    """Whether an engine refusal may be the worker process's rather than the model's: any refusal
    but vLLM's config validation. What an earlier model left in a process can refuse the next:
    vLLM 0.32's process-wide parallel state ("expert parallel group is not initialized", a MoE
    after others), and, once a model's module has imported llvmlite (numba), every later engine
    ("'_lib_fn_wrapper' object has no attribute 'get'", vLLM's kernel rebinding scanning the
    process's modules)."""
    reason = str(rec.reason or "")
    return (rec.verdict == SKIP and reason.startswith(ENGINE_REFUSED)
            and not any(f in reason for f in CONFIG_FRAMES))


class Session:
    """The vLLM engine's census (`census.engines`): one worker (`engines.vllm.serve.Worker`) for every
    architecture, each checked in its own forked process, one at a time. Between architectures a
    worker that died, hung or left an answer unread is started again; an engine vLLM refused in a
    worker that had served others is checked again in a fresh one before it counts, unless vLLM's
    config validation refused it (`refused_by_the_process`)."""

    def __init__(self, worker: Worker, python: Optional[str] = None, quiet: bool = True):
        self.worker, self.python, self.quiet = worker, python, quiet
        self.t0 = time.monotonic()
        self.done: list[Record] = []
        self.again: Optional[str] = None  # the architecture being checked again

    def model_types(self) -> list[str]:
        return names_for(self.worker)

    def check(self, model_type: str, repro_dir: Path, timeout: float, memory: Optional[int]) -> Record:
        return check_one(model_type, self.worker, timeout, memory, repro_dir)

    def checked(self, rec: Record, more: bool) -> bool:
        w = self.worker
        w.served += 1
        if rec.model_type == self.again:
            rec.notes = list(rec.notes or []) + ["checked again in a fresh vLLM process"]
        elif refused_by_the_process(rec) and w.served > 1:
            w.kill()
            w.start()
            self.again = rec.model_type
            return True
        self.done.append(rec)
        v = rec.vllm or VllmData()
        clean = v.answered and not v.stuck
        if more and (not clean or not w.alive()):
            w.kill()
            w.start()
        return False

    def stamp(self) -> dict:
        return stamp()

    def meta(self) -> dict:
        """vLLM's version and the benchmark (said on stderr unless quiet)."""
        bench = summary(self.done, self.worker, time.monotonic() - self.t0)
        if not self.quiet:
            sys.stderr.write("smearcli: " + summary_line(bench) + "\n")
        return {"engine": "vllm", "vllm_version": self.worker.ready.get("vllm"), "vllm_python": self.python,
                "benchmark": bench}

    def close(self) -> None:
        self.worker.close()


def open_session(python: str, quiet: bool = False) -> Session:
    """vLLM's environment checked by its handshake (a UserError when it is not one), then its
    worker started (vLLM imported): the census's fixed cost."""
    from .environment import hello

    said = hello(python)
    t0 = time.monotonic()
    w = Worker(python, zygote=bool(said.get("zygote")))
    w.start()
    s = Session(w, python, quiet)
    s.t0 = t0
    return s


def summary(recs: Sequence[Record], worker: Optional[Worker], wall_s: float) -> dict:
    """The benchmark: wall time, and the time importing vLLM and starting engines, with shares."""
    engines = sum(float(s or 0) for r in recs for s in (r.vllm or VllmData()).engine_start_s or [])
    imports = worker.import_s if worker is not None else 0.0
    share = (lambda x: round(100 * x / wall_s, 1) if wall_s > 0 else None)
    return {"wall_s": round(wall_s, 1), "architectures": len(recs), "vllm_import_s": round(imports, 1),
            "vllm_imports": worker.imports if worker is not None else 0,
            "vllm_workers": worker.starts if worker is not None else 0, "vllm_import_share": share(imports),
            "engine_start_s": round(engines, 1), "engine_start_share": share(engines)}


def summary_line(s: dict) -> str:
    return (f"census on vLLM: {s['architectures']} architectures in {s['wall_s']:g} s; importing vLLM "
            f"{s['vllm_import_s']:g} s ({s['vllm_import_share']}%, {s['vllm_imports']} import(s) for "
            f"{s.get('vllm_workers', s['vllm_imports'])} worker(s)), starting engines "
            f"{s['engine_start_s']:g} s ({s['engine_start_share']}%)")


def _departure(r: Record) -> str:
    """Why a departure is what it is: the prefill note when the one-step path departs too (the
    model, not a cache), else the confirmation's why."""
    said = [n for n in r.notes or [] if n.startswith("prefill")]
    return said[0] if said else (r.confirmation.why if r.confirmation is not None else None) or ""


def sections(recs: Sequence[Record], meta: dict) -> list[str]:
    """The vLLM engine's page (`report.markdown` puts the title and counts above): findings with
    reproducers, what could not run and why, then every architecture."""
    out = []
    found = [r for r in sorted(recs, key=sort_key) if r.verdict in FAILURES or r.upstream]
    if found:
        out += ["## Findings", "", "vLLM has no float64 form, so a departure reads unconfirmed; a crash is "
                "vLLM's own frame. Each reproducer needs only vLLM's environment and exits 1 while the bug is there.",
                "", "| architecture | verdict | schedule | max abs dlogprob | why | upstream | reproducer (exit) |",
                "|---|---|---|---|---|---|---|"]
        for r in found:
            rep = f"`{Path(r.reproducer).name}` ({r.reproducer_status})" if r.reproducer else "-"
            err = "-" if r.max_abs is None else f"{r.max_abs:.2g}"
            out.append(f"| {r.model_type} | {r.verdict} | {r.worst_schedule or '-'} | {err} | "
                       f"{cell(r.reason or _departure(r))} | {known.cell(r)} | {rep} |")
        out.append("")
    skipped = [r for r in sorted(recs, key=lambda r: r.model_type) if r.verdict == SKIP]
    if skipped:
        out += ["## Not run on the CPU backend", "", "| architecture | why |", "|---|---|"]
        out += [f"| {r.model_type} | {cell(r.reason, 200)} |" for r in skipped]
        out.append("")
    out += ["## Every architecture", "", "| architecture | verdict | worst schedule | error | x floor | notes |",
            "|---|---|---|---|---|---|"]
    for r in sorted(recs, key=sort_key):
        err = "-" if r.max_abs is None else f"{r.max_abs:.2g}"
        mult = "-" if r.multiple is None else f"{r.multiple:.2g}"
        notes = "; ".join(r.notes or []) or (r.reason if r.verdict != SKIP else "")
        out.append(f"| {r.model_type} | {r.verdict} | {r.worst_schedule or '-'} | {err} | {mult} | "
                   f"{cell(notes)} |")
    return out

# -- a reproducer per finding -------------------------------------------------------------------

TEMPLATE = '''"""Reproducer: {model_type} ({arch}) in vLLM {version}, CPU, float32.

Schedule {schedule}: {how}. Found by smearcli's census on vLLM: {finding}.
Needs vLLM's environment only (vLLM with its torch and transformers). Exit status: 1 while the
bug is there (vLLM raises, or departs from the full pass in transformers by more than MARGIN x
that pass's float32 rounding), 0 once fixed.
"""
import json
import os
import signal
import sys
import tempfile
import traceback

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
try:
    import vllm  # noqa: F401
except ImportError as e:  # not vLLM's environment: nothing was reproduced (exit 2, not the bug's 1)
    print(f"run this with the Python of vLLM's environment ({{e}})", file=sys.stderr)
    sys.exit(2)
import torch  # noqa: E402
import transformers  # noqa: E402

CONFIG = json.loads({config_json!r})
SCHEDULE = {entry!r}
TOKENS = {tokens!r}
SEED, MARGIN, BLOCK, MAX_LEN = {seed!r}, {margin!r}, {block!r}, {max_len!r}
ONE_ENGINE = {one_engine!r}  # prefix caching on for every schedule, as the census ran it
V = {vocab!r}
STUCK_S = 60  # the whole run in vLLM takes seconds (its import included); past this it is stuck


def save(d):
    cfg = transformers.AutoConfig.for_model(**CONFIG)
    torch.manual_seed(SEED)
    transformers.AutoModelForCausalLM.from_config(cfg).float().eval().save_pretrained(d, safe_serialization=True)


def engine(d, budget=MAX_LEN, caching=False):
    from vllm import LLM

    return LLM(model=d, skip_tokenizer_init=True, dtype="float32", enforce_eager=True, max_logprobs=V,
               kv_cache_memory_bytes=16 << 20, max_model_len=MAX_LEN, block_size=BLOCK, max_num_seqs=1,
               enable_prefix_caching=caching, enable_chunked_prefill=True, max_num_batched_tokens=budget, seed=0)


def generate(llm, ids, max_tokens=1, read_cache=False):
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    sp = SamplingParams(prompt_logprobs=V, logprobs=V, temperature=0.0, max_tokens=max_tokens, ignore_eos=True,
                        skip_reading_prefix_cache=not read_cache)
    (out,) = llm.generate([TokensPrompt(prompt_token_ids=list(ids))], sp, use_tqdm=False)
    return out


def dense(entries):
    row = torch.full((V,), float("nan"))
    for tok, lp in (entries or {{}}).items():
        if 0 <= tok < V:
            row[tok] = lp.logprob
    return row


def positions(out):
    """Log-probs of the token after each position: the prompt's, then each generated token's."""
    rows = [dense(e) for e in (out.prompt_logprobs or [None])[1:]]
    return torch.stack(rows + [dense(e) for e in out.outputs[0].logprobs or []])


def vllm_run(d):
    """(the ids whose next-token log-probs vLLM gave, those log-probs, what ran)."""
    name = SCHEDULE["name"]
    if name == "prefix":
        llm = engine(d, caching=True)
        block = llm.llm_engine.vllm_config.cache_config.block_size  # raised for a hybrid to hold its state
        P = max(block, SCHEDULE["prefix"] // block * block)
        for p in (P, P + 1):  # a hybrid's Mamba state is kept at a block edge inside a prompt only
            llm.reset_prefix_cache()
            first = generate(llm, TOKENS[:p])  # request 1: the prefix, whole blocks of the engine's size
            second = generate(llm, TOKENS, read_cache=True)  # request 2: the whole input, reading them
            if second.num_cached_tokens:
                break
        n = int(second.num_cached_tokens or 0)
        if n == 0:
            sys.exit("vLLM read nothing from the prefix cache: this run checks nothing (exit 2)")
        lp = torch.cat([positions(first)[:n], positions(second)[n:]])  # below n: uninitialised memory
        return TOKENS, lp, f"{{n}} tokens read from the prefix cache"
    if name == "decode":
        llm = engine(d, caching=ONE_ENGINE)
        out = generate(llm, TOKENS[:1], max_tokens=len(TOKENS))
        ids = TOKENS[:1] + list(out.outputs[0].token_ids)[:len(TOKENS) - 1]
        return ids, positions(out), "a one-token prompt, then one token per step"
    budget = SCHEDULE.get("budget", MAX_LEN)
    llm = engine(d, budget=budget, caching=ONE_ENGINE)  # the engine at this budget, then the prompt
    return TOKENS, positions(generate(llm, TOKENS)), f"prefill at max_num_batched_tokens={{budget}}"


def reference(d, ids):
    """The full pass in transformers as log-probs, and its float32 rounding (against float64)."""
    model = transformers.AutoModelForCausalLM.from_pretrained(d).float().eval()
    x = torch.tensor([ids])
    with torch.no_grad():
        lp = model(input_ids=x).logits[0].float().log_softmax(-1)
        lp64 = model.double()(input_ids=x).logits[0].log_softmax(-1)
    floor = max(float((lp.double() - lp64).abs().max()), torch.finfo(torch.float32).eps * float(lp.abs().max()))
    return lp, floor


def main():
    print(f"vLLM, transformers {{transformers.__version__}}, torch {{torch.__version__}}: {model_type!r}, {{SCHEDULE}}")
    with tempfile.TemporaryDirectory() as d:
        save(d)
        signal.signal(signal.SIGALRM, stuck)
        signal.alarm(STUCK_S)  # a request stuck inside vLLM (a step that never returns) is the bug too
        try:
            ids, got, what = vllm_run(d)
        except Exception as e:
            traceback.print_exc()
            print(f"{{SCHEDULE['name']}}: vLLM raised {{type(e).__name__}}: {{e}}")
            print("the bug is there")
            return 1
        signal.alarm(0)
        want, floor = reference(d, ids)
        n = min(len(got), len(want))
        err = float((got[:n] - want[:n]).abs().nan_to_num(float("inf")).max())
        print(f"{{what}}: max |dlogprob| {{err:.3g}} against the full pass in transformers "
              f"({{err / floor:.3g}}x its float32 rounding {{floor:.3g}})")
        bug = err > MARGIN * floor
        print("the bug is there" if bug else "no bug: within the full pass's rounding")
        return 1 if bug else 0


def stuck(signum, frame):
    raise TimeoutError(f"vLLM did not finish in {{STUCK_S}} s")


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    os._exit(code)  # a thread still stuck inside vLLM would keep the interpreter from exiting
'''
HOW = {"prefix": "a first request for a prefix of whole cache blocks, then the whole input reading them "
                 "(prefix caching on)",
       "decode": "a one-token prompt, then every later token generated one per step",
       "prefill": "the whole prompt in one engine step",
       "chunked": "chunked prefill at a token budget (max_num_batched_tokens)"}


def write(rec: Record, config, path: Path, req: dict, seed: int = 0, margin: float = NOISE_MARGIN) -> Path:
    """The reproducer of one finding (`rec`: a record whose `worst_schedule` failed)."""
    worst = rec.worst_schedule
    entry = next(e for e in req["schedules"] if label(e) == worst)
    d = {k: v for k, v in config.to_dict().items() if k not in ("transformers_version", "architectures")}
    finding = rec.reason or f"max |dlogprob| {rec.max_abs or 0:.3g} ({rec.multiple or 0:.3g}x the floor)"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(TEMPLATE.format(
        model_type=rec.model_type, arch=arch_of(rec.model_type), version=rec.vllm_version,
        schedule=worst, how=HOW[entry["name"]], finding=str(finding).replace('"""', "'''")[:300],
        config_json=json.dumps(d, default=str), entry=entry, tokens=req["rows"][0], seed=seed, margin=margin,
        block=req["block_size"], max_len=req["max_model_len"], vocab=req["vocab"],
        one_engine=bool(req.get("one_engine"))), encoding="utf-8")
    return path


def attach(rec: Record, config, repro_dir: Path, worker, seed: int, req: dict, timeout: float) -> None:
    """Write the finding's reproducer beside the others and have vLLM's worker run it (the worker
    runs outside the architecture's memory limit, which vLLM's import alone would pass):
    `reproducer`, `reproducer_status`."""
    path = write(rec, config, Path(repro_dir) / f"{rec.model_type}-vllm.py", req, seed)
    rec.reproducer = str(path)
    try:
        got = worker.ask({"op": "repro", "path": str(path.resolve()), "timeout": timeout}, timeout + 3)
        rec.reproducer_status, rec.reproducer_output = int(got.get("status", -1)), str(got.get("last", ""))
    except WorkerGone as e:
        rec.reproducer_output = str(e)
        rec.vllm = (rec.vllm or VllmData()).but(answered=False)
