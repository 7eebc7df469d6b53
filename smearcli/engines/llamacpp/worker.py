"""The process that runs llama.cpp for `smearcli.engines.llamacpp`, in llama.cpp's own environment.

It imports only llama-cpp-python's low-level bindings (`llama_cpp.llama_cpp`), numpy, the standard
library and, to write a GGUF, the converter that environment carries beside it
(`share/llamacpp-convert`: llama.cpp's `conversion/` package, with its `gguf`, torch and
transformers); never smearcli. Usage, by the adapter: `PYTHON worker.py REQUEST.json OUTDIR | hello | archs`.

`hello` is the handshake (one JSON line: `worker`, `protocol`, `python`, `llama_cpp_python`,
`gguf`, `torch`, `transformers`, `converter`), made without importing llama.cpp. `archs` prints
`{"worker": ..., "protocol": ..., "archs": [...]}`: the Hugging Face architectures the converter
registers (what `smearcli scan --engine llamacpp` checks).

The request (protocol 1) is JSON: `model` (a Hugging Face model directory, converted here to a
float32 GGUF with a vocabulary-less tokenizer of the config's `vocab_size` dummy entries: tiny
random models have no tokenizer) or `gguf` (a file to load as it is, already checked by smearcli),
`expect_arch` (the config whose architecture the GGUF must have: refused otherwise), `rows` (token
ids, one list per row), `cache_type` ("f32" or "f16", the KV cache's `type_k`/`type_v`),
`f16_too` (also run prefill and decode with llama.cpp's default float16 cache), `spread` (lengths:
one-call prefills of the row's first tokens, each from an empty cache, answered as the entry
`spread`: llama.cpp's own rounding across batch widths, no cached path in it), `threads`,
`device` and `schedules`, each `{"name": ...}`:

- prefill: one `llama_decode` of the whole row, logits at every position (`n_ubatch` >= T);
- ubatch with `widths`: the same one call with `n_ubatch` = each width (micro-batches inside it);
- chunked with `sizes`: successive calls of those sizes;
- decode: one call per token;
- prefix with `prefix`: the first `prefix` tokens on sequence 0, copied to sequence 1
  (`llama_memory_seq_cp`), the rest decoded on sequence 1 in one call;
- rollback with `prompt`, `draft`, `reject`: a prefill of the prompt, then drafts of `draft`
  tokens whose last `reject` are wrong, removed (`llama_memory_seq_rm`) and decoded right
  (with `n_rs_seq` = draft: the recurrent-state snapshots llama.cpp keeps for rollback; where it
  still refuses a partial removal, its documented limit, the schedule is `refused`);
- batched with `short`: the row and its first `short` tokens as two sequences in one call;
- swa with `sizes`: chunked's calls with `swa_full` off (the sliding-window layers keep only their
  window, as llama-server runs them by default);
- mixed with `prompt`, `draft`, `reject`: rollback's drafts, with a one-token step between them that
  is taken back whole (`llama_memory_seq_rm` of all the last call decoded) before the next draft
  redoes its position: single-token and multi-token steps interleaved, as speculative decoding
  runs them, and the last call rejected in full;
- split with `short`: batched's two sequences in a cache that is not unified (llama.cpp's default);
- restore with `prefix`: the first `prefix` tokens decoded, that sequence's state saved to a file
  (`llama_state_seq_save_file`, as a server saves a slot), the context freed, the file loaded
  into a fresh context (`llama_state_seq_load_file`) and the rest decoded there in one call. The
  file is held to what the save said it wrote before it is loaded: one shorter (a full disk) is
  the environment's failure (`environment`, never llama.cpp's crash), and it is removed after;
- shift with `prefix` and `offset`: the first `prefix` tokens decoded at positions `offset` on, every
  cached position then moved back by `offset` (`llama_memory_seq_add`, as context shifting and cache
  reuse move a cache), the rest decoded at the positions a one-call prefill gives them; `refused`
  where llama.cpp says the memory cannot shift (`llama_memory_can_shift`), `inapplicable` for a
  model that embeds absolute positions (no shift can move what its cache holds);
- flash with `sizes`: chunked's calls with flash attention on (llama.cpp's default where the
  backend has it), beside a one-call prefill with flash attention on, its own reference
  (`reference`): on the CPU flash attention rounds through float16, so it departs from the
  float32 one-call prefill by design.

Each schedule gets a fresh context. The answer is OUTDIR/result.json, rewritten (atomically)
after every schedule, with `running` naming the one under way: a worker that dies inside
llama.cpp (an abort, a segfault) leaves what finished and which schedule it died in, and the
adapter starts a fresh worker for the rest. Arrays are float32 `.npy` logits (never pickles).
A watchdog thread ends the process (status 3) when one schedule passes `stuck_s`; llama.cpp's
abort callback stops a decode that runs past it first where it can.
"""

