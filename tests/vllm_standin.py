"""A stand-in for smearcli/impls/vllm/worker.py: speaks its protocol, computes with transformers.

`tests/test_vllm.py` runs it as the "vLLM interpreter" (a two-line shell script calling this file
with the worker's arguments), so the adapter is tested without vLLM. Every log-prob is the model's
full forward in transformers, computed here independently of smearcli, as vLLM's would be; the
mode (env SMEARCLI_STANDIN_MODE) makes it misbehave as vLLM can:

- good: the prefix schedule's second request returns garbage below num_cached_tokens (-9e23,
  as real vLLM's uninitialised memory), as vLLM does;
- nocache: the second request reads nothing from the prefix cache (num_cached_tokens 0);
- crash: the prefix schedule raises inside "vLLM" (an IndexError, as Mamba2's does);
- die: the worker exits with status 1 before answering;
- skew: chunked's log-probs are off at the first chunk start (a chunk-boundary bug);
- garbage: result.json is not JSON; oldproto: it speaks protocol 0; silent: the worker exits 0
  without writing result.json (each answers the handshake first, as a broken worker would).

`hello` answers the worker's handshake (protocol 1, vLLM "stand-in") before anything heavy is
imported. It copies the request it got to $SMEARCLI_STANDIN_SEEN, when set, for the tests to read.
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


def main(request_path, outdir):
    mode = os.environ.get("SMEARCLI_STANDIN_MODE", "good")
    req = json.load(open(request_path))
    if os.environ.get("SMEARCLI_STANDIN_SEEN"):
        shutil.copy(request_path, os.environ["SMEARCLI_STANDIN_SEEN"])
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
    result = {"protocol": 1, "vllm_version": "stand-in", "import_s": 0.0, "engines": [], "schedules": [],
              "peak_rss_mb": 0}
    for sched in req["schedules"]:
        name = sched["name"]
        entry = {"name": name, "outcome": None, "message": "", "arrays": {}}
        if name in ("prefill", "decode", "chunked"):
            b = sched.get("budget", T if name == "prefill" else 1)
            entry["steps"] = [b] * (T // b) + ([T % b] if T % b else [])
            arr = lp.copy()
            if name == "chunked" and mode == "skew":
                arr[:, b, 0] += 0.5  # one token: the distribution itself moves
            np.save(os.path.join(outdir, f"{name}.npy"), arr)
            entry["arrays"]["logprobs"] = f"{name}.npy"
        elif name == "prefix":
            P = sched["prefix"]
            if mode == "crash":
                entry.update(outcome="crashed", message="IndexError: index 1 is out of bounds for dimension 0 "
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


if __name__ == "__main__":
    if sys.argv[1:] == ["hello"]:
        print(json.dumps({"worker": "smearcli-vllm", "protocol": 1, "python": "3", "vllm": "stand-in"}))
    else:
        main(sys.argv[1], sys.argv[2])
