"""Forward FLOPs of the nanochat GPT, counted from its configuration and parameter inventory.

The counting rule is the usual one for transformers:

- every weight of a matrix multiply costs 2 FLOPs (a multiply and an add) per token it touches:
  the q, k, v and output projections, the MLP, the value-embedding gates, the smear gate and the
  (padded) lm_head. Embedding lookups, norms, rotary, softcap and the per-layer scalars are not
  counted;
- attention costs 4 * n_embd FLOPs per layer for every key a query attends to (2 * head_dim for
  q.k and 2 * head_dim for the weighted sum of values, over n_head heads).

A query at absolute position p attends to min(p + 1, window + 1) keys (itself and up to `window`
predecessors, as `smearcli.gpt.model.attention` masks). This is the exact count; estimates that use
min(context, window) differ by one key per query.

The useful work of a schedule does not depend on how it is split into steps: full, prefill,
chunked and decode all compute the same logits for the same tokens. What differs is how fast the
hardware does it, which is what `smearcli bench` measures against these counts.
"""

from __future__ import annotations

import math
from typing import Optional, Sequence

from .config import GPTConfig
from .model import is_embedding, param_shapes


def matmul_params(config: GPTConfig) -> int:
    """Weights that multiply the token stream once per token in a forward pass: every matrix of
    the model's inventory but the embedding tables (looked up, not multiplied), the padded rows
    of lm_head included (they are computed)."""
    return sum(math.prod(shape) for name, shape in param_shapes(config).items()
               if len(shape) == 2 and not is_embedding(name))


def _keys_attended(start: int, n: int, window: int) -> int:
    """Sum over positions p in [start, start+n) of min(p + 1, window + 1)."""
    cap = window + 1
    lo, hi = start + 1, start + n  # keys seen by the first and the last query, before capping

    def ramp(m: int) -> int:  # 1 + 2 + ... + m
        return m * (m + 1) // 2

    if hi <= cap:
        return ramp(hi) - ramp(lo - 1)
    if lo >= cap:
        return n * cap
    return (ramp(cap) - ramp(lo - 1)) + (hi - cap) * cap


def span_flops(config: GPTConfig, start: int, n: int) -> int:
    """Forward FLOPs of one row over the tokens at positions [start, start + n)."""
    if start < 0 or n < 0:
        raise ValueError(f"start and n must be >= 0, got {start}, {n}")
    attn = sum(4 * config.n_embd * _keys_attended(start, n, w) for w in config.window_sizes)
    return 2 * matmul_params(config) * n + attn


def run_flops(config: GPTConfig, steps: Sequence[int], batch: int, rows: Optional[int] = None,
              expand_at: Optional[int] = None) -> int:
    """Forward FLOPs of a schedule run: `steps` are the step sizes per input row, `batch` the input
    rows. With `expand_at` (engine-style expansion) the first `expand_at` tokens run on `batch`
    rows and the rest on `rows` rows."""
    T = sum(steps)
    if expand_at is None:
        return (rows or batch) * span_flops(config, 0, T)
    return batch * span_flops(config, 0, expand_at) + (rows or batch) * span_flops(config, expand_at, T - expand_at)


def run_tokens(steps: Sequence[int], batch: int, rows: Optional[int] = None,
               expand_at: Optional[int] = None) -> int:
    """Tokens fed through the model by a schedule run (the numerator of tokens per second)."""
    T = sum(steps)
    if expand_at is None:
        return (rows or batch) * T
    return batch * expand_at + (rows or batch) * (T - expand_at)


def matmul_flops(m: int, k: int, n: int) -> int:
    """FLOPs of an (m, k) @ (k, n) matrix multiply."""
    return 2 * m * k * n