import collections
import faulthandler
import json
import os
import resource
import sys
import threading
import time

# run as a script, this file's directory comes first on sys.path: the sibling below is found there
from worker_convert import absolute_positions, convert, converter_dir, gguf_arch, registered  # noqa: E402

PROTOCOL = 1
RAISED, REFUSED, ENVIRONMENT, INAPPLICABLE = "raised", "refused", "environment", "inapplicable"
STUCK_EXIT = 3
DEADLINE = [float("inf")]  # when the schedule running now counts as stuck


def versions() -> dict:
    import importlib.metadata

    names = {}
    for d in importlib.metadata.distributions():
        try:
            names[d.metadata["Name"].lower().replace("_", "-")] = d.version
        except Exception:
            continue
    return names


def hello() -> None:
    """Who this is, and the versions it would run, without importing llama.cpp."""
    import platform

    v = versions()
    conv = converter_dir()
    print(json.dumps({"worker": "smearcli-llamacpp", "protocol": PROTOCOL, "python": platform.python_version(),
                      "llama_cpp_python": v.get("llama-cpp-python"), "gguf": v.get("gguf"),
                      "torch": v.get("torch"), "transformers": v.get("transformers"),
                      "converter": conv if os.path.isfile(os.path.join(conv, "convert_hf_to_gguf.py")) else None}),
          flush=True)


# -- llama.cpp --------------------------------------------------------------------------------

class Engine:
    """One loaded model and the contexts each schedule makes on it."""

    def __init__(self, path: str, req: dict):
        import numpy as np
        import llama_cpp.llama_cpp as L

        self.L, self.np, self.req = L, np, req
        self.log = collections.deque(maxlen=40)  # llama.cpp's last log lines: a refusal's reason

        def keep(level, text, data):
            line = (text or b"").decode(errors="replace").rstrip()
            if line:
                self.log.append(line)
                sys.stderr.write(line + "\n")
        self._log = L.llama_log_callback(keep)  # referenced here so ctypes keeps it alive
        L.llama_log_set(self._log, None)
        L.llama_backend_init()
        mp = L.llama_model_default_params()
        mp.n_gpu_layers = 999 if req.get("device") == "cuda" else 0
        t = time.time()
        self.model = L.llama_model_load_from_file(path.encode(), mp)
        if not self.model:
            said = [ln for ln in self.log if "error" in ln.lower()] or [ln for ln in self.log if "fail" in ln]
            raise RuntimeError("llama.cpp did not load the GGUF (llama_model_load_from_file returned NULL"
                               + (f": {said[0].strip()[:300]})" if said else ")"))
        self.load_s = round(time.time() - t, 2)
        self.vocab = int(L.llama_vocab_n_tokens(L.llama_model_get_vocab(self.model)))
        self.recurrent = bool(L.llama_model_is_recurrent(self.model))
        self.hybrid = bool(L.llama_model_is_hybrid(self.model))
        self.path = path
        self._abort = L.ggml_abort_callback(lambda data: time.time() > DEADLINE[0])
        self.outdir = "."

    def context(self, n_ctx: int, n_batch: int, n_ubatch: int, n_seq: int = 1, cache: str = "f32",
                n_rs_seq: int = 0, unified: bool = True, swa_full: bool = True, flash: bool = False):
        L = self.L
        cp = L.llama_context_default_params()
        cp.n_ctx = max(n_ctx, 8)
        cp.n_batch, cp.n_ubatch = n_batch, n_ubatch
        cp.n_seq_max = n_seq
        cp.n_rs_seq = n_rs_seq
        cp.n_threads = cp.n_threads_batch = int(self.req.get("threads") or 1)
        if cache == "f32":  # else llama.cpp's default (float16)
            cp.type_k = cp.type_v = L.GGML_TYPE_F32
        # llama.cpp's default is "auto" (on where the backend has it): the flash schedules name it
        cp.flash_attn_type = L.LLAMA_FLASH_ATTN_TYPE_ENABLED if flash else L.LLAMA_FLASH_ATTN_TYPE_DISABLED
        cp.kv_unified = unified  # llama.cpp's default is not unified: the split schedule runs that
        cp.swa_full = swa_full  # False: the sliding-window layers keep only their window (the swa schedule)
        cp.no_perf = True
        cp.abort_callback = self._abort
        ctx = L.llama_init_from_model(self.model, cp)
        if not ctx:
            raise RuntimeError("llama.cpp did not make a context (llama_init_from_model returned NULL)")
        return ctx

    def free(self, ctx) -> None:
        self.L.llama_free(ctx)

    def decode(self, ctx, items) -> list:
        """One llama_decode of `items` [(token, pos, seq)], logits at every one; their logits."""
        L, np = self.L, self.np
        n = len(items)
        batch = L.llama_batch_init(n, 0, 1)
        try:
            batch.n_tokens = n
            for i, (tok, pos, seq) in enumerate(items):
                batch.token[i], batch.pos[i], batch.n_seq_id[i] = int(tok), int(pos), 1
                batch.seq_id[i][0] = int(seq)
                batch.logits[i] = 1
            rc = L.llama_decode(ctx, batch)
            if rc == 2:
                raise RuntimeError(f"llama.cpp did not finish the schedule in {self.req.get('stuck_s') or 300:g} s "
                                   "(llama_decode returned 2: aborted by the watchdog's abort callback)")
            if rc != 0:
                why = {1: "no memory slot for the batch", -1: "invalid input batch"}.get(rc, "fatal error")
                raise RuntimeError(f"llama_decode returned {rc} ({why})")
            out = []
            for i in range(n):
                p = L.llama_get_logits_ith(ctx, i)
                if not p:
                    raise RuntimeError(f"llama_get_logits_ith({i}) returned NULL")
                out.append(np.ctypeslib.as_array(p, shape=(self.vocab,)).astype(np.float32, copy=True))
            return out
        finally:
            L.llama_batch_free(batch)


