"""A standalone reproducer per finding (smearcli scan, issue 21).

`write(record, config, path)` writes one Python file that needs torch and transformers only (no
smearcli import): it rebuilds the tiny config, seeds and builds the model, runs the full pass, the
failing schedule through the model's own cache, and the full pass in float64 for the noise floor,
prints the numbers and exits 1 while the schedule is further from the full pass than `MARGIN` x
the floor, 0 once it is fixed. `run(path)` runs it in an isolated Python (`-I`: no PYTHONPATH,
no user site) and returns the exit status, which the scan records.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from ...names import NOISE_MARGIN
from ...wording import fmt_steps

TEMPLATE = '''"""Reproducer: {model_type} ({model_class}) under transformers {version}.

The schedule {schedule!r} (cached steps of {steps_short}) through the model's own cache should
give the logits of one full pass; found by smearcli scan: max |dlogit| {max_abs:.3g}, shape:
{shape}. Needs torch and transformers only. Exit status: 1 while the bug is there, 0 once fixed.
"""
import inspect
import json
import sys

import torch
import transformers

MODEL_TYPE = {model_type!r}
CONFIG = json.loads({config_json!r})
STEPS = {steps!r}
SEED = {seed!r}
MARGIN = {margin!r}  # an error this many times the float32 rounding floor is no longer rounding


def build():
    cfg = transformers.CONFIG_MAPPING[MODEL_TYPE](**CONFIG)
    torch.manual_seed(SEED)
    return transformers.AutoModelForCausalLM.from_config(cfg).float().eval()


def cached(model, ids, steps):
    params = inspect.signature(model.forward).parameters
    keyword = next(k for k in ("cache", "past_key_values", "cache_params", "state") if k in params)
    cache, pos, out = None, 0, []
    for n in steps:
        kw = {{"use_cache": True}}
        if cache is not None:
            kw[keyword] = cache
        if keyword == "cache_params" and "cache_position" in params:
            kw["cache_position"] = torch.arange(pos, pos + n)
        o = model(input_ids=ids[:, pos:pos + n], **kw)
        got = next((getattr(o, k) for k in ("cache", "past_key_values", "cache_params", "state")
                    if getattr(o, k, None) is not None), None)
        if got is None and cache is None:  # the model wants the caller to create its cache
            cache = transformers.DynamicCache(config=model.config)
            kw[keyword] = cache
            o = model(input_ids=ids[:, pos:pos + n], **kw)
        elif got is not None:
            cache = got
        out.append(o.logits.float())
        pos += n
    return torch.cat(out, dim=1)


def main():
    model = build()
    ids = torch.randint(0, {vocab}, (1, sum(STEPS)), generator=torch.Generator().manual_seed(SEED))
    with torch.inference_mode():
        full = model(input_ids=ids, use_cache=False).logits.float()
        run = cached(model, ids, STEPS)
        full64 = model.double()(input_ids=ids, use_cache=False).logits.float()
    floor = max(float((full64 - full).abs().max()), torch.finfo(torch.float32).eps * float(full.abs().max()))
    err = float((run - full).abs().max())
    print(f"transformers {{transformers.__version__}}, torch {{torch.__version__}}: {{MODEL_TYPE}}")
    print(f"full pass vs the cached steps: max |dlogit| {{err:.3g}}; float32 floor {{floor:.3g}} "
          f"({{err / floor:.3g}}x); the bug is there above {{MARGIN:g}}x")
    return 1 if err > MARGIN * floor else 0


if __name__ == "__main__":
    sys.exit(main())
'''


def write(record: dict, config, path: Path, seed: int = 0, vocab: int = 256,
          margin: float = NOISE_MARGIN) -> Path:
    """The reproducer of one finding (`record`: a scan record with `steps`), written to `path`."""
    import transformers

    d = {k: v for k, v in config.to_dict().items() if k not in ("transformers_version", "architectures")}
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(TEMPLATE.format(
        model_type=record["model_type"], model_class=record.get("model_class") or "?",
        version=transformers.__version__, schedule=record.get("worst_schedule"),
        steps_short=fmt_steps(record["steps"]), max_abs=record.get("max_abs") or 0.0,
        shape=record.get("shape"), config_json=json.dumps(d, default=str), steps=list(record["steps"]),
        seed=seed, margin=margin, vocab=vocab))
    return path


def run(path: Path, timeout: float = 300.0) -> tuple[int, str]:
    """(exit status, last line of output) of a reproducer in an isolated Python."""
    try:
        p = subprocess.run([sys.executable, "-I", str(path)], capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return -1, f"timed out after {timeout:g} s"
    lines = (p.stdout.strip() or p.stderr.strip()).splitlines()
    return p.returncode, lines[-1] if lines else ""
