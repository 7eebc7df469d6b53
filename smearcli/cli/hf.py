"""`compare --impl hf` and `plot --impl hf`: a Hugging Face model (smearcli.impls.hf) from the CLI.

Owns which shared options make sense for a transformers model (the others are refused in one
line), the mapping of the adapter's errors to `--hf-model` and the schedule flags, and the outputs:
the table, noise floor, what ran and verdict (render.table), the `smearcli.hf/1` JSON document,
`--save` and the figure (render.figures, from the same `testing.CacheCheck`).

Imported only when `--impl hf` is given, so transformers never loads on the nanochat paths.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from ..errors import UserError
from ..names import DEFAULT_SCHEDULES, NOISE_MARGIN, REFERENCE
from ..schedules import ScheduleOptions
from .options import DType, Logic, RunSpec

SUBTITLE = ("The model runs each schedule through its own cache API (use_cache=True, the cache passed "
            "back each step);\nthe reference is one call over every token with use_cache=False.")
# options that configure nanochat models or inputs, refused with --impl hf: (flag, RunSpec field)
NANOCHAT_ONLY = (("--checkpoint", "checkpoint"), ("--step", "step"), ("--model", "model"),
                 ("--depth", "depth"), ("--text", "text"), ("--text-file", "text_file"),
                 ("--nanochat-path", "nanochat_path"), ("--source", "source"), ("--model-tag", "model_tag"),
                 ("--preset", "preset"))


@dataclass
class HFRun:
    check: object  # testing.CacheCheck
    info: object  # impls.hf.HFModelInfo
    options: ScheduleOptions
    device: str

    @property
    def title(self) -> str:
        i, t = self.info, self.check.tokens
        return f"{i.source}: {i.model_class}, {i.dtype} on {self.device}, {t.size(0)} x {t.size(1)} tokens"


def hf_schedules(spec: RunSpec) -> list[str]:
    """--schedules for a Hugging Face model: engine (nanochat's Engine) is refused when listed
    and left out of the default list; full is the reference, always run."""
    listed = spec.schedule_list(allow_reference=True)
    if "engine" in listed:
        if spec.schedules != ",".join(DEFAULT_SCHEDULES):
            raise UserError("--schedules: engine is nanochat's Engine (batch expansion of its KVCache) and "
                            "does not exist for --impl hf; choose from full, prefill, decode, chunked, speculative")
        listed.remove("engine")
    return [s for s in listed if s != REFERENCE]


def check_hf_spec(spec: RunSpec) -> tuple[list[str], ScheduleOptions]:
    """Everything the options alone decide for --impl hf, before transformers is imported."""
    from .build import check_arguments

    spec.check_impl()
    for name, attr in NANOCHAT_ONLY:
        if getattr(spec, attr) is not None:
            raise UserError(f"{name} configures a nanochat model and does not apply to --impl hf "
                            "(--hf-model names the model)")
    if spec.chat:
        raise UserError("--chat encodes a nanochat conversation; it does not apply to --impl hf")
    if spec.logic != Logic.both:
        raise UserError("--logic picks nanochat's smear logic; with --impl hf the model's own code runs")
    if spec.samples != RunSpec().samples:
        raise UserError("--samples sizes the engine schedule, which --impl hf does not run")
    schedules = hf_schedules(spec)
    return schedules, check_arguments(spec, schedules, spec.chunk_size_tuple())


def load(spec: RunSpec):
    """(model, HFModelInfo, device) for --hf-model, on --device, in --dtype (auto: as loaded)."""
    from ..impls import hf
    from .build import DTYPES, flag, resolve_device

    device = resolve_device(spec.device)
    dtype = None if spec.dtype == DType.auto else DTYPES[spec.dtype.value]
    with flag("--hf-model"):
        model, info = hf.load(spec.hf_model, seed=spec.seed, dtype=dtype)
        model = model.to(device=device, dtype=dtype)
        info = hf.model_info(model, info.source)
    return model, info, device


def tokens_for(spec: RunSpec, model):
    from ..impls import hf
    from ..inputs import load_tokens
    from .build import flag

    if spec.tokens is not None:
        with flag("--tokens"):
            return load_tokens(spec.tokens, hf.vocab_size(model))
    return hf.random_tokens(model, spec.seq_len_value(), spec.batch, spec.seed)


def run(spec: RunSpec, tolerance: float, schedules: Optional[list[str]] = None) -> HFRun:
    """Check the model of --hf-model on every schedule (or `schedules`)."""
    from ..impls import hf
    from ..schedules import chunk_plan

    listed, opts = check_hf_spec(spec)
    model, info, device = load(spec)
    tokens = tokens_for(spec, model)
    try:
        chunk_plan(tokens.size(1), opts)
    except ValueError as e:
        raise UserError(f"{'--chunk-sizes' if opts.chunk_sizes else '--chunks'}: {e}") from e
    with flag_model(spec):
        check = hf.check_model(model, tokens, schedules=schedules or listed, options=opts,
                               tolerance=tolerance, source=info.source)
    return HFRun(check, info, opts, str(device))


def flag_model(spec: RunSpec):
    from .build import flag

    return flag(f"--hf-model {spec.hf_model}:")


def compare(spec: RunSpec, json_out: bool, save: Optional[Path], check: bool, tolerance: float) -> None:
    """`compare --impl hf`: the table (or --json), --save, --check."""
    from ..compare import save_payload
    from ..files import atomic_write
    from ..impls import hf
    from ..render.table import console, print_cache_check
    from .errors import CheckFailed

    r = run(spec, tolerance)
    document = hf.to_json(r.check, r.info, r.options, r.device)
    if json_out:
        sys.stdout.write(json.dumps(document, indent=1) + "\n")
    else:
        print_cache_check(r.check, console(), r.title, what_ran=r.info.describe())
    if save is not None:
        import torch
        with atomic_write(save, "wb") as f:
            torch.save(save_payload(document, {"": r.check}), f)
    if check and not r.check.passed:
        raise CheckFailed(r.check.verdict)


def plot(spec: RunSpec, out: Path, dpi: float, kind: str) -> tuple[str, str]:
    """`plot --impl hf`: the figure of one schedule (`names.figure_schedule` of --schedules), drawn
    by render.figures from the CacheCheck. Returns (schedule, verdict)."""
    from ..names import figure_schedule
    from ..render import figures

    listed = hf_schedules(spec)
    schedule = figure_schedule(listed)
    if len(listed) > 1 and spec.schedules != RunSpec().schedules:
        sys.stderr.write(f"smearcli: plot draws one schedule per figure: {schedule} (of {', '.join(listed)})\n")
    r = run(spec, NOISE_MARGIN, schedules=[schedule])
    title = (f"{r.title}\nschedule {schedule}: "
             f"{figures.describe_steps(r.check.get(schedule).steps)}, vs one call without a cache")
    fig = figures.figure(r.check, schedule, kind, title=title, subtitle=SUBTITLE)
    figures.save(fig, out, dpi=dpi)
    return schedule, r.check.verdict