def run_schedule(eng: Engine, s: dict, row: list, cache: str) -> dict:
    """One schedule on one row: {"logits": (T', V) array or arrays by key, "steps": [...], ...}."""
    np, L, T = eng.np, eng.L, len(row)
    name, room = s["name"], T + int(s.get("draft") or 0) + 8
    items = [(t, p, 0) for p, t in enumerate(row)]
    if name in ("prefill", "decode", "chunked", "swa"):
        sizes = [T] if name == "prefill" else [1] * T if name == "decode" else [int(n) for n in s["sizes"]]
        return {"logits": successive(eng, items, sizes, room, cache, swa_full=name != "swa"), "steps": sizes}
    if name == "spread":  # one-call prefills of the first L tokens, each in a fresh context: no cache read
        arrays = {str(n): successive(eng, items[:int(n)], [int(n)], room, cache) for n in s["lengths"]}
        return {"by_width": arrays, "steps": [int(n) for n in s["lengths"]]}
    if name == "ubatch":
        arrays = {}
        for w in s["widths"]:
            ctx = eng.context(room, T, int(w), cache=cache)
            try:
                arrays[str(w)] = np.stack(eng.decode(ctx, items))
            finally:
                eng.free(ctx)
        return {"by_width": arrays, "steps": [T]}
    if name == "prefix":
        P = int(s["prefix"])
        ctx = eng.context(room, T, T, n_seq=2, cache=cache)
        try:
            first = eng.decode(ctx, items[:P])
            L.llama_memory_seq_cp(L.llama_get_memory(ctx), 0, 1, -1, -1)
            second = eng.decode(ctx, [(t, p, 1) for t, p, _ in items[P:]])
        finally:
            eng.free(ctx)
        return {"logits": np.stack(first + second), "steps": [P, T - P]}
    if name in ("rollback", "mixed"):
        k, j, prompt = int(s["draft"]), int(s["reject"]), int(s["prompt"])
        ctx = eng.context(room, max(prompt, k), max(prompt, k), cache=cache, n_rs_seq=k)
        try:
            n_rs = int(L.llama_n_rs_seq(ctx))
            out, steps, cuts = eng.decode(ctx, items[:prompt]), [prompt], []
            pos, vocab = prompt, max(max(row) + 1, 2)
            while pos < T:
                # mixed: every other step a single token taken back whole (a verify step whose every token
                # is rejected), then the next draft redoes that position
                single = name == "mixed" and len(steps) % 2 == 0
                n = 1 if single else min(k, T - pos)
                keep = 0 if single else n if n < k else n - j
                draft = [t for t, _, _ in items[pos:pos + n]]
                draft = draft[:keep] + [(t + 1) % vocab for t in draft[keep:]]
                got = eng.decode(ctx, [(t, pos + i, 0) for i, t in enumerate(draft)])
                steps.append(n)
                out += got[:keep]
                if keep < n:
                    if not L.llama_memory_seq_rm(L.llama_get_memory(ctx), 0, pos + keep, -1):
                        kind = "hybrid" if eng.hybrid else "recurrent" if eng.recurrent else "its"
                        return {"refused": f"llama_memory_seq_rm refused to remove positions {pos + keep}.. "
                                f"(a partial removal) from the {kind} memory (n_rs_seq {k} asked, {n_rs} kept for "
                                "this architecture): llama.cpp's documented limit (\"Returns false if a partial "
                                "sequence cannot be removed\")",
                                "steps": steps}
                    cuts.append(pos + keep)
                pos += keep
        finally:
            eng.free(ctx)
        return {"logits": np.stack(out), "steps": steps, "cuts": cuts, "n_rs_seq": n_rs}
    if name == "restore":
        return restore(eng, items, int(s["prefix"]), room, cache)
    if name == "shift":
        return shift(eng, items, int(s["prefix"]), int(s["offset"]), room, cache)
    if name == "flash":  # its chunked calls and, as its reference, its own one-call prefill
        sizes = [int(n) for n in s["sizes"]]
        return {"reference": successive(eng, items, [T], room, cache, flash=True),
                "logits": successive(eng, items, sizes, room, cache, flash=True), "steps": sizes}
    if name in ("batched", "split"):
        S = int(s["short"])
        ctx = eng.context(2 * room, T + S, T + S, n_seq=2, cache=cache, unified=name == "batched")
        try:
            got = eng.decode(ctx, items + [(t, p, 1) for t, p, _ in items[:S]])
        finally:
            eng.free(ctx)
        # row 0: the long sequence; row 1: the short one, then the long one's positions after it
        return {"rows": np.stack([np.stack(got[:T]), np.stack(got[T:] + got[S:T])]), "steps": [T + S]}
    raise ValueError(f"unknown schedule {name!r}")


