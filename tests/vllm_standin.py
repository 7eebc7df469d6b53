"""A stand-in for smearcli/engines/vllm/worker.py: speaks its protocol, computes with transformers.

`tests/impls/test_vllm.py` runs it as the "vLLM interpreter" (a two-line shell script calling this file
with the worker's arguments), so the adapter is tested without vLLM. Every log-prob is the model's
full forward in transformers, computed here independently of smearcli, as vLLM's would be; the
mode (env SMEARCLI_STANDIN_MODE) makes it misbehave as vLLM can:

- good: the prefix schedule's second request returns garbage below num_cached_tokens (-9e23,
  as real vLLM's uninitialised memory), as vLLM does;
- nocache: the second request reads nothing from the prefix cache (num_cached_tokens 0);
- crash: the prefix schedule raises inside "vLLM" (an IndexError, as Mamba2's does);
- bigblock: the engine's block is 64 tokens (vLLM raises a hybrid model's block to hold its Mamba
  state), so the prefix request covers whole blocks of 64 and says so (`prefix`);
- die: the worker exits with status 1 before answering;
- skew: chunked's log-probs are off at the first chunk start (a chunk-boundary bug);
- garbage: result.json is not JSON; oldproto: it speaks protocol 0; silent: the worker exits 0
  without writing result.json (each answers the handshake first, as a broken worker would).
- refuse: every schedule raises at the model's first forward with the words vLLM 0.32.0's CPU
  build says of a head size its attention lacks (measured on a tiny Llama with head_dim 16: the
  engine starts, `cpu_attn_get_scheduler_metadata` raises); noengine (below) is the same refusal
  at the engine's start; abort: the process dies by SIGABRT after C++'s `terminate` message, as
  an exception thrown across vLLM's C++ kernels ends it.

`hello` answers the worker's handshake (protocol 2, vLLM "stand-in") before anything heavy is
imported. It copies the request it got to $SMEARCLI_STANDIN_SEEN, when set, for the tests to read.

`serve` is the census's mode (`smearcli scan --engine vllm`): a ready line, then one answer line
per job on stdin, as the worker's. `archs` answers $SMEARCLI_STANDIN_ARCHS (comma-separated; a
default list otherwise). The mode of one model comes from $SMEARCLI_STANDIN_PLAN, a JSON object
{model_type: mode} (the model's config.json names it), over $SMEARCLI_STANDIN_MODE; the census's
extra modes: hang (sleeps), exit (the whole process exits mid-request), noengine (the engine does
not start), noprefill (every schedule raises: a kernel the CPU build lacks), stale (the engine is refused in a
process that served another model first, for the parallel state it left), refused (the same, by vLLM's
config validation: the model's own), stuck (the first chunked schedule stuck inside "vLLM", the rest
skipped, as the worker's watchdog answers), hog (allocates memory until killed), spread (every schedule off at one position: a
departure that vLLM has no float64 rerun for).
"""

import json
import os
import shutil
import sys

GARBAGE = -9e23


def logprobs(model, rows):
    import torch

    with torch.no_grad():
        out = model(input_ids=torch.tensor(rows), use_cache=False).logits
    return out.double().log_softmax(-1).float().numpy()


PROTOCOL = 2
ARCHS = "LlamaForCausalLM,Qwen2ForCausalLM,MistralForCausalLM,Mamba2ForCausalLM,NoSuchForCausalLM"


def mode_of(req):
    plan = json.loads(os.environ.get("SMEARCLI_STANDIN_PLAN") or "{}")
    try:
        model_type = json.load(open(os.path.join(req["model"], "config.json"))).get("model_type")
    except OSError:
        model_type = None
    return plan.get(model_type, os.environ.get("SMEARCLI_STANDIN_MODE", "good"))


def main(request_path, outdir):
    req = json.load(open(request_path))
    if os.environ.get("SMEARCLI_STANDIN_SEEN"):
        shutil.copy(request_path, os.environ["SMEARCLI_STANDIN_SEEN"])
    run_request(req, outdir, mode_of(req))


READY = {"ready": True, "protocol": PROTOCOL, "vllm": "stand-in", "import_s": 0.0}
PROCESS_MODES = ("hang", "exit", "hog")  # what only a separate process can do: `serve` alone has them


