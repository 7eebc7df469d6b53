"""Where weights come from: a seeded random model, the tiny model that ships with smearcli, or a
nanochat checkpoint, loaded (its files are read by `smearcli.gpt.checkpoint`) and written.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional
from concurrent.futures import Future, ThreadPoolExecutor
from unittest import mock

import torch
import torch.nn as nn

from .config import ConfigError, GPTConfig, nanochat_shape, preset_config
from ..util.errors import UserError
from .checkpoint import (NoSmearParameters, can_mmap, check_tensors, find_step, list_steps,
                         read_meta, read_state_dict, smear_keys_missing, SMEAR_KEYS)
from .model import GPT, param_shapes
from ..measure.precision import float64_copy, provide_float64, shared_tables
from ..util.preflight import check_model_memory

TINY_DIR = Path(__file__).resolve().parents[1] / "data" / "tiny"  # the package's data, beside gpt/


def random_config(depth: int = 4, sequence_len: int = 512, vocab_size: int = 256,
                  window_pattern: str = "SSSL") -> GPTConfig:
    """nanochat's sizing rule (`config.nanochat_shape`, the one rule of --depth and the presets):
    width 64 x depth rounded up to 128-dim heads (d4: 256 wide, 2 heads; d5: 384 wide, 3 heads).

    The default (d4, byte vocabulary, context 512 so the short window is 128 tokens) is the small
    preset: it runs in seconds on a CPU and has the fixture checkpoint's shape."""
    return nanochat_shape(depth, vocab_size=vocab_size, sequence_len=sequence_len, window_pattern=window_pattern)


def preset_model(name: str, seed: int = 0, device="cpu", dtype: torch.dtype = torch.float32,
                 depth: Optional[int] = None) -> LoadedModel:
    """A seeded random model of a preset's shape (`PRESETS`: small, nanochat's d12 ... d32)."""
    return random_model(preset_config(name, depth), seed=seed, device=device, dtype=dtype)




@dataclass
class LoadedModel:
    model: GPT
    source: str  # "random" or the checkpoint path
    step: Optional[int] = None
    meta: dict = field(default_factory=dict)

    @property
    def name(self) -> str:
        if self.step is None:
            return self.source
        return f"{self.source}@{self.step}"


def uniform_(t: torch.Tensor, bound: float, g: torch.Generator) -> torch.Tensor:
    """Fill `t` in place, in its own dtype, with U(-bound, bound) from `g`. In float32 these are the
    values of `(torch.rand(t.shape, generator=g) * 2 - 1) * bound` bit for bit (u - 0.5 and the
    doubling are exact), without the temporaries."""
    return t.uniform_(-0.5, 0.5, generator=g).mul_(2 * bound)


def normal_(t: torch.Tensor, std: float, g: torch.Generator) -> torch.Tensor:
    """Fill `t` in place, in its own dtype, with N(0, std^2) from `g`. In float32 these are the
    values of `torch.randn(t.shape, generator=g) * std` bit for bit (a standard draw, then the same
    one rounding of the product; `normal_(0, std)` rounds differently on tensors under 16 elements)."""
    return t.normal_(0.0, 1.0, generator=g).mul_(std)


def draws(model: GPT) -> list[tuple[torch.Tensor, str, float]]:
    """(tensor, "normal" or "uniform", std or bound) for every tensor `init_random` draws, in the
    one order the generator is read in: the same seed gives the same weights only in this order."""
    C = model.config.n_embd
    s = 3 ** 0.5 * C ** -0.5  # uniform bound with std 1/sqrt(C)
    out = [(model.transformer.wte.weight, "normal", 0.8), (model.lm_head.weight, "normal", 0.05)]
    for block in model.transformer.h:
        out += [(block.attn.c_q.weight, "uniform", s), (block.attn.c_k.weight, "uniform", s),
                (block.attn.c_v.weight, "uniform", s),
                (block.attn.c_proj.weight, "uniform", s * 0.5),  # upstream: zeros
                (block.mlp.c_fc.weight, "uniform", s * 0.4),
                (block.mlp.c_proj.weight, "uniform", s * 0.25)]  # upstream: zeros
        if block.attn.ve_gate is not None:
            out.append((block.attn.ve_gate.weight, "uniform", 0.5))
    out.append((model.smear_gate.weight, "normal", 0.5))  # upstream: uniform(0, 0.02)
    out += [(ve.weight, "uniform", s) for ve in model.value_embeds.values()]
    return out


FILLS = {"normal": normal_, "uniform": uniform_}