def successive(eng: Engine, items: list, sizes: list, room: int, cache: str, **how):
    """The logits (T, V) of `items` decoded in successive calls of `sizes` in one fresh context
    (`how`: the context's settings, `Engine.context`)."""
    ctx = eng.context(room, max(sizes), max(sizes), cache=cache, **how)
    try:
        out, pos = [], 0
        for n in sizes:
            out += eng.decode(ctx, items[pos:pos + n])
            pos += n
    finally:
        eng.free(ctx)
    return eng.np.stack(out)


def shift(eng: Engine, items: list, P: int, k: int, room: int, cache: str) -> dict:
    """The shift schedule (module docstring)."""
    L, T = eng.L, len(items)
    if absolute_positions(eng.path):
        return {"inapplicable": "the model adds a learned embedding of each absolute position (position_embd): "
                                "what its cache holds was computed at those positions, and no shift can move it"}
    ctx = eng.context(room + k, T, T, cache=cache)
    try:
        mem = L.llama_get_memory(ctx)
        if not L.llama_memory_can_shift(mem):
            return {"refused": "llama_memory_can_shift says this model's memory cannot shift its positions "
                               "(llama.cpp aborts a K-shift it cannot do): its documented limit", "steps": [P]}
        first = eng.decode(ctx, [(t, p + k, seq) for t, p, seq in items[:P]])
        L.llama_memory_seq_add(mem, 0, -1, -1, -k)
        second = eng.decode(ctx, items[P:])
    finally:
        eng.free(ctx)
    return {"logits": eng.np.stack(first + second), "steps": [P, T - P]}