def answer(job, served):
    """The answer (without its id) to one job of the serve protocol, from a process that has
    served `served` models before it."""
    if job.get("op") == "archs":
        archs = os.environ.get("SMEARCLI_STANDIN_ARCHS") or ARCHS
        return {"archs": archs.split(",")}
    if job.get("op") == "repro":
        import subprocess

        p = subprocess.run([sys.executable, "-I", job["path"]], capture_output=True, text=True)
        lines = (p.stdout.strip() or p.stderr.strip()).splitlines()
        return {"status": p.returncode, "last": lines[-1] if lines else ""}
    req = json.load(open(job["request"]))
    mode = mode_of(req)
    if mode in ("stale", "refused"):  # refused only by a process that served another model first
        mode = mode + "-engine" if served else "good"
    return {"result": run_request(req, job["outdir"], mode)}


class InProcess:
    """The stand-in as a `engines.vllm.serve.Worker` in the caller's own process: no interpreter
    to start, nothing to import again. What `engines.vllm.session.check` and `engines.vllm.session.Session` ask of a
    worker (`ask`, `ready`, the counters, `alive`/`kill`/`start`); the modes that need a process
    of their own (hang, exit, hog) are `serve`'s, tested on the real `Worker`. As in the real
    worker, a model counts as served by this "process" through `served`, which the census
    increments and `start` resets (a forked check sees the count its parent had)."""

    python = "stand-in (in process)"

    def __init__(self):
        self.ready, self.import_s, self.starts, self.served, self.live = dict(READY), 0.0, 1, 0, True

    def ask(self, job, timeout, memory=None):
        return answer(job, self.served)

    def alive(self):
        return self.live

    def kill(self):
        self.live = False

    def start(self):
        self.live, self.starts, self.served = True, self.starts + 1, 0
        return self.ready

    def ensure(self):
        if not self.live:
            self.start()

    def close(self):
        self.live = False


def serve():
    import time

    served = 0
    print(json.dumps(READY), flush=True)
    for line in sys.stdin:
        job = json.loads(line)
        if job.get("op") not in ("archs", "repro"):
            mode = mode_of(json.load(open(job["request"])))
            if mode == "hang":
                time.sleep(3600)
            if mode == "exit":
                print("Fatal Python error: Aborted (stand-in)", file=sys.stderr, flush=True)
                os._exit(134)
            if mode == "hog":
                hog = []
                while True:
                    hog.append(b"\x01" * (64 << 20))  # written, so resident
                    time.sleep(0.01)
        out = answer(job, served)
        served += "result" in out
        print(json.dumps({"id": job["id"], **out}), flush=True)


