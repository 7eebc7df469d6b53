"""Where models come from: a seeded random model that shows the bug, or a nanochat checkpoint.

Checkpoint format (upstream checkpoint_manager): a directory with `model_{step:06d}.pt` (a
torch.save'd state dict) and `meta_{step:06d}.json` (with `model_config`). Loading never unpickles
arbitrary objects: `torch.load(..., weights_only=True)` only.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

import torch

from .config import ConfigError, GPTConfig
from .errors import UserError
from .model import GPT



def random_config(depth: int = 4, sequence_len: int = 512, vocab_size: int = 256,
                  window_pattern: str = "SSSL") -> GPTConfig:
    """nanochat's sizing rule: width 64 x depth, heads of 128 dims (d4: 256 wide, 2 heads).

    The default (d4, byte vocabulary, context 512 so the short window is 128 tokens) runs in
    seconds on a CPU and has the fixture checkpoint's shape."""
    if depth < 1:
        raise ConfigError(f"depth must be >= 1, got {depth}")
    n_embd = 64 * depth
    n_head = -(-n_embd // 128)
    while n_embd % n_head:
        n_head += 1
    return GPTConfig(sequence_len=sequence_len, vocab_size=vocab_size, n_layer=depth, n_head=n_head,
                     n_kv_head=n_head, n_embd=n_embd, window_pattern=window_pattern)

_MODEL_RE = re.compile(r"^model_(\d+)\.pt$")


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


@torch.no_grad()
def init_random(model: GPT, seed: int = 0) -> GPT:
    """Fill `model` with seeded random weights that make the smear bug visible.

    Starts from upstream's init scales, then departs where upstream's init would hide the bug:
    upstream zeroes `smear_lambda` and both output projections, so a fresh model has no smear
    and no attention/MLP output at all. Here `smear_lambda` = 0.5 (trained nanochat models learn
    about 0.5-0.6), the smear gate is spread so gates differ per token, both projections get
    small uniform weights, and lm_head is larger so logits carry signal."""
    g = torch.Generator().manual_seed(seed)
    cfg = model.config
    C = cfg.n_embd
    s = 3 ** 0.5 * C ** -0.5  # uniform bound with std 1/sqrt(C)

    def uniform_(t, bound):
        t.copy_((torch.rand(t.shape, generator=g) * 2 - 1) * bound)

    def normal_(t, std):
        t.copy_(torch.randn(t.shape, generator=g) * std)

    normal_(model.transformer.wte.weight, 0.8)
    normal_(model.lm_head.weight, 0.05)
    for block in model.transformer.h:
        uniform_(block.attn.c_q.weight, s)
        uniform_(block.attn.c_k.weight, s)
        uniform_(block.attn.c_v.weight, s)
        uniform_(block.attn.c_proj.weight, s * 0.5)  # upstream: zeros
        uniform_(block.mlp.c_fc.weight, s * 0.4)
        uniform_(block.mlp.c_proj.weight, s * 0.25)  # upstream: zeros
        if block.attn.ve_gate is not None:
            uniform_(block.attn.ve_gate.weight, 0.5)
    n = cfg.n_layer
    for i in range(n):
        model.resid_lambdas[i] = 1.15 - 0.10 * i / max(n - 1, 1)
        model.x0_lambdas[i] = 0.20 - 0.15 * i / max(n - 1, 1)
    model.smear_lambda.fill_(0.5)  # upstream: 0
    normal_(model.smear_gate.weight, 0.5)  # upstream: uniform(0, 0.02)
    model.backout_lambda.fill_(0.2)
    for ve in model.value_embeds.values():
        uniform_(ve.weight, s)
    return model


def random_model(config: Optional[GPTConfig] = None, seed: int = 0, device="cpu",
                 dtype: torch.dtype = torch.float32) -> LoadedModel:
    config = config or random_config()
    model = GPT(config)
    init_random(model, seed)
    model.set_dtype(dtype).to(device).eval().requires_grad_(False)
    return LoadedModel(model, "random", meta={"seed": seed, "model_config": config.to_dict()})


def list_steps(ckpt_dir: Path) -> list[int]:
    """Steps that have both a model_*.pt and a meta_*.json, ascending."""
    steps = []
    for p in ckpt_dir.iterdir():
        m = _MODEL_RE.match(p.name)
        if m and (ckpt_dir / f"meta_{m.group(1)}.json").is_file():
            steps.append(int(m.group(1)))
    return sorted(steps)


def _read_meta(path: Path) -> dict:
    try:
        meta = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError) as e:
        raise UserError(f"{path.name}: cannot read ({e})") from e
    except json.JSONDecodeError as e:
        raise UserError(f"{path.name}: invalid JSON ({e.msg} at line {e.lineno})") from e
    if not isinstance(meta, dict) or "model_config" not in meta:
        raise UserError(f"{path.name}: no model_config in the meta JSON")
    return meta


