"""A stand-in for smearcli/engines/llamacpp/worker.py: speaks its protocol, computes with transformers.

`tests/test_llamacpp.py` runs it as "llama.cpp's interpreter" (a two-line shell script calling this
file with the worker's arguments), so the adapter is tested without compiling llama.cpp. Every
schedule's logits are the model's full forward in transformers, computed here independently of
smearcli, as a correct llama.cpp's would be; the mode (env SMEARCLI_STANDIN_MODE) makes it
misbehave as llama.cpp can:

- good: every schedule as the worker runs it;
- skew: the ubatch schedule's width 5 is off from position 5 on (state lost at a micro-batch boundary);
- once: skew in the first worker run only (a marker file beside $SMEARCLI_STANDIN_ONCE says it ran):
  a departure that a rerun does not show again;
- own: every schedule, prefill included, is off at position 3 (the implementation's own departure);
- refuse: the rollback schedule is refused as llama.cpp refuses a partial seq_rm on recurrent memory;
- die: the decode schedule aborts the process with a GGML_ASSERT line, as llama.cpp does; the
  fresh worker the adapter starts then runs the rest;
- stuck: the chunked schedule never finishes and the worker's watchdog ends the process (status 3);
- torn: the restore schedule's state file is found torn on disk (a full disk): the worker's
  `environment` outcome;
- noconvert: the converter refuses the architecture;
- garbage: result.json is not JSON (a worker that is not smearcli's).

`archs` answers the converter's registry as $SMEARCLI_STANDIN_ARCHS (comma-separated; default
LlamaForCausalLM,MambaForCausalLM). A converted model leaves a placeholder model.gguf (what a
reproducer keeps beside it); a file ending in .py given alone is a reproducer run in "llama.cpp's
environment": the stand-in has no llama.cpp, so it says so and exits 2, as a reproducer does there.

`serve SOCKET` is the census's fork server, the real worker's `serve` forking this file's `main`;
with $SMEARCLI_STANDIN_STARTS set, each fresh start of the stand-in as a worker or a server adds a
line to that file (a worker forked by the server adds none).

`hello` answers the handshake with llama-cpp-python $SMEARCLI_STANDIN_VERSION (default 0.3.36,
none when it is "missing"). With a GGUF, `expect_arch` is answered as $SMEARCLI_STANDIN_ARCH (default
"llama"). The request is copied to $SMEARCLI_STANDIN_SEEN when set.
"""

import json
import os
import sys

PROTOCOL = 1
START_PID = os.getpid()


def hello():
    v = os.environ.get("SMEARCLI_STANDIN_VERSION", "0.3.36")
    print(json.dumps({"worker": "smearcli-llamacpp", "protocol": PROTOCOL, "python": "3.11.7",
                      "llama_cpp_python": None if v == "missing" else v, "gguf": "0.19.0", "torch": "2.13.0",
                      "transformers": "5.24.0", "converter": "/standin/share/llamacpp-convert"}))


def write(outdir, result):
    with open(os.path.join(outdir, "result.json.part"), "w") as f:
        json.dump(result, f)
    os.replace(os.path.join(outdir, "result.json.part"), os.path.join(outdir, "result.json"))


