"""vLLM as a runner: its own scheduler and caches, in its own environment, through a subprocess.

```python
from smearcli.engines import vllm
runner = vllm.VLLMRunner(vllm.Settings(python="/opt/vllm-env/bin/python", model="tiny-llama/", vocab=256))
result = compare.compare([runner], tokens, ["prefill", "chunked", "prefix"], reference=LogProbs(hf_runner))
```

vLLM pins torch and transformers versions of its own, so it runs in another interpreter
(`Settings.python`): smearcli writes a request (JSON: the model directory, the token ids, what
each schedule sets), `worker.py` (shipped in this package, importing only vLLM and numpy)
runs every schedule once, and the answers come back as `.npy` arrays of full-vocabulary
log-probabilities, never pickles. `VLLMRunner.run` turns them into one `RunResult` per schedule:
log-probs in place of logits and no hidden states, so a comparison of it is on log-probabilities
(the reference, the model's full forward in transformers, goes through `runner.LogProbs`).

What each schedule is in vLLM: prefill, one engine step for the whole prompt; chunked, chunked
prefill at a token budget (`max_num_batched_tokens`) of the first chunk's size, so the steps are
that size and a smaller remainder; decode, a one-token prompt and every later token generated
one per step, forced to the given ones; prefix, a first request for a prefix of whole blocks,
then the whole sequence with `skip_reading_prefix_cache=False` (without it a request for prompt
log-probs never reads the cache). Below `num_cached_tokens` the second request's prompt log-probs
are uninitialised memory: they are dropped here and taken from the first request; a second
request that read nothing (`num_cached_tokens == 0`) checked nothing, and says so. A crash inside
vLLM is that schedule's result (`judge.RAISED`: crashed), as is a worker that dies.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional, Sequence

import torch

from ...util.errors import UserError
from ...measure.runner import PREFIX_CACHE, Described
from ...judging import judge
from ...measure.steps import PREFIX_HIT, RunResult, ScheduleOptions, chunk_plan
from ...impls import foreign
# RAISED: the worker's protocol word for a schedule vLLM raised in (the run's outcome is then judge.RAISED)
from .environment import ENGINE, PROTOCOL, RAISED, WORKER, hello, worker_env

VLLM_SCHEDULES = ("prefill", "decode", "chunked", "prefix")
BLOCK_SIZE = 32  # vLLM's CPU backend takes block sizes that are multiples of 32
ENV_PYTHON = "SMEARCLI_VLLM_PYTHON"


@dataclass(frozen=True)
class Settings:
    python: str  # the interpreter of vLLM's environment
    model: str  # a local model directory (safetensors)
    vocab: int
    dtype: str = "float32"
    device: str = "cpu"  # "cuda" on a GPU machine (vLLM picks its platform by what it was built for)
    tensor_parallel_size: int = 1
    block_size: int = BLOCK_SIZE
    kv_cache_memory_bytes: int = 64 << 20
    timeout_s: float = 1800.0
    stuck_s: float = 120.0  # one request; past it the worker's watchdog interrupts it (the census asks less)
    prefill_decides: bool = False  # the census: a one-step prefill that raises leaves the rest not run
    worker: str = str(WORKER)
    env: dict = field(default_factory=dict)  # extra environment for the worker


def chunk_budget(T: int, opts: ScheduleOptions) -> int:
    """The token budget that makes vLLM chunk `T` tokens as `opts` asks: the first chunk's size.
    vLLM chunks at a fixed budget, so the plan must be equal chunks and at most one smaller last
    one (UserError otherwise, naming the plan)."""
    try:
        plan = chunk_plan(T, opts)
    except ValueError as e:
        raise UserError(str(e)) from None
    b = plan[0]
    fixed = [b] * (T // b) + ([T % b] if T % b else [])
    if plan != fixed:
        raise UserError(f"vLLM chunks a prompt at a fixed token budget, so chunks {','.join(map(str, plan))} "
                        f"cannot be run; give equal chunk sizes (the last may be smaller), e.g. "
                        f"{','.join(map(str, fixed))}")
    return b


def prefix_len(T: int, block: int = BLOCK_SIZE) -> int:
    """The prefix the first request of the prefix schedule covers: whole blocks, leaving at least
    one token for the second request to compute."""
    P = (T - 1) // block * block
    if P < block:
        raise UserError(f"the prefix schedule needs more than one cache block ({block} tokens) of input, "
                        f"got {T} tokens")
    return P


def request(s: Settings, tokens: torch.Tensor, schedules: Sequence[str], opts: ScheduleOptions) -> dict:
    T = tokens.size(1)
    sized = {"chunked": lambda: {"budget": chunk_budget(T, opts)}, "prefix": lambda: {"prefix": prefix_len(T, s.block_size)}}
    return payload(s, tokens, foreign.entries("vllm", VLLM_SCHEDULES, schedules,
                                              lambda name: sized[name]() if name in sized else {}))


def payload(s: Settings, tokens: torch.Tensor, entries: list, one_engine: bool = False) -> dict:
    """The worker's request for `entries` (each schedule's name and its budget or prefix), as both
    `compare --impl vllm` and the census on vLLM send it; `one_engine`: prefix caching on for every
    schedule (one engine start)."""
    T = tokens.size(1)
    max_len = -(-(T + 1) // s.block_size) * s.block_size  # decode generates T tokens after one
    return {"protocol": PROTOCOL, "model": str(Path(s.model).resolve()), "rows": tokens.tolist(), "vocab": s.vocab,
            "dtype": s.dtype, "device": s.device, "tensor_parallel_size": s.tensor_parallel_size,
            "max_model_len": max_len, "block_size": s.block_size,
            "kv_cache_memory_bytes": s.kv_cache_memory_bytes, "one_engine": one_engine, "stuck_s": s.stuck_s,
            "prefill_decides": s.prefill_decides, "schedules": entries}


def garbage(s: Settings, what: str) -> UserError:
    return ENGINE.garbage(s.python, what)


def read_result(s: Settings, path: Path, req: dict) -> dict:
    """result.json, trusted only once it is small, speaks PROTOCOL and names the request's
    schedules with fields of the right types (UserError otherwise: the environment, not the model)."""
    res = foreign.read_json(ENGINE, s.python, path)
    entries = res.get("schedules")
    want = [e["name"] for e in req["schedules"]]
    if not isinstance(entries, list) or [e.get("name") if isinstance(e, dict) else e for e in entries] != want:
        raise garbage(s, f"its schedules are not the {','.join(want)} asked for")
    for e in entries:
        foreign.check_entry(ENGINE, s.python, e, (RAISED,))
        if "prefix" in e and not (type(e["prefix"]) is int and e["prefix"] > 0):
            raise garbage(s, f"{e['name']}: a prefix that is not a count of tokens")
        foreign.check_counts(ENGINE, s.python, e, ("steps", "num_cached_tokens"))
    return res


def call_worker(s: Settings, req: dict, workdir: Path) -> dict:
    """Run the worker on `req`; its result.json (arrays stay in `workdir`). A worker that cannot
    start, or answers outside the protocol, is the user's setup (UserError); one that dies is
    returned as every schedule crashed."""
    hello(s.python, s.worker, s.env)
    (workdir / "request.json").write_text(json.dumps(req, allow_nan=False), encoding="utf-8")
    env = worker_env(s.env)
    start = time.time()
    # its output is capped (the tail of stderr kept, stdout dropped), and it is stopped with us
    rc, err = foreign.spawn([foreign.runnable(s.python), s.worker, str(workdir / "request.json"), str(workdir)], env,
                            s.timeout_s)
    if rc is None:
        err = err + f"\nthe vLLM worker ran past {s.timeout_s:g} s"
    out = workdir / "result.json"
    if rc == 0 and out.is_file():
        res = read_result(s, out, req)
        res["wall_s"] = round(time.time() - start, 2)
        return res
    if rc == 0:  # it said it finished, and left no answer: not the worker smearcli ships
        raise garbage(s, "it exited with status 0 without writing result.json")
    last = [ln for ln in (err or "").splitlines() if ln.strip()][-1:] or ["(no output)"]
    why = f"the vLLM worker exited with status {rc}: {last[0].strip()}" if rc is not None else last[0]
    return {"schedules": [{"name": e["name"], "outcome": RAISED, "message": why} for e in req["schedules"]],
            "died": True, "stderr_tail": (err or "")[-4000:]}


class VLLMRunner(foreign.WholeSchedules):
    """vLLM's runs of the schedules as one series. `run()` calls the worker once, for every
    schedule of the comparison (`schedules`), the first time it is asked; it has no forward pass of
    its own (the reference is another runner: `compare(..., reference=...)`)."""

    label = "vllm"
    words = "vLLM"
    series = "vLLM (its own scheduler, chunked prefill and prefix cache)"
    layers = ("logits",)
    capabilities = frozenset({PREFIX_CACHE})
    runs_itself = frozenset(VLLM_SCHEDULES)

    def __init__(self, settings: Settings, schedules: Sequence[str] = VLLM_SCHEDULES):
        self.settings, self.schedules = settings, [s for s in schedules if s in VLLM_SCHEDULES]
        self.name, self.device = str(settings.model), torch.device("cpu")
        self.dtype = getattr(torch, settings.dtype)
        self.result: Optional[dict] = None

    def describe(self) -> Described:
        return Described(self.label, self.series, self.name, "vLLM", self.settings.dtype, self.settings.device,
                         notes=tuple(self.notes()))

    def notes(self) -> list[str]:
        r = self.result
        if r is None:
            return []
        if r.get("died"):
            return ["vLLM worker died; its last output: " + r["stderr_tail"].strip().splitlines()[-1][:300]
                    if r.get("stderr_tail", "").strip() else "vLLM worker died without output"]
        starts = ", ".join(f"{e['start_s']:g} s" for e in r.get("engines", []))
        return [f"vLLM {r.get('vllm_version')} on {self.settings.device} (tensor parallel "
                f"{self.settings.tensor_parallel_size}): import {r.get('import_s')} s, engine starts {starts}, "
                f"peak memory {r.get('peak_rss_mb')} MB, {r.get('wall_s')} s in all; compared as "
                f"log-probabilities"]

    def collect(self, tokens, options, workdir: Path) -> dict:
        req = request(self.settings, tokens.cpu(), self.schedules, options)
        self.result = call_worker(self.settings, req, workdir)
        return {e["name"]: to_run(e, workdir, tokens.cpu(), req) for e in self.result["schedules"]}


def _load(workdir: Path, name: str, shape: tuple) -> torch.Tensor:
    return foreign.load_array(workdir, name, shape, item_bytes=8)  # vLLM may write float64


def _bad_positions(t: torch.Tensor) -> list[int]:
    return (~torch.isfinite(t)).any(dim=-1).any(dim=0).nonzero().flatten().tolist()


def to_run(entry: dict, workdir: Path, tokens: torch.Tensor, req: dict) -> RunResult:
    """One schedule's answer from the worker as a RunResult (log-probs as its logits)."""
    R, T = tokens.shape
    V, name = req["vocab"], entry["name"]
    rows = list(range(R))

    def unmeasured(outcome, message, steps=()):
        return RunResult(name, "vllm", torch.empty(R, 0, V), None, list(steps), rows, outcome=outcome,
                         message=message)
    if entry.get("outcome"):  # RAISED, the one outcome `read_result` lets through: vLLM raised in it
        return unmeasured(judge.RAISED, entry.get("message", ""), entry.get("steps") or ())
    try:
        if name != "prefix":
            lp = _load(workdir, entry["arrays"]["logprobs"], (R, T, V))
            steps, marks = list(entry["steps"]), {}
        else:
            P = entry.get("prefix") or next(e["prefix"] for e in req["schedules"] if e["name"] == "prefix")
            cold = _load(workdir, entry["arrays"]["cold"], (R, P, V))
            warm = _load(workdir, entry["arrays"]["warm"], (R, T, V))
            cached = [int(n) for n in entry["num_cached_tokens"]]
            if any(n == 0 for n in cached):
                return unmeasured(judge.CHECKED_NOTHING, "vLLM read nothing from the prefix cache (num_cached_tokens 0 "
                                  "on the second request): it ran as a cold prefill and checked nothing", [T])
            if len(set(cached)) > 1 or cached[0] > P:
                return unmeasured(judge.RAISED, f"vLLM reported {','.join(map(str, cached))} cached tokens for a "
                                  f"{P}-token prefix")
            nc = cached[0]
            # below num_cached_tokens the second request's prompt log-probs are uninitialised memory
            lp = torch.cat([cold[:, :nc], warm[:, nc:]], dim=1)
            steps, marks = [nc, T - nc], {PREFIX_HIT: [nc]}
    except (KeyError, ValueError, OSError) as e:
        return unmeasured(judge.RAISED, f"the vLLM worker's answer is unreadable: {e}")
    bad = _bad_positions(lp)
    if bad:
        return unmeasured(judge.RAISED, f"vLLM returned no full-vocabulary log-probs at {len(bad)} positions "
                          f"(first: {bad[0]})", steps)
    return RunResult(name, "vllm", lp, None, steps, rows, marks)