def run_request(req, outdir, mode):
    if mode == "abort":
        print("terminate called after throwing an instance of 'c10::Error'\n  what():  Unsupported CPU attention "
              "configuration: head_dim=16 isa=2 kv_cache_idx=0", file=sys.stderr, flush=True)
        os.abort()
    if mode == "die":
        print("Fatal Python error: Segmentation fault (stand-in)", file=sys.stderr)
        sys.exit(1)
    if mode == "silent":
        sys.exit(0)
    if mode in ("garbage", "oldproto"):
        with open(os.path.join(outdir, "result.json"), "w") as f:
            f.write("Segmentation fault\x00\x01" if mode == "garbage" else json.dumps({"protocol": 0, "schedules": []}))
        return
    import numpy as np
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(req["model"], local_files_only=True).float().eval()
    rows = req["rows"]
    T = len(rows[0])
    lp = logprobs(model, rows)
    assert lp.shape[-1] == req["vocab"]
    result = {"protocol": PROTOCOL, "vllm_version": "stand-in", "import_s": 0.0,
              "engines": [{"start_s": 0.0}], "schedules": [], "peak_rss_mb": 0}
    stuck = False
    for i, sched in enumerate(req["schedules"]):
        name = sched["name"]
        entry = {"name": name, "outcome": None, "message": "", "arrays": {}}
        if mode == "noengine":
            entry.update(outcome="raised", engine=True, message="ValueError: head size 16 is not supported "
                         "(at vllm/v1/attention/backends/cpu_attn.py:70 in validate_head_size)")
        elif mode == "refuse":  # vLLM 0.32.0's CPU attention, at the first forward of a head size it lacks
            entry.update(outcome="raised", message="RuntimeError: Unsupported CPU attention configuration: head_dim=16 "
                         "isa=2 kv_cache_idx=0 (at vllm/_custom_ops.py:3865 in cpu_attn_get_scheduler_metadata)")
        elif mode == "refused-engine":  # vLLM's config validation: the model's own, whatever ran before
            entry.update(outcome="raised", engine=True, message="ValidationError: 1 validation error for "
                         "ModelConfig (at vllm/engine/arg_utils.py:1955 in create_model_config)")
        elif mode == "stale-engine":  # what vLLM 0.32 says when an earlier engine left its parallel state
            entry.update(outcome="raised", engine=True, message="AssertionError: expert parallel group is not "
                         "initialized (at vllm/distributed/parallel_state.py:1290 in get_ep_group)")
        elif mode == "stuck" and name == "chunked" or mode == "stuck" and stuck:  # as the worker's watchdog says
            entry.update(outcome="raised", **({"skipped": True, "message": "not run: chunked did not finish in 120 s"}
                         if stuck else {"message": "vLLM's engine did not finish the request in 120 s (at "
                                        "vllm/v1/attention/backends/utils.py:959 in reorder_batch)"}))
            stuck = result["stuck"] = True
        elif mode == "noprefill":
            entry.update(outcome="raised", message="AttributeError: '_OpNamespace' '_C' object has no attribute "
                         "'selective_scan_fwd' (at vllm/_custom_ops.py:1975 in selective_scan_fwd)")
        elif name in ("prefill", "decode", "chunked"):
            b = sched.get("budget", T if name == "prefill" else 1)
            entry["steps"] = [b] * (T // b) + ([T % b] if T % b else [])
            arr = lp.copy()
            if name == "chunked" and mode == "skew":
                arr[:, b, 0] += 0.5  # one token: the distribution itself moves
            if mode == "spread":
                arr[:, T // 2, 0] += 0.5
            np.save(os.path.join(outdir, f"{i}-{name}.npy"), arr)
            entry["arrays"]["logprobs"] = f"{i}-{name}.npy"
        elif name == "prefix":
            P = sched["prefix"]
            if mode == "bigblock":  # whole blocks of 64, as the real worker cuts them
                P = entry["prefix"] = max(64, P // 64 * 64) if max(64, P // 64 * 64) < T else P
            if mode == "crash":
                entry.update(outcome="raised", message="IndexError: index 1 is out of bounds for dimension 0 "
                             "with size 1 (at vllm/model_executor/layers/mamba/mamba_mixer2.py:601 in conv_ssm_forward)")
                result["schedules"].append(entry)
                continue
            cold = logprobs(model, [r[:P] for r in rows])
            warm = lp.copy()
            cached = 0 if mode == "nocache" else P
            warm[:, :cached] = GARBAGE
            np.save(os.path.join(outdir, "prefix_cold.npy"), cold)
            np.save(os.path.join(outdir, "prefix_warm.npy"), warm)
            entry["arrays"] = {"cold": "prefix_cold.npy", "warm": "prefix_warm.npy"}
            entry["num_cached_tokens"] = [cached] * len(rows)
        result["schedules"].append(entry)
    with open(os.path.join(outdir, "result.json"), "w") as f:
        json.dump(result, f)
    return result


def zygote(fd):
    """The worker's zygote: a ready line on the control socket, then a forked `serve` on each socket
    sent over it ($SMEARCLI_STANDIN_NOZYGOTE: exits at once, as an older worker without the mode)."""
    import signal
    import socket

    if os.environ.get("SMEARCLI_STANDIN_NOZYGOTE"):
        sys.exit("usage: worker.py REQUEST.json OUTDIR | serve | hello")
    ctrl = socket.socket(fileno=fd)
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)
    ctrl.sendall((json.dumps({**READY, "import_s": 5.0}) + "\n").encode())  # an import worth counting
    while True:
        msg, fds, _, _ = socket.recv_fds(ctrl, 4096, 1)
        if not msg:
            return
        if os.fork() == 0:
            try:
                os.setsid()
                signal.signal(signal.SIGCHLD, signal.SIG_DFL)  # a reproducer's exit status is read with wait
                ctrl.close()
                err = os.open(json.loads(msg)["log"], os.O_WRONLY | os.O_APPEND)
                for i, src in enumerate((fds[0], fds[0], err)):
                    os.dup2(src, i)
                READY.update(pid=os.getpid(), import_s=0.0)
                serve()
            finally:
                os._exit(0)
        os.close(fds[0])


if __name__ == "__main__":
    if sys.argv[1:] == ["hello"]:
        print(json.dumps({"worker": "smearcli-vllm", "protocol": PROTOCOL, "python": "3", "vllm": "stand-in",
                          "zygote": not os.environ.get("SMEARCLI_STANDIN_NOZYGOTE")}))
    elif sys.argv[1:] == ["serve"]:
        serve()
    elif sys.argv[1:2] == ["zygote"]:
        zygote(int(sys.argv[2]))
    else:
        main(sys.argv[1], sys.argv[2])