def _read_state_dict(path: Path) -> dict:
    try:
        sd = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # noqa: BLE001 - every failure here means the same to the user
        msg = str(e).splitlines()[0] if str(e) else type(e).__name__
        if "weights_only" in str(e) or "Unsupported global" in str(e):
            raise UserError(f"{path.name}: refused, it needs arbitrary unpickling, which can run code "
                            f"(only plain tensors are loaded): {msg}") from e
        raise UserError(f"{path.name}: not a readable torch checkpoint ({msg})") from e
    if not isinstance(sd, dict) or not all(isinstance(v, torch.Tensor) for v in sd.values()):
        raise UserError(f"{path.name}: expected a state dict of tensors")
    return {k.removeprefix("_orig_mod."): v for k, v in sd.items()}


def load_checkpoint(ckpt_dir, step: Optional[int] = None, device="cpu",
                    dtype: torch.dtype = torch.float32) -> LoadedModel:
    """Load a nanochat checkpoint directory (the newest step unless `step` is given)."""
    ckpt_dir = Path(os.path.expanduser(str(ckpt_dir)))
    if not ckpt_dir.is_dir():
        raise UserError(f"{ckpt_dir}: checkpoint directory not found")
    steps = list_steps(ckpt_dir)
    if not steps:
        raise UserError(f"{ckpt_dir}: no model_XXXXXX.pt / meta_XXXXXX.json pair found")
    if step is None:
        step = steps[-1]
    elif step not in steps:
        raise UserError(f"{ckpt_dir}: no step {step}; present: {', '.join(map(str, steps))}")
    meta_path = ckpt_dir / f"meta_{step:06d}.json"
    model_path = ckpt_dir / f"model_{step:06d}.pt"
    meta = _read_meta(meta_path)
    try:
        config = GPTConfig.from_dict(meta["model_config"])
    except (ConfigError, TypeError) as e:
        raise UserError(f"{meta_path.name}: {e}") from e
    sd = _read_state_dict(model_path)
    model = GPT(config)
    # older checkpoints predate these per-layer scalars; their neutral values reproduce them
    sd.setdefault("resid_lambdas", torch.ones(config.n_layer))
    sd.setdefault("x0_lambdas", torch.zeros(config.n_layer))
    expected = model.state_dict()
    missing = sorted(set(expected) - set(sd))
    unexpected = sorted(set(sd) - set(expected))
    if missing or unexpected:
        parts = []
        if missing:
            parts.append("missing " + ", ".join(missing[:6]) + (" ..." if len(missing) > 6 else ""))
        if unexpected:
            parts.append("unexpected " + ", ".join(unexpected[:6]) + (" ..." if len(unexpected) > 6 else ""))
        raise UserError(f"{model_path.name}: state dict does not match model_config: " + "; ".join(parts))
    for k, v in sd.items():
        if tuple(v.shape) != tuple(expected[k].shape):
            raise UserError(f"{model_path.name}: {k} has shape {tuple(v.shape)}, "
                            f"model_config expects {tuple(expected[k].shape)}")
        if not v.is_floating_point():
            raise UserError(f"{model_path.name}: {k} has dtype {v.dtype}, expected a float tensor")
        if not torch.isfinite(v).all():
            raise UserError(f"{model_path.name}: {k} contains NaN or Inf; refusing to run on it")
    # bf16 tensors (GPU-trained embeddings) are widened here; set_dtype picks the compute dtype
    model.load_state_dict({k: v.float() for k, v in sd.items()}, strict=True)
    model.set_dtype(dtype).to(device).eval().requires_grad_(False)
    return LoadedModel(model, str(ckpt_dir), step=step, meta=meta)


def save_checkpoint(model: GPT, ckpt_dir, step: int, meta: Optional[dict] = None) -> Path:
    """Write `model` in nanochat's format (model_XXXXXX.pt + meta_XXXXXX.json), atomically."""
    from .io import atomic_write

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