def restore(eng: Engine, items: list, P: int, room: int, cache: str) -> dict:
    """The restore schedule (module docstring): its logits, or {"environment": why} when the state
    file on disk is not what the save wrote."""
    import ctypes

    np, L, T = eng.np, eng.L, len(items)
    state = os.path.join(eng.outdir, "state.bin")
    ids = [t for t, _, _ in items[:P]]
    try:
        ctx = eng.context(room, T, T, cache=cache)
        try:
            first = eng.decode(ctx, items[:P])
            need = int(L.llama_state_seq_get_size(ctx, 0))
            wrote = int(L.llama_state_seq_save_file(ctx, state.encode(), 0, (ctypes.c_int32 * P)(*ids), P))
        finally:
            eng.free(ctx)
        on_disk = os.path.getsize(state) if os.path.isfile(state) else 0
        if wrote and on_disk != wrote:
            return {"environment": f"the state file state.bin in the worker's temporary directory holds {on_disk} "
                                   f"of the {wrote} bytes llama_state_seq_save_file wrote: torn (is the disk full?); "
                                   "nothing was restored"}
        if not wrote:
            free = os.statvfs(eng.outdir)
            if free.f_bavail * free.f_frsize < need + 65536:
                return {"environment": "llama_state_seq_save_file wrote nothing to the worker's temporary directory: "
                                       f"{free.f_bavail * free.f_frsize} bytes free, the state needs about {need}"}
            said = [ln for ln in eng.log if "state" in ln.lower()]
            raise RuntimeError("llama_state_seq_save_file returned 0" + (f" ({said[-1].strip()[:200]})" if said else ""))
        ctx = eng.context(room, T, T, cache=cache)  # a fresh context, as a server restoring a saved slot
        try:
            got, n_got = (ctypes.c_int32 * T)(), ctypes.c_size_t(0)
            read = int(L.llama_state_seq_load_file(ctx, state.encode(), 0, got, T, ctypes.byref(n_got)))
            if read != wrote:
                said = [ln for ln in eng.log if "state" in ln.lower()]
                raise RuntimeError(f"llama_state_seq_load_file read {read} of the {wrote} bytes it was given whole"
                                   + (f" ({said[-1].strip()[:200]})" if said else ""))
            if list(got[:n_got.value]) != ids:
                raise RuntimeError(f"llama_state_seq_load_file restored {n_got.value} tokens, not the {P} saved")
            second = eng.decode(ctx, items[P:])
        finally:
            eng.free(ctx)
    finally:
        if os.path.exists(state):
            os.remove(state)
    return {"logits": np.stack(first + second), "steps": [P, T - P]}


def write_result(outdir: str, result: dict) -> None:
    path = os.path.join(outdir, "result.json")
    with open(path + ".part", "w") as f:
        json.dump(result, f, indent=1, allow_nan=False)
    os.replace(path + ".part", path)


def crash_message(e: BaseException) -> str:
    import traceback

    tb = traceback.extract_tb(e.__traceback__)
    where = f" (at {os.path.basename(tb[-1].filename)}:{tb[-1].lineno} in {tb[-1].name})" if tb else ""
    text = str(e).splitlines()[0] if str(e) else ""
    return f"{type(e).__name__}: {text}{where}"


def watchdog(stuck_s: float, outdir: str) -> None:
    """End the process when a schedule passes its deadline by a margin (the abort callback had
    its chance): status STUCK_EXIT, result.json still naming the schedule it was in."""
    def loop():
        while True:
            time.sleep(0.5)
            if time.time() > DEADLINE[0] + max(5.0, stuck_s / 10):
                os._exit(STUCK_EXIT)
    threading.Thread(target=loop, name="smearcli-watchdog", daemon=True).start()