@torch.no_grad()
def init_random(model: GPT, seed: int = 0, float64: bool = False) -> GPT:
    """Fill `model` with seeded random weights that make the smear bug visible.

    Starts from upstream's init scales, then departs where upstream's init would hide the bug:
    upstream zeroes `smear_lambda` and both output projections, so a fresh model has no smear
    and no attention/MLP output at all. Here `smear_lambda` = 0.5 (trained nanochat models learn
    about 0.5-0.6), the smear gate is spread so gates differ per token, both projections get
    small uniform weights, and lm_head is larger so logits carry signal.

    Every tensor is drawn in place, in the dtype it is stored in, in one fixed order (`draws`): a
    float32 model gets the same values for the same seed whatever its compute dtype was at draw
    time; an embedding stored in bfloat16 gets bfloat16 draws (not float32 draws rounded).

    One generator read in order is one core's work, however many the forwards use. The other core
    meanwhile touches each tensor's memory before it is drawn into (the page faults of a d12's
    2 GB) and, with `float64`, converts each drawn tensor into the model's float64 copy
    (`precision.float64_model` takes them: a compare needs that copy for its floor)."""
    g = torch.Generator().manual_seed(seed)
    order = draws(model)
    with Beside([t for t, _, _ in order], model if float64 else None) as beside:
        for t, fill, scale in order:
            beside.ready(t)
            FILLS[fill](t, scale, g)
            beside.drawn(t)
    n = model.config.n_layer
    for i in range(n):
        model.resid_lambdas[i] = 1.15 - 0.10 * i / max(n - 1, 1)
        model.x0_lambdas[i] = 0.20 - 0.15 * i / max(n - 1, 1)
    model.smear_lambda.fill_(0.5)  # upstream: 0
    model.backout_lambda.fill_(0.2)
    return model


class Beside:
    """The second core's part of drawing a model: its memory touched ahead of the draws, one
    page at a time in the order they come (`ready(t)` waits for t's pages), and, given the model,
    each drawn tensor's float64 copy made (`drawn(t)`), handed to `precision.provide_float64` at
    the end. One worker thread; the generator is read only by the caller's."""

    def __init__(self, tensors: list[torch.Tensor], model: Optional[GPT] = None):
        self.model = model
        self.shared = set() if model is None else shared_tables(model)  # the copy shares these
        self.pool = ThreadPoolExecutor(1, thread_name_prefix="smearcli-beside")
        self.touched = {id(t): self.pool.submit(_touch, t) for t in tensors}
        self.copies: list[tuple[torch.Tensor, Future]] = []

    def ready(self, t: torch.Tensor) -> None:
        self.touched.pop(id(t)).result()

    def drawn(self, t: torch.Tensor) -> None:
        if self.model is not None and id(t) not in self.shared:
            self.copies.append((t, self.pool.submit(float64_copy, t)))

    def __enter__(self) -> "Beside":
        return self

    def __exit__(self, kind, *_) -> None:
        try:
            if kind is None and self.model is not None:
                provide_float64(self.model, [(t, f.result()) for t, f in self.copies])
        finally:
            for f in self.touched.values():
                f.cancel()
            self.pool.shutdown(wait=True)


