"""Turn a `RunSpec` (parsed options) into a model, input tokens and schedule options.

The only place that maps a library error to a flag: the library names files and problems, this
module says which option they came from."""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from pathlib import Path

import torch

from ..config import ConfigError
from ..errors import UserError
from ..inputs import load_tokens, random_tokens, read_text_file, text_tokens
from ..preflight import check_dtype, check_run_memory
from ..schedules import ScheduleOptions, chunk_plan
from ..weights import LoadedModel, load_checkpoint, preset_config, random_config, random_model, tiny_model
from .options import Device, DType, ModelKind, RunSpec

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass
class Setup:
    loaded: LoadedModel
    tokens: torch.Tensor  # (B, T) int64 on the model's device
    options: ScheduleOptions
    schedules: list[str]
    logics: list[str]
    impl: str = "ours"  # whose code runs: ours, nanochat (the user's checkout) or both
    audited: object = None  # with --impl nanochat|both: the user's model (adapter.NanochatModel)

    @property
    def model(self):
        return self.loaded.model


def resolve_device(name: str) -> torch.device:
    if name == Device.auto:
        if torch.cuda.is_available():
            return torch.device("cuda")
        if getattr(torch.backends, "mps", None) and torch.backends.mps.is_available():
            return torch.device("mps")
        return torch.device("cpu")
    if name == Device.cuda and not torch.cuda.is_available():
        raise UserError("--device cuda: CUDA is not available on this machine (try --device cpu)")
    if name == Device.mps and not (getattr(torch.backends, "mps", None) and torch.backends.mps.is_available()):
        raise UserError("--device mps: MPS is not available on this machine (try --device cpu)")
    return torch.device(name.value if isinstance(name, Device) else name)


def resolve_dtype(name: str, device: torch.device) -> torch.dtype:
    name = name.value if isinstance(name, DType) else name
    if name == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    return DTYPES[name]


