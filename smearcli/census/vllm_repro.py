"""A standalone reproducer per finding of the census on vLLM (`smearcli scan`'s vLLM engine).

`write(record, config, path, ...)` writes one Python file that needs vLLM's environment only
(vLLM with its own torch and transformers; never smearcli): it saves the tiny model (the config
embedded, the weights seeded), runs the two requests of the failing schedule through vLLM's
public API (a prefix of whole blocks, then the whole input reading it; or the prompt at the
chunk budget; or a one-token prompt decoded), prints the numbers, and exits 1 while the bug is
there: vLLM raises, or its log-probabilities are further from the model's full pass in
transformers than `MARGIN` x that pass's own float32 rounding (against its float64 copy), 0 once
fixed. `attach(...)` writes it and has the worker run it once in vLLM's interpreter with `-I` (no
PYTHONPATH, no user site), so the record holds its path and exit status.
"""

from __future__ import annotations

import json
from pathlib import Path

from ..defaults import NOISE_MARGIN
from .record import Record

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
STUCK_S = 120  # the whole run in vLLM takes seconds; past this it is stuck


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
    from . import vllm_plan
    from .reference import arch_of

    label = rec.worst_schedule
    entry = next(e for e in req["schedules"] if vllm_plan.label(e) == label)
    d = {k: v for k, v in config.to_dict().items() if k not in ("transformers_version", "architectures")}
    finding = rec.reason or f"max |dlogprob| {rec.max_abs or 0:.3g} ({rec.multiple or 0:.3g}x the floor)"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(TEMPLATE.format(
        model_type=rec.model_type, arch=arch_of(rec.model_type), version=rec.vllm_version,
        schedule=label, how=HOW[entry["name"]], finding=str(finding).replace('"""', "'''")[:300],
        config_json=json.dumps(d, default=str), entry=entry, tokens=req["rows"][0], seed=seed, margin=margin,
        block=req["block_size"], max_len=req["max_model_len"], vocab=req["vocab"],
        one_engine=bool(req.get("one_engine"))))
    return path


def attach(rec: Record, config, repro_dir: Path, worker, seed: int, req: dict, timeout: float) -> None:
    """Write the finding's reproducer beside the others and have vLLM's worker run it (the worker
    runs outside the architecture's memory limit, which vLLM's import alone would pass):
    `reproducer`, `reproducer_status`."""
    from .vllm_engine import WorkerGone

    path = write(rec, config, Path(repro_dir) / f"{rec.model_type}-vllm.py", req, seed)
    rec.reproducer = str(path)
    try:
        got = worker.ask({"op": "repro", "path": str(path.resolve()), "timeout": timeout}, timeout + 3)
        rec.reproducer_status, rec.reproducer_output = int(got.get("status", -1)), str(got.get("last", ""))
    except WorkerGone as e:
        rec.reproducer_output = str(e)
        rec.vllm = {**(rec.vllm or {}), "answered": False}