def main(req_path, outdir):
    if os.environ.get("SMEARCLI_STANDIN_STARTS") and os.getpid() == START_PID:  # a fresh Python, not a fork
        open(os.environ["SMEARCLI_STANDIN_STARTS"], "a").write("worker\n")
    import numpy as np
    import torch
    from transformers import AutoModelForCausalLM

    req = json.load(open(req_path))
    if os.environ.get("SMEARCLI_STANDIN_SEEN"):
        json.dump(req, open(os.environ["SMEARCLI_STANDIN_SEEN"], "w"))
    mode = os.environ.get("SMEARCLI_STANDIN_MODE", "good")
    if mode == "once":
        marker = os.environ["SMEARCLI_STANDIN_ONCE"]
        mode = "good" if os.path.exists(marker) else "skew"
        open(marker, "a").close()
    path = os.path.join(outdir, "result.json")
    result = json.load(open(path)) if os.path.isfile(path) else {
        "protocol": PROTOCOL, "llama_cpp_python": "0.3.36", "schedules": [], "running": None}
    if mode == "garbage":
        with open(path, "w") as f:
            f.write("Segmentation fault (core dumped)")
        return None
    if mode == "noconvert":
        result["not_built"] = ("llama.cpp's converter: NotImplementedError: Architecture 'X' not supported! "
                               f"(reading {req.get('model')}/config.json)")  # as the real one names its files
        return write(outdir, result)
    if req.get("gguf") and req.get("expect_arch"):
        want = os.environ.get("SMEARCLI_STANDIN_ARCH", "llama")
        result["expect_arch"] = want
        if req.get("gguf_arch") and req["gguf_arch"] != want:
            result["arch_mismatch"] = [want, req["gguf_arch"]]
            return write(outdir, result)
    if not req.get("gguf"):
        result["convert"] = {"arch": "llama", "convert_s": 0.1, "bytes": 1000}
        with open(os.path.join(outdir, "model.gguf"), "wb") as f:
            f.write(b"GGUF stand-in")
    result.update(load_s=0.01, vocab=req["vocab"], recurrent=False, hybrid=False)
    model = AutoModelForCausalLM.from_pretrained(req["model"]).eval()
    with torch.no_grad():
        full = model(input_ids=torch.tensor(req["rows"]), use_cache=False).logits.float().numpy()
    T = full.shape[1]
    done = {e["name"] for e in result["schedules"]}
    jobs = list(req["schedules"]) + ([{"name": "prefill_f16"}, {"name": "decode_f16"}] if req.get("f16_too") else [])
    jobs += [{"name": "spread", "lengths": req["spread"]}] if req.get("spread") else []
    for i, s in enumerate(jobs):
        name = s["name"]
        if name in done:
            continue
        result["running"] = name
        write(outdir, result)
        entry = {"name": name, "outcome": None, "message": "", "arrays": {}}
        logits = full.copy()
        if mode == "own":
            logits[:, 3, 0] += 0.5
        if name.endswith("_f16"):
            logits = logits + 1e-3 * np.sin(np.arange(logits.shape[-1]))
        if name == "decode" and mode == "die":
            sys.stderr.write("/tmp/build/vendor/llama.cpp/src/llama-context.cpp:1234: GGML_ASSERT(n_tokens > 0) "
                             "failed\n")
            sys.stderr.flush()
            os.abort()
        if name == "chunked" and mode == "stuck":
            os._exit(3)  # as the worker's watchdog ends it, result.json naming the schedule it was in
        if name in ("rollback", "mixed") and mode == "refuse":
            entry.update(outcome="refused", message="llama_memory_seq_rm refused to remove positions 30.. (a "
                         "partial removal) from the recurrent memory with n_rs_seq 0: llama.cpp's documented limit",
                         steps=[s["prompt"], s["draft"]])
        elif name == "shift" and mode == "absolute":
            entry.update(outcome="inapplicable", message="the model adds a learned embedding of each absolute position "
                         "(position_embd): what its cache holds was computed at those positions, and no shift can "
                         "move it")
        elif name == "restore" and mode == "torn":
            entry.update(outcome="environment", message="the state file state.bin in the worker's temporary directory "
                         "holds 4096 of the 12748 bytes llama_state_seq_save_file wrote: torn (is the disk full?); "
                         "nothing was restored",
                         steps=[s["prefix"], T - s["prefix"]])
        elif name == "spread":  # one-call prefills of the first tokens: the same numbers, or a kernel's wobble
            for n in s["lengths"]:
                arr = logits[:, :n].copy()
                if mode == "wobble":
                    arr[:, :, 0] += 0.5 * (n % 2)  # one token: a whole-row shift would be no change in log-probs
                np.save(os.path.join(outdir, f"{i}-spread-{n}.npy"), arr)
                entry["arrays"][str(n)] = f"{i}-spread-{n}.npy"
            entry["steps"] = list(s["lengths"])
        elif name == "ubatch":
            for w in s["widths"]:
                arr = logits.copy()
                if mode == "skew" and w == 5:
                    arr[:, 5:, 0] += 0.25  # one token: a constant shift is no change in log-probs
                np.save(os.path.join(outdir, f"{i}-ubatch-{w}.npy"), arr)
                entry["arrays"][str(w)] = f"{i}-ubatch-{w}.npy"
            entry["steps"] = [T]
        else:
            if name in ("batched", "split"):
                S = s["short"]
                logits = np.concatenate([np.stack([r, r]) for r in logits])
                entry["steps"] = [T + S]
            elif name in ("chunked", "swa", "flash"):
                entry["steps"] = s["sizes"]
                if name == "flash":  # its own one-call prefill: flash attention rounds it elsewhere
                    ref = logits + 1e-4 * np.cos(np.arange(logits.shape[-1]))
                    np.save(os.path.join(outdir, f"{i}-{name}-reference.npy"), ref)
                    entry["arrays"]["reference"] = f"{i}-{name}-reference.npy"
                    logits = ref.copy()
                    if mode == "flash":  # a flash cache that drops what came before each call's first token
                        for p in np.cumsum(s["sizes"])[:-1]:
                            logits[:, p, :8] += 0.5
            elif name in ("prefix", "restore", "shift"):
                entry["steps"] = [s["prefix"], T - s["prefix"]]
            elif name in ("rollback", "mixed"):
                entry["steps"], pos, cuts = [s["prompt"]], s["prompt"], []
                while pos < T:
                    single = name == "mixed" and len(entry["steps"]) % 2 == 0
                    n = 1 if single else min(s["draft"], T - pos)
                    keep = 0 if single else n if n < s["draft"] else n - s["reject"]
                    entry["steps"].append(n)
                    if keep < n:
                        cuts.append(pos + keep)
                    pos += keep
                entry["cuts"], entry["n_rs_seq"] = cuts, s["draft"]
            else:
                entry["steps"] = [T] if name.startswith("prefill") else [1] * T
            np.save(os.path.join(outdir, f"{i}-{name}.npy"), logits)
            entry["arrays"]["logits"] = f"{i}-{name}.npy"
        result["schedules"].append(entry)
    result["running"] = None
    result["total_s"] = 0.5
    write(outdir, result)


if __name__ == "__main__":
    if sys.argv[1:] == ["hello"]:
        hello()
    elif sys.argv[1:] == ["archs"]:
        names = os.environ.get("SMEARCLI_STANDIN_ARCHS", "LlamaForCausalLM,MambaForCausalLM").split(",")
        print(json.dumps({"worker": "smearcli-llamacpp", "protocol": PROTOCOL, "archs": names}))
    elif len(sys.argv) == 3 and sys.argv[1] == "serve":  # the census's fork server: the real one's code
        sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "smearcli", "engines",
                                        "llamacpp"))
        import worker

        if os.environ.get("SMEARCLI_STANDIN_STARTS"):  # a line per start of this Python
            open(os.environ["SMEARCLI_STANDIN_STARTS"], "a").write("serve\n")
        worker.serve(sys.argv[2], warm=lambda: __import__("transformers").AutoModelForCausalLM, run=main)
    elif len(sys.argv) == 2 and sys.argv[1].endswith(".py"):
        print("run this with the Python of llama.cpp's environment (the stand-in has no llama.cpp)", file=sys.stderr)
        sys.exit(2)
    else:
        main(sys.argv[1], sys.argv[2])
