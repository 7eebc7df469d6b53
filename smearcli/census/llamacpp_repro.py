"""A standalone reproducer per finding of the census on llama.cpp (`smearcli scan --engine llamacpp`).

`write(record, entry, tokens, threshold, gguf_name, path)` writes one Python file that needs
llama.cpp's environment only (llama-cpp-python's low-level bindings and numpy; never smearcli, never
transformers) and the float32 GGUF the census converted, kept beside it. It runs llama.cpp's own
one-call prefill and the failing schedule (micro-batches of one width inside one call, successive
calls, one call per token, a prefix copied with `llama_memory_seq_cp`, drafts removed with
`llama_memory_seq_rm`, two sequences in one call), prints how far the schedule's log-probabilities
are from that prefill's per position, and exits 1 while the bug is there (past the census's
threshold, or llama.cpp dies inside the schedule: the schedule runs in a child process), 0 once
fixed, 2 when nothing could be run. `attach(...)` writes it with its GGUF and runs it once in
llama.cpp's interpreter isolated (`-I`), so the record holds its path and exit status.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

from .record import Record

TEMPLATE = '''"""Reproducer: {model_type} in llama.cpp (llama-cpp-python {version}), CPU, float32 GGUF, float32 KV cache.

Schedule {schedule}: {how}. Found by smearcli's census on llama.cpp: {finding}.
Needs llama.cpp's environment only (llama-cpp-python and numpy) and {gguf} beside this file (the
census's tiny random model, converted at float32). Exit status: 1 while the bug is there (the
schedule's log-probabilities depart from llama.cpp's own one-call prefill by more than THRESHOLD,
or llama.cpp dies inside the schedule), 0 once fixed, 2 when nothing could be run.
"""
import os
import subprocess
import sys

GGUF = os.path.join(os.path.dirname(os.path.abspath(__file__)), {gguf!r})
SCHEDULE = {entry!r}
TOKENS = {tokens!r}
THRESHOLD = {threshold!r}  # the census's tolerance x the float64 noise floor of the transformers full pass
STUCK_S = 120


def child():
    import numpy as np
    import llama_cpp.llama_cpp as L

    quiet = L.llama_log_callback(lambda level, text, data: None)  # kept referenced while llama.cpp may call it
    L.llama_log_set(quiet, None)
    L.llama_backend_init()
    mp = L.llama_model_default_params()
    mp.n_gpu_layers = 0
    model = L.llama_model_load_from_file(GGUF.encode(), mp)
    if not model:
        print("llama.cpp did not load", GGUF)
        return 2
    V = L.llama_vocab_n_tokens(L.llama_model_get_vocab(model))
    T = len(TOKENS)

    def context(n_batch, n_ubatch, n_seq=1, n_rs_seq=0):
        cp = L.llama_context_default_params()
        cp.n_ctx = max(2 * T + 16, 8)
        cp.n_batch, cp.n_ubatch, cp.n_seq_max, cp.n_rs_seq = n_batch, n_ubatch, n_seq, n_rs_seq
        cp.n_threads = cp.n_threads_batch = 1
        cp.type_k = cp.type_v = L.GGML_TYPE_F32  # the cache in float32: the cache's logic, not its precision
        cp.flash_attn_type = L.LLAMA_FLASH_ATTN_TYPE_DISABLED
        cp.kv_unified = True
        return L.llama_init_from_model(model, cp)

    def decode(ctx, items):
        batch = L.llama_batch_init(len(items), 0, 1)
        batch.n_tokens = len(items)
        for i, (tok, pos, seq) in enumerate(items):
            batch.token[i], batch.pos[i], batch.n_seq_id[i], batch.logits[i] = tok, pos, 1, 1
            batch.seq_id[i][0] = seq
        rc = L.llama_decode(ctx, batch)
        if rc != 0:
            raise RuntimeError(f"llama_decode returned {{rc}}")
        out = [np.ctypeslib.as_array(L.llama_get_logits_ith(ctx, i), shape=(V,)).astype(np.float64)
               for i in range(len(items))]
        L.llama_batch_free(batch)
        return out

    items = [(t, p, 0) for p, t in enumerate(TOKENS)]
    ctx = context(T, T)
    one_call = np.stack(decode(ctx, items))
    L.llama_free(ctx)
    name = SCHEDULE["name"]
    if name in ("prefill", "ubatch", "chunked", "decode"):  # prefill: llama.cpp dying in its one call (above)
        sizes = SCHEDULE.get("sizes") or ([1] * T if name == "decode" else [T])
        ctx = context(T if name == "ubatch" else max(sizes), SCHEDULE.get("width") or max(sizes))
        got, pos = [], 0
        for n in sizes:
            got += decode(ctx, items[pos:pos + n])
            pos += n
    elif name == "prefix":
        P = SCHEDULE["prefix"]
        ctx = context(T, T, n_seq=2)
        got = decode(ctx, items[:P])
        L.llama_memory_seq_cp(L.llama_get_memory(ctx), 0, 1, -1, -1)
        got += decode(ctx, [(t, p, 1) for t, p, _ in items[P:]])
    elif name == "rollback":
        k, j, prompt = SCHEDULE["draft"], SCHEDULE["reject"], SCHEDULE["prompt"]
        ctx = context(max(prompt, k), max(prompt, k), n_rs_seq=k)
        got, pos = decode(ctx, items[:prompt]), prompt
        while pos < T:
            n = min(k, T - pos)
            keep = n if n < k else n - j
            draft = TOKENS[pos:pos + keep] + [(t + 1) % V for t in TOKENS[pos + keep:pos + n]]
            got += decode(ctx, [(t, pos + i, 0) for i, t in enumerate(draft)])[:keep]
            if keep < n and not L.llama_memory_seq_rm(L.llama_get_memory(ctx), 0, pos + keep, -1):
                print("llama_memory_seq_rm refused the partial removal: its documented limit, nothing checked")
                return 2
            pos += keep
    elif name == "batched":  # the long sequence, then the short one: each held to the one call's positions
        S = SCHEDULE["short"]
        ctx = context(T + S, T + S, n_seq=2)
        got = decode(ctx, items + [(t, p, 1) for t, p, _ in items[:S]])
        one_call = np.concatenate([one_call, one_call[:S]])
    else:
        print("unknown schedule", name)
        return 2
    L.llama_free(ctx)

    def logprobs(a):
        a = a - a.max(axis=-1, keepdims=True)
        return a - np.log(np.exp(a).sum(axis=-1, keepdims=True))
    diff = np.abs(logprobs(np.stack(got)) - logprobs(one_call)).max(axis=-1)
    beyond = np.nonzero(diff > THRESHOLD)[0]
    where = [("the second sequence's " if i >= T else "") + f"position {{i % T}}" for i in beyond[:1]]
    print(f"{{name}} against llama.cpp's one-call prefill: max |d log-prob| {{diff.max():.3g}} (threshold "
          f"{{THRESHOLD:.3g}})" + (f", first past it at {{where[0]}}" if where else ""))
    print("the bug is there" if len(beyond) else "no bug: the schedule matches the one-call prefill")
    return 1 if len(beyond) else 0


def main():
    try:
        import llama_cpp  # noqa: F401
    except ImportError as e:  # not llama.cpp's environment: nothing was reproduced (exit 2, not the bug's 1)
        print(f"run this with the Python of llama.cpp's environment ({{e}})", file=sys.stderr)
        return 2
    print(f"{model_type}: {{SCHEDULE}}, {{len(TOKENS)}} tokens, {{GGUF}}")
    try:  # the schedule in a child: llama.cpp aborting or crashing in it is the bug too
        p = subprocess.run([sys.executable, "-I", os.path.abspath(__file__), "child"], timeout=STUCK_S,
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    except subprocess.TimeoutExpired:
        print(f"llama.cpp did not finish the schedule in {{STUCK_S}} s")
        print("the bug is there")
        return 1
    sys.stdout.write(p.stdout)
    if p.returncode in (0, 1, 2):
        return p.returncode
    said = [ln for ln in p.stderr.splitlines() if ln.strip()]
    print(f"llama.cpp died in the schedule (status {{p.returncode}})" + (f": {{said[-1][:300]}}" if said else ""))
    print("the bug is there")
    return 1


if __name__ == "__main__":
    sys.exit(child() if sys.argv[1:] == ["child"] else main())
'''
HOW = {"prefill": "llama.cpp's own one-call prefill (one llama_decode of the whole row)",
       "ubatch": "one llama_decode call whose prompt llama.cpp splits into micro-batches of n_ubatch",
       "chunked": "successive llama_decode calls of the sizes given",
       "decode": "one llama_decode call per token",
       "prefix": "a prefix on sequence 0 copied to sequence 1 (llama_memory_seq_cp), the rest decoded on sequence 1",
       "rollback": "drafts whose rejected tokens are removed (llama_memory_seq_rm) and decoded right",
       "batched": "the row and its first tokens as two sequences of one llama_decode call"}


def entry_of(rec: Record, runner, run, T: int) -> dict:
    """The failing schedule as the reproducer runs it: the worker's request entry, with the width
    the census showed (ubatch) or the sizes it ran (chunked)."""
    asked = next(e for e in (runner.result or {}).get("asked", []) if e["name"] == rec.worst_schedule)
    e = {k: v for k, v in asked.items() if k != "widths"}
    if e["name"] == "ubatch":
        w = int(run.steps[0]) if run.steps else int(asked["widths"][0])
        e.update(width=w, sizes=[T])
    return e


def write(rec: Record, entry: dict, tokens: list, threshold: float, gguf_name: str, path: Path, version: str) -> Path:
    finding = rec.reason or rec.verdict
    text = TEMPLATE.format(model_type=rec.model_type, version=version, schedule=entry["name"],
                           how=HOW.get(entry["name"], entry["name"]), finding=str(finding).replace('"""', "'''")[:300],
                           gguf=gguf_name, entry=entry, tokens=tokens, threshold=float(threshold))
    path.parent.mkdir(parents=True, exist_ok=True)
    part = path.with_suffix(".py.part")
    part.write_text(text)
    part.replace(path)
    return path