def _touch(t: torch.Tensor) -> None:
    """Write one element of every page of `t` (4 KiB), so the kernel maps its memory now, on this
    thread, and not inside the draw; the draw overwrites every element."""
    with torch.no_grad():
        t.detach().view(-1)[::max(1, 4096 // t.element_size())].zero_()


def random_model(config: Optional[GPTConfig] = None, seed: int = 0, device="cpu",
                 dtype: torch.dtype = torch.float32, float64: bool = False) -> LoadedModel:
    """A seeded random model of `config` on `device`. `float64`: its float64 copy is made while the
    weights are drawn (`init_random`), for a caller that will ask for it (a compare's floor); on a
    CPU only, where the model is drawn."""
    config = config or random_config()
    check_model_memory(config, device)
    # no memory and no default init: init_random writes every tensor. nn.Embedding's own init
    # (normal_) would import torch's compiler on the meta device (over a second): it is skipped
    with torch.device("meta"), mock.patch.object(nn.Embedding, "reset_parameters", lambda self: None):
        model = GPT(config)
    model.set_dtype(dtype)  # the dtypes the tensors are stored in, chosen before any memory exists
    # memory for every tensor, uninitialised. Not `to_empty`: its empty_like of a meta tensor goes
    # through torch's Python reference implementation, which imports sympy (about 0.4 s)
    model._apply(lambda t: torch.empty(t.shape, dtype=t.dtype, device="cpu"))
    init_random(model, seed, float64=float64 and torch.device(device).type == "cpu")
    model.to(device).eval().requires_grad_(False)
    return LoadedModel(model, "random", meta={"seed": seed, "model_config": config.to_dict()})


def load_checkpoint(ckpt_dir, step: Optional[int] = None, device="cpu",
                    dtype: torch.dtype = torch.float32) -> LoadedModel:
    """Load a nanochat checkpoint directory (the newest step unless `step` is given)."""
    ckpt_dir, step = find_step(ckpt_dir, step)
    meta_path = ckpt_dir / f"meta_{step:06d}.json"
    model_path = ckpt_dir / f"model_{step:06d}.pt"
    meta = read_meta(meta_path)
    try:
        config = GPTConfig.from_dict(meta["model_config"])
    except (ConfigError, TypeError) as e:
        raise UserError(f"{meta_path.name}: {e}") from e
    check_model_memory(config, device, file=model_path, mmap=can_mmap(model_path))
    sd = read_state_dict(model_path)
    # older checkpoints predate these per-layer scalars; their neutral values reproduce them
    sd.setdefault("resid_lambdas", torch.ones(config.n_layer))
    sd.setdefault("x0_lambdas", torch.zeros(config.n_layer))
    expected = param_shapes(config)  # checked before the model's memory is allocated
    missing = sorted(set(expected) - set(sd))
    unexpected = sorted(set(sd) - set(expected))
    no_smear = "transformer.wte.weight" in sd and smear_keys_missing(sd)  # a model, from before the smear
    if no_smear and not unexpected and set(missing) <= {*SMEAR_KEYS, "backout_lambda"}:  # came together
        raise NoSmearParameters(f"{model_path.name}: no smear parameters: issue #756 cannot affect this model")
    if missing or unexpected:
        def names(keys):  # plain names as they are; odd ones (empty, blanks) quoted
            shown = [k if k.isprintable() and k.strip() == k and " " not in k and k else repr(k) for k in keys[:6]]
            return ", ".join(shown) + (f" ... ({len(keys)} in all)" if len(keys) > 6 else "")
        parts = []
        if missing:
            parts.append("missing " + names(missing))
        if unexpected:
            parts.append("unexpected " + names(unexpected))
        if no_smear:
            parts.append("it has no smear parameters either, so issue #756 cannot affect it")
        raise UserError(f"{model_path.name}: state dict does not match model_config: " + "; ".join(parts))
    check_tensors(model_path.name, sd, expected)
    # built on the meta device and handed the checkpoint's tensors (assign=True): no memory is
    # filled by a default init that the weights would overwrite at once (see random_model)
    with torch.device("meta"), mock.patch.object(nn.Embedding, "reset_parameters", lambda self: None):
        model = GPT(config)
    # bf16 tensors (GPU-trained embeddings) are widened here; set_dtype picks the compute dtype
    model.load_state_dict({k: v.float() for k, v in sd.items()}, strict=True, assign=True)
    model.set_dtype(dtype).to(device).eval().requires_grad_(False)
    return LoadedModel(model, str(ckpt_dir), step=step, meta=meta)


def save_checkpoint(model: GPT, ckpt_dir, step: int, meta: Optional[dict] = None) -> Path:
    """Write `model` in nanochat's format (model_XXXXXX.pt + meta_XXXXXX.json), atomically."""
    from ..util.files import atomic_write

    ckpt_dir = Path(ckpt_dir)
    ckpt_dir.mkdir(parents=True, exist_ok=True)
    meta = dict(meta or {})
    meta["step"] = step
    meta["model_config"] = model.config.to_dict()
    sd = {k: v.detach().cpu() for k, v in model.state_dict().items()}
    with atomic_write(ckpt_dir / f"model_{step:06d}.pt", "wb") as f:
        torch.save(sd, f)
    with atomic_write(ckpt_dir / f"meta_{step:06d}.json", "w") as f:
        json.dump(meta, f, indent=2)
    return ckpt_dir / f"model_{step:06d}.pt"


# -- the shipped model ----------------------------------------------------------------------------
def tiny_model(device="cpu", dtype: torch.dtype = torch.float32) -> LoadedModel:
    """The tiny byte-level nanochat model trained by examples/train_tiny.py."""
    if not TINY_DIR.is_dir() or not list_steps(TINY_DIR):
        raise UserError(f"the tiny model's checkpoint is missing from {TINY_DIR}; reinstall smearcli "
                        "or recreate it with examples/train_tiny.py")
    loaded = load_checkpoint(TINY_DIR, device=device, dtype=dtype)
    loaded.source = "tiny"
    return loaded


def byte_model(checkpoint=None, device="cpu", dtype=torch.float32) -> LoadedModel:
    """The tiny model, or the byte-level checkpoint directory given; a UserError for a model whose
    vocabulary is not the 256 bytes."""
    loaded = load_checkpoint(checkpoint, device=device, dtype=dtype) if checkpoint else tiny_model(device, dtype)
    if not loaded.model.config.is_byte_level:
        raise UserError(f"{loaded.name}: not a byte-level model (vocab {loaded.model.config.vocab_size})")
    return loaded