def main(request_path: str, outdir: str) -> None:
    with open(request_path) as f:
        req = json.load(f)
    if req.get("protocol") != PROTOCOL:
        sys.exit(f"smearcli's llama.cpp worker speaks protocol {PROTOCOL}, the request {req.get('protocol')!r}")
    faulthandler.enable()  # a segfault inside llama.cpp prints the Python frame that called it
    stuck_s = float(req.get("stuck_s") or 300)
    watchdog(stuck_s, outdir)
    t0 = time.time()
    v = versions()
    result = {"protocol": PROTOCOL, "llama_cpp_python": v.get("llama-cpp-python"), "schedules": [],
              "running": None}
    prev = os.path.join(outdir, "result.json")
    if os.path.isfile(prev):  # a restart after a worker died: keep what finished
        with open(prev) as f:
            old = json.load(f)
        result.update({k: old[k] for k in ("convert", "arch", "gguf", "vocab", "load_s", "recurrent", "hybrid",
                                           "schedules", "restarts") if k in old})
        result["restarts"] = result.get("restarts", 0) + 1
        result["running"] = None
    path = req.get("gguf")
    if not path:
        path = os.path.join(outdir, "model.gguf")
        if not os.path.isfile(path):
            result["running"] = "convert"
            write_result(outdir, result)
            try:
                result["convert"] = convert(req["model"], path)
            except (Exception, SystemExit) as e:
                result["running"], result["not_built"] = None, "llama.cpp's converter: " + crash_message(e)
                write_result(outdir, result)
                return
    elif req.get("expect_arch"):
        try:
            _, want = gguf_arch(req["expect_arch"])
        except (Exception, SystemExit) as e:
            want, result["arch_unknown"] = None, crash_message(e)
        result["expect_arch"] = want
        if want and req.get("gguf_arch") and want != req["gguf_arch"]:  # before llama.cpp sees the file
            result["arch_mismatch"] = [want, req["gguf_arch"]]
            write_result(outdir, result)
            return
    result["gguf"] = path
    result["running"] = "load"
    write_result(outdir, result)
    try:
        eng = Engine(path, req)
    except Exception as e:
        result["running"], result["not_built"] = None, crash_message(e)
        write_result(outdir, result)
        return
    eng.outdir = outdir  # where the restore schedule's state file lives while it runs
    result.update(vocab=eng.vocab, load_s=eng.load_s, recurrent=eng.recurrent, hybrid=eng.hybrid)
    done = {e["name"] for e in result["schedules"]}
    jobs = [(s, req.get("cache_type", "f32"), "") for s in req["schedules"]]
    if req.get("f16_too"):
        jobs += [({"name": n}, "f16", "_f16") for n in ("prefill", "decode")]
    if req.get("spread"):
        jobs.append(({"name": "spread", "lengths": req["spread"]}, req.get("cache_type", "f32"), ""))
    for i, (s, cache, suffix) in enumerate(jobs):
        key = s["name"] + suffix
        if key in done:
            continue
        entry = {"name": key, "outcome": None, "message": "", "arrays": {}}
        result["running"] = key
        write_result(outdir, result)
        t = time.time()
        DEADLINE[0] = t + stuck_s
        try:
            per_row = [run_schedule(eng, s, row, cache) for row in req["rows"]]
            entry["steps"] = per_row[0].get("steps", [])
            refused = next((r["refused"] for r in per_row if "refused" in r), None)
            broken = next((r["environment"] for r in per_row if "environment" in r), None)
            moot = next((r["inapplicable"] for r in per_row if "inapplicable" in r), None)
            if broken:  # the machine's failure (a torn file), not llama.cpp's: the adapter stops on it
                entry.update(outcome=ENVIRONMENT, message=broken)
            elif refused:
                entry.update(outcome=REFUSED, message=refused)
            elif moot:
                entry.update(outcome=INAPPLICABLE, message=moot)
            elif "by_width" in per_row[0]:
                for w in per_row[0]["by_width"]:
                    f = f"{i}-{key}-{w}.npy"
                    eng.np.save(os.path.join(outdir, f), eng.np.stack([r["by_width"][w] for r in per_row]))
                    entry["arrays"][w] = f
            else:
                f = f"{i}-{key}.npy"
                arr = (eng.np.concatenate([r["rows"] for r in per_row]) if "rows" in per_row[0]
                       else eng.np.stack([r["logits"] for r in per_row]))
                eng.np.save(os.path.join(outdir, f), arr)
                entry["arrays"]["logits"] = f
                if "reference" in per_row[0]:  # the flash schedule's own one-call prefill
                    f = f"{i}-{key}-reference.npy"
                    eng.np.save(os.path.join(outdir, f), eng.np.stack([r["reference"] for r in per_row]))
                    entry["arrays"]["reference"] = f
                for k in ("cuts", "n_rs_seq"):
                    if k in per_row[0]:
                        entry[k] = per_row[0][k]
        except Exception as e:  # llama.cpp's failure: this schedule's result
            entry.update(outcome=RAISED, message=crash_message(e), arrays={})
        finally:
            DEADLINE[0] = float("inf")
        entry["wall_s"] = round(time.time() - t, 3)
        result["schedules"].append(entry)
    result["running"] = None
    result["peak_rss_mb"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)
    result["total_s"] = round(time.time() - t0, 2)
    write_result(outdir, result)


