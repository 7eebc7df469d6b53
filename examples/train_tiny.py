"""Train the tiny byte-level nanochat model that ships with smearcli (`--model tiny`).

Everything here is smearcli's own code: the model is `smearcli.gpt.model.GPT` (nanochat's
architecture), the loop is plain PyTorch (AdamW, warmup then linear decay), and the checkpoint
is written in nanochat's format (`model_XXXXXX.pt` + `meta_XXXXXX.json`) with
`smearcli.gpt.weights.save_checkpoint`, so `smearcli compare --checkpoint DIR` loads it like any
nanochat checkpoint.

The corpus needs no download: the top-level `*.py` files of the running Python's standard
library, in sorted order, concatenated as UTF-8 bytes (byte-level: token id = byte value). The
meta JSON records the Python version, the file list's size and a SHA-256 of the corpus, so a
rerun can tell whether it trained on the same bytes.

    python examples/train_tiny.py                      # the shipped model (about 10 min, 2 cores)
    python examples/train_tiny.py --steps 3 --out /tmp/tiny   # a smoke run

Reproducibility: the same seed, thread count, torch version, CPU kind and corpus give the same
final loss. Different CPUs (or thread counts) may round matmuls differently, which over hundreds
of steps moves the last digits of the loss.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import platform
import sys
import sysconfig
import time
from pathlib import Path

import torch
import torch.nn.functional as F

import smearcli
from smearcli.gpt.config import GPTConfig
from smearcli.gpt.model import GPT
from smearcli.gpt.weights import save_checkpoint

DEFAULT_OUT = Path(smearcli.__file__).resolve().parent / "data" / "tiny"
VAL_FRACTION = 0.05


# -- corpus -------------------------------------------------------------------------------------
def stdlib_corpus(max_bytes: int) -> tuple[bytes, dict]:
    """The top-level standard-library modules, sorted by name, joined by a blank line, cut at
    `max_bytes`. Returns the bytes and a description for the meta JSON."""
    root = Path(sysconfig.get_paths()["stdlib"])
    files = sorted(p for p in root.glob("*.py") if p.is_file())
    if not files:
        raise SystemExit(f"no *.py files under {root}: cannot build the corpus")
    parts, used, total = [], [], 0
    for p in files:
        data = p.read_bytes()
        parts.append(data + b"\n\n")
        used.append(p.name)
        total += len(data) + 2
        if total >= max_bytes:
            break
    corpus = b"".join(parts)[:max_bytes]
    info = {
        "source": "Python standard library, top-level *.py files sorted by name, joined by a blank line",
        "python": platform.python_version(),
        "files": len(used),
        "first_file": used[0],
        "last_file": used[-1],
        "bytes": len(corpus),
        "sha256": hashlib.sha256(corpus).hexdigest(),
        "val_fraction": VAL_FRACTION,
    }
    return corpus, info


# -- init ---------------------------------------------------------------------------------------
@torch.no_grad()
def init_like_nanochat(model: GPT, g: torch.Generator) -> None:
    """nanochat's initial scales (spec: shared/spec/nanochat-architecture.md): both output
    projections and smear_lambda start at zero, so whatever smear the model ends with it learned."""
    C = model.config.n_embd
    s = 3 ** 0.5 * C ** -0.5

    def uniform(t, lo, hi):
        t.copy_(torch.rand(t.shape, generator=g) * (hi - lo) + lo)

    model.transformer.wte.weight.copy_(torch.randn(model.transformer.wte.weight.shape, generator=g) * 0.8)
    model.lm_head.weight.copy_(torch.randn(model.lm_head.weight.shape, generator=g) * 0.001)
    for block in model.transformer.h:
        for lin in (block.attn.c_q, block.attn.c_k, block.attn.c_v):
            uniform(lin.weight, -s, s)
        block.attn.c_proj.weight.zero_()
        uniform(block.mlp.c_fc.weight, -0.4 * s, 0.4 * s)
        block.mlp.c_proj.weight.zero_()
        if block.attn.ve_gate is not None:
            uniform(block.attn.ve_gate.weight, 0.0, 0.02)
    n = model.config.n_layer
    for i in range(n):
        model.resid_lambdas[i] = 1.15 - 0.10 * i / max(n - 1, 1)
        model.x0_lambdas[i] = 0.20 - 0.15 * i / max(n - 1, 1)
    model.smear_lambda.zero_()
    model.backout_lambda.fill_(0.2)
    uniform(model.smear_gate.weight, 0.0, 0.02)
    for ve in model.value_embeds.values():
        uniform(ve.weight, -s, s)


def param_groups(model: GPT, lr: float) -> list[dict]:
    """AdamW groups: block matrices at `lr`, embeddings faster, lm_head slower, scalars their own."""
    emb = [model.transformer.wte.weight] + [ve.weight for ve in model.value_embeds.values()]
    head = [model.lm_head.weight]
    scalars = [model.resid_lambdas, model.x0_lambdas, model.smear_lambda, model.backout_lambda,
               model.smear_gate.weight]
    taken = {id(p) for p in emb + head + scalars}
    matrices = [p for p in model.parameters() if id(p) not in taken]
    return [
        {"params": matrices, "lr": lr, "weight_decay": 0.0},
        {"params": emb, "lr": lr * 5, "weight_decay": 0.0},
        {"params": head, "lr": lr, "weight_decay": 0.0},
        {"params": scalars, "lr": lr * 5, "weight_decay": 0.0},
    ]


def lr_factor(step: int, steps: int, warmup: int) -> float:
    if step < warmup:
        return (step + 1) / warmup
    return 1.0 - 0.9 * (step - warmup) / max(steps - warmup, 1)  # linear decay to 10%


# -- data ---------------------------------------------------------------------------------------
def batch(data: torch.Tensor, batch_size: int, seq_len: int, g: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    starts = torch.randint(0, data.numel() - seq_len - 1, (batch_size,), generator=g)
    rows = torch.stack([data[s:s + seq_len + 1] for s in starts.tolist()])
    return rows[:, :-1], rows[:, 1:]


@torch.no_grad()
def evaluate(model: GPT, data: torch.Tensor, seq_len: int, windows: int) -> float:
    """Mean next-byte loss (nats) over `windows` evenly spaced windows of `data`."""
    model.eval()
    span = data.numel() - seq_len - 1
    starts = [i * span // max(windows - 1, 1) for i in range(windows)]
    losses = []
    for s in starts:
        x = data[s:s + seq_len + 1].unsqueeze(0)
        logits = model(x[:, :-1])
        losses.append(F.cross_entropy(logits.reshape(-1, logits.size(-1)), x[:, 1:].reshape(-1)).item())
    model.train()
    return sum(losses) / len(losses)


def check_out_dir(out: Path) -> str:
    """Why the checkpoint could not be written to `out` ("" when it can): checked before training.
    An existing checkpoint directory is fine: its files for this step are replaced atomically."""
    out = Path(out)
    if out.exists() and not out.is_dir():
        return "exists and is not a directory (give a directory for the checkpoint)"
    parent = next((p for p in [out, *out.parents] if p.exists()), Path("."))
    if not os.access(parent, os.W_OK | os.X_OK):
        return f"{parent} is not writable"
    return ""


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT, help="checkpoint directory (default: the package's data/tiny)")
    ap.add_argument("--steps", type=int, default=500)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=1, help="torch CPU threads (fixed: the thread count "
                    "changes how matmuls split their sums, so it is part of what makes a run reproducible)")
    ap.add_argument("--depth", type=int, default=4)
    ap.add_argument("--n-embd", type=int, default=256)
    ap.add_argument("--n-head", type=int, default=2)
    ap.add_argument("--seq-len", type=int, default=512, help="training sequence length")
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--warmup", type=int, default=25)
    ap.add_argument("--corpus-bytes", type=int, default=4_000_000)
    ap.add_argument("--eval-windows", type=int, default=32)
    ap.add_argument("--storage", choices=["bfloat16", "float32"], default="bfloat16",
                    help="dtype of the saved tensors (bfloat16 keeps the shipped file under 8 MB; "
                         "loading widens them to float32)")
    args = ap.parse_args(argv)
    problem = check_out_dir(args.out)
    if problem:  # before minutes of training, not after
        print(f"train_tiny.py: --out {args.out}: {problem}", file=sys.stderr)
        return 2

    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    t0 = time.time()

    corpus, corpus_info = stdlib_corpus(args.corpus_bytes)
    print(f"corpus: {corpus_info['files']} files of Python {corpus_info['python']}, {corpus_info['bytes']:,} bytes, "
          f"sha256 {corpus_info['sha256'][:16]}...", flush=True)
    data = torch.frombuffer(bytearray(corpus), dtype=torch.uint8).long()
    n_val = int(data.numel() * VAL_FRACTION)
    train, val = data[:-n_val], data[-n_val:]

    config = GPTConfig(sequence_len=512, vocab_size=256, n_layer=args.depth, n_head=args.n_head,
                       n_kv_head=args.n_head, n_embd=args.n_embd, window_pattern="SSSL")
    g_init = torch.Generator().manual_seed(args.seed)
    g_data = torch.Generator().manual_seed(args.seed + 1)
    model = GPT(config)
    init_like_nanochat(model, g_init)
    model.train()
    opt = torch.optim.AdamW(param_groups(model, args.lr), betas=(0.9, 0.95), eps=1e-10)
    base_lrs = [grp["lr"] for grp in opt.param_groups]

    losses = []
    for step in range(args.steps):
        f = lr_factor(step, args.steps, args.warmup)
        for grp, lr in zip(opt.param_groups, base_lrs):
            grp["lr"] = lr * f
        x, y = batch(train, args.batch_size, args.seq_len, g_data)
        logits = model(x)
        loss = F.cross_entropy(logits.reshape(-1, logits.size(-1)), y.reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        losses.append(loss.item())
        if step % 10 == 0 or step == args.steps - 1:
            print(f"step {step:4d}/{args.steps}  loss {loss.item():.4f}  smear_lambda "
                  f"{model.smear_lambda.item():+.3f}  {time.time() - t0:6.1f}s", flush=True)

    tail = losses[-min(20, len(losses)):]
    train_loss = sum(tail) / len(tail)
    val_loss = evaluate(model, val, args.seq_len, args.eval_windows)
    storage = getattr(torch, args.storage)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(p.to(storage).float())  # what the saved file holds, so val loss below is the shipped model's
    val_loss_stored = evaluate(model, val, args.seq_len, args.eval_windows)
    wall = time.time() - t0

    meta = {
        "val_bpb": val_loss_stored / math.log(2),
        "user_config": {"depth": args.depth, "note": "smearcli tiny model: byte-level, trained on CPU "
                        "by examples/train_tiny.py on Python standard-library source"},
        "smearcli_training": {
            "script": "examples/train_tiny.py",
            "args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items() if k != "out"},
            "corpus": corpus_info,
            "optimizer": "AdamW(betas=(0.9, 0.95)), warmup then linear decay to 10%, grad clip 1.0",
            "init": "nanochat's scales: zero output projections, smear_lambda 0",
            "tokens_seen": args.steps * args.batch_size * args.seq_len,
            "final_train_loss": round(train_loss, 4),
            "final_train_loss_note": "mean of the last 20 steps' losses (nats per byte)",
            "val_loss": round(val_loss, 4),
            "val_loss_stored": round(val_loss_stored, 4),
            "val_note": f"next-byte loss (nats) over {args.eval_windows} windows of the held-out last "
                        f"{VAL_FRACTION:.0%} of the corpus; _stored: after rounding to {args.storage}",
            "smear_lambda": round(model.smear_lambda.item(), 4),
            "torch": torch.__version__,
            "threads": args.threads,
            "machine": platform.machine(),
            "wall_seconds": round(wall, 1),
        },
    }
    model.to(storage)
    path = save_checkpoint(model, args.out, args.steps, meta)
    model.float()
    print(f"final train loss {train_loss:.4f}  val loss {val_loss:.4f} ({args.storage}: {val_loss_stored:.4f})  "
          f"smear_lambda {model.smear_lambda.item():+.4f}  {wall:.0f}s")
    print(f"saved {path} ({path.stat().st_size / 1e6:.1f} MB)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