def preflight(cfg, device, dtype, B: int, T: int, schedules, logics, spec: RunSpec, chunk_sizes) -> None:
    """Before any input is generated or any run starts: positions and memory."""
    if T < 2 and {"engine", "speculative"} & set(schedules):
        raise UserError(f"the input has {T} token; the engine and speculative schedules need at least 2")
    if T > cfg.rotary_len:
        raise UserError(f"{T} tokens exceed what the model's rotary table covers ({cfg.rotary_len} = "
                        f"10 x sequence_len {cfg.sequence_len})")
    max_chunk = max(chunk_sizes) if chunk_sizes else -(-T // max(spec.chunks, 1))
    check_run_memory(cfg, device, B, T, schedules, logics, max(spec.samples, 1), max_chunk, dtype,
                     hint="lower --seq-len, --batch or --samples, or run fewer --schedules")


def _check_plan(T: int, schedules, opts: ScheduleOptions) -> None:
    if "chunked" in schedules:
        try:
            chunk_plan(T, opts)
        except ValueError as e:
            flag = "--chunk-sizes" if opts.chunk_sizes else "--chunks"
            raise UserError(f"{flag}: {e}") from e


def check_arguments(spec: RunSpec, schedules, chunk_sizes) -> ScheduleOptions:
    """Everything the options alone decide, checked before a model is built or loaded."""
    inputs = [f for f, v in (("--tokens", spec.tokens), ("--text", spec.text), ("--text-file", spec.text_file))
              if v is not None]
    if len(inputs) > 1:
        raise UserError(f"{' and '.join(inputs)}: give only one of them")
    if spec.step is not None and spec.checkpoint is None:
        raise UserError("--step needs --checkpoint")
    if not 0 <= spec.seed < 2**64:
        raise UserError(f"--seed must be between 0 and 2^64 - 1, got {spec.seed}")
    opts = ScheduleOptions(chunks=spec.chunks, chunk_sizes=chunk_sizes, samples=spec.samples,
                           gen_len=spec.gen_len, draft=spec.draft)
    for name, value in (("--samples", spec.samples), ("--gen-len", spec.gen_len), ("--draft", spec.draft)):
        if value < 1:
            raise UserError(f"{name} must be >= 1, got {value}")
    if not inputs:  # random input: its length is known now
        if spec.seq_len_value() < 2:
            raise UserError(f"--seq-len must be >= 2, got {spec.seq_len_value()}")
        if spec.batch < 1:
            raise UserError(f"--batch must be >= 1, got {spec.batch}")
        _check_plan(spec.seq_len_value(), schedules, opts)
    return opts


@contextlib.contextmanager
def flag(name: str, sep: str = " "):
    """Prefix a library's UserError with the option whose value it is about: `--tokens` before
    "t.json: file not found", `--text` + ": " before "the text is empty"."""
    try:
        yield
    except UserError as e:
        raise UserError(f"{name}{sep}{e}") from e


def attach(spec: RunSpec, loaded, device, dtype):
    """The step for --impl nanochat|both: import the user's code and build their model, from our
    model's weights (random, tiny) or from --checkpoint the way upstream loads it.

    Returns (loaded, audited, logics): with --impl nanochat, `loaded` wraps the user's model and
    the one logic is theirs; with --impl both, `loaded` stays ours and runs old and fixed."""
    from ..impls.nanochat.adapter import nanochat_from_checkpoint, nanochat_from_model
    from ..impls.nanochat.audit import USER_LOGIC
    from ..impls.nanochat.sandbox import import_nanochat
    from ..names import LOGIC_NAMES

    impl = getattr(spec.impl, "value", spec.impl)
    code = import_nanochat(spec.nanochat_path, dtype=dtype)
    if spec.checkpoint is not None:
        theirs, step, meta = nanochat_from_checkpoint(code, spec.checkpoint, spec.step, device)
        source = str(Path(os.path.expanduser(str(spec.checkpoint))))
    else:
        theirs = nanochat_from_model(code, loaded.model)
        source, step, meta = loaded.source, loaded.step, loaded.meta
    if impl == "nanochat":
        return LoadedModel(theirs, source, step, meta), theirs, [USER_LOGIC]
    return loaded, theirs, list(LOGIC_NAMES)


def build_setup(spec: RunSpec, sequence_len: int = 512) -> Setup:
    """`sequence_len`: the random model's training context (windows, rotary table) without
    --preset (a preset brings its own)."""
    if spec.preset is not None:
        spec.model_kind()  # --preset with --checkpoint / --model tiny: refused before anything loads
    schedules = spec.schedule_list()
    logics = spec.logic_list()
    chunk_sizes = spec.chunk_size_tuple()
    spec.check_impl()
    impl = getattr(spec.impl, "value", spec.impl)
    opts = check_arguments(spec, schedules, chunk_sizes)
    device = resolve_device(spec.device)
    dtype = resolve_dtype(spec.dtype, device)
    with flag("--dtype"):
        check_dtype(device, dtype)
    if spec.checkpoint is not None:
        # --impl nanochat loads the checkpoint into the user's code only (attach)
        loaded = None if impl == "nanochat" else load_checkpoint(spec.checkpoint, spec.step, device=device, dtype=dtype)
    elif spec.model_kind() == ModelKind.tiny:
        if spec.step is not None:
            raise UserError("--step needs --checkpoint")
        loaded = tiny_model(device=device, dtype=dtype)
    else:
        if spec.step is not None:
            raise UserError("--step needs --checkpoint")
        try:
            if spec.preset is not None:
                config = preset_config(spec.preset.value, spec.depth)
            else:
                config = random_config(spec.depth_value(), sequence_len=sequence_len)
        except ConfigError as e:
            raise UserError(f"--depth {spec.depth_value()}: {e}") from e
        loaded = random_model(config, seed=spec.seed, device=device, dtype=dtype)
    audited = None
    if impl != "ours":
        loaded, audited, logics = attach(spec, loaded, device, dtype)  # errors name the checkout
    cfg = loaded.model.config
    if spec.tokens is not None:
        with flag("--tokens"):
            tokens = load_tokens(spec.tokens, cfg.vocab_size)
    elif spec.text_file is not None:
        with flag("--text-file"):
            tokens = read_text_file(spec.text_file, cfg)
    elif spec.text is not None:
        with flag("--text", ": "):
            tokens = text_tokens(spec.text, cfg)
    else:
        preflight(cfg, device, dtype, spec.batch, spec.seq_len_value(), schedules, logics, spec, chunk_sizes)
        tokens = random_tokens(cfg, spec.seq_len_value(), spec.batch, spec.seed)
    T = tokens.size(1)
    preflight(cfg, device, dtype, tokens.size(0), T, schedules, logics, spec, chunk_sizes)
    _check_plan(T, schedules, opts)
    return Setup(loaded, tokens.to(device), opts, schedules, logics, impl, audited)