def run(path: Path, python: str, timeout: float = 300.0) -> tuple[int, str]:
    """(exit status, last line) of a reproducer in llama.cpp's interpreter, isolated (`-I`)."""
    from ..impls.foreign import runnable
    from ..impls.llamacpp.environment import worker_env

    try:
        p = subprocess.run([runnable(python), "-I", str(path)], capture_output=True, text=True, timeout=timeout,
                           stdin=subprocess.DEVNULL, env=worker_env())
    except subprocess.TimeoutExpired:
        return -1, f"timed out after {timeout:g} s"
    lines = [ln for ln in (p.stdout.strip() or p.stderr.strip()).splitlines() if ln.strip()]
    return p.returncode, lines[-1] if lines else ""


def keep_gguf(src: Path, dst: Path) -> None:
    """The GGUF a reproducer reads, beside it (written whole: a copy, then a rename)."""
    part = dst.with_suffix(".gguf.part")
    shutil.copyfile(src, part)
    part.replace(dst)


def attach(rec: Record, c, runner, gguf: Path, repro_dir: Path, python: str) -> None:
    """Write the finding's reproducer and its GGUF into `repro_dir`, run it once: `reproducer`,
    `reproducer_status`, `reproducer_output`."""
    run_ = next((r for r in (c.runs + c.unmeasured if c is not None else []) if r.schedule == rec.worst_schedule),
                None)
    if run_ is None:
        return
    name = f"{rec.model_type}-llamacpp"
    Path(repro_dir).mkdir(parents=True, exist_ok=True)
    keep_gguf(gguf, Path(repro_dir) / f"{name}.gguf")
    threshold = c.tolerance * c.noise.per_layer[-1]
    path = write(rec, entry_of(rec, runner, run_, c.tokens.size(1)), c.tokens[0].tolist(), threshold, f"{name}.gguf",
                 Path(repro_dir) / f"{name}.py", str((runner.result or {}).get("llama_cpp_python")))
    rec.reproducer = str(path)
    rec.reproducer_status, rec.reproducer_output = run(path, python)