# -- the fork server -------------------------------------------------------------------------

def warm_imports() -> None:
    """What every worker imports, imported once by the fork server."""
    import numpy  # noqa: F401
    import llama_cpp.llama_cpp  # noqa: F401
    from worker_convert import load_models

    load_models()


def serve(sock_path: str, warm=warm_imports, run=None) -> None:
    """`worker.py serve SOCKET`: a census's fork server. Starting Python and importing torch, the
    converter and llama.cpp's bindings costs seconds; the work of one tiny model, a fraction of one.
    This process pays the imports once, listens on the Unix socket SOCKET and forks, for each
    connection, a monitor that forks the worker proper: a fresh process as far as the model goes
    (its own address space, its own session: an abort inside llama.cpp takes only it), already past
    the imports. The connection carries one JSON line {"argv": [REQUEST, OUTDIR], "cwd": ...} with
    the file descriptor the worker's stderr goes to; the monitor answers {"pid": ...} once the
    worker runs and {"rc": ...} when it ends (negative: the signal that ended it, as subprocess
    says). A connection closed early (the caller stopped) kills the worker. The server ends when
    its stdin closes (the census that started it is gone). `warm` and `run` (the imports and the
    worker's `main`) are parameters so that a stand-in of llama.cpp's environment serves its own."""
    import select
    import socket

    warm()  # the imports every worker pays, paid here once
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    srv.bind(sock_path)
    srv.listen(16)
    print(json.dumps({"worker": "smearcli-llamacpp", "protocol": PROTOCOL, "serving": sock_path}), flush=True)
    while True:
        ready, _, _ = select.select([srv, sys.stdin], [], [], 1.0)
        while True:  # reap the monitors that finished
            try:
                pid, _ = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                break
        if sys.stdin in ready and not os.read(sys.stdin.fileno(), 4096):
            os._exit(0)
        if srv in ready:
            conn, _ = srv.accept()
            if os.fork() == 0:
                srv.close()
                monitor(conn, run or main)
            conn.close()


def monitor(conn, run) -> None:
    """The fork server's child for one connection (`serve`): fork the worker, report its pid and
    its exit status; never returns."""
    import select
    import socket
    import signal

    try:
        msg, fds, _, _ = socket.recv_fds(conn, 1 << 16, 1)
        ask = json.loads(msg.decode())
        request_path, outdir = ask["argv"]
    except Exception:
        os._exit(2)
    pid = os.fork()
    if pid == 0:  # the worker proper
        conn.close()
        os.setsid()  # its own session: the caller stops it and whatever it started with one signal
        devnull = os.open(os.devnull, os.O_RDWR)
        os.dup2(devnull, 0)
        os.dup2(devnull, 1)
        os.dup2(fds[0], 2)
        os.chdir(ask.get("cwd") or "/")
        code = 0
        try:
            run(request_path, outdir)
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else 1
            if not isinstance(e.code, int) and e.code is not None:
                sys.stderr.write(f"{e.code}\n")
        except BaseException:
            import traceback

            traceback.print_exc()
            code = 1
        sys.stderr.flush()
        os._exit(code)
    os.close(fds[0])
    conn.sendall((json.dumps({"pid": pid}) + "\n").encode())
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            try:
                conn.sendall((json.dumps({"rc": os.waitstatus_to_exitcode(status)}) + "\n").encode())
            except OSError:
                pass
            os._exit(0)
        ready, _, _ = select.select([conn], [], [], 0.05)
        if ready and not conn.recv(1):  # the caller is gone or stopped waiting: the worker goes too
            try:
                os.killpg(pid, signal.SIGKILL)
            except OSError:
                pass
            os.waitpid(pid, 0)
            os._exit(0)


if __name__ == "__main__":
    if sys.argv[1:] == ["hello"]:
        hello()
    elif len(sys.argv) == 3 and sys.argv[1] == "serve":
        serve(sys.argv[2])
    elif sys.argv[1:] == ["archs"]:
        print(json.dumps({"worker": "smearcli-llamacpp", "protocol": PROTOCOL, "archs": registered()}), flush=True)
    elif len(sys.argv) != 3:
        sys.exit("usage: worker.py REQUEST.json OUTDIR | hello | archs | serve SOCKET")
    else:
        main(sys.argv[1], sys.argv[2])
