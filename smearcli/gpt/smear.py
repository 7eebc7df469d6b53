"""Token smearing, in its variants: the one source of truth for all of them.

Smearing mixes a gated copy of the previous token's (normed, pre-smear) embedding into the
current token, a cheap bigram feature:

```text
gate_t = smear_lambda * sigmoid(x_t[:24] . smear_gate)
x_t   <- x_t + gate_t * x_{t-1}
```

Three code paths exist upstream: no cache (training / full forward), a cached step with T > 1
tokens and a cached step with T == 1. `old` reproduces upstream exactly, bug included: a cached
T > 1 step assumes it starts the sequence, so the first token of a later chunk loses its
predecessor even though the cache holds it in `prev_embedding` (nanochat issue #756).
`fixed` uses `prev_embedding` as that predecessor whenever it is set. `bosmask` is `fixed` that
also skips the smear where the current token is BOS (parameter-golf's `not_bos` mask), so a
document packed after another one starts as it would alone: it takes `is_bos` (B, T, 1) besides.

Both functions take x of shape (B, T, C), the pre-smear embedding, and return the post-smear
embedding of the same shape. `prev` is the cache's `prev_embedding` (B, 1, C) or None; `cached`
says whether we run under a KV cache. Neither touches the cache: the caller stores the new
`prev_embedding` (x[:, -1:]), so a failed step can leave the cache untouched.
"""

from __future__ import annotations

from typing import Callable, Optional

import torch
from torch import Tensor

from .config import SMEAR_GATE_CHANNELS
from ..util.defaults import ALL_LOGICS, BOS_MASKED


def smear_gate(x: Tensor, gate_weight: Tensor, smear_lambda: Tensor) -> Tensor:
    """gate for every token of x: (B, T, C) -> (B, T, 1)."""
    # Why .contiguous(): x is often a slice along T (x[:, 1:]), and then at batch > 1 its rows
    # cannot be flattened into one matrix without a copy. PyTorch's matmul then picks its
    # kernel from whether the weight requires grad, even under no_grad/inference_mode: if it
    # does, it copies and runs one mm; if not, it runs a bmm, which rounds differently (1 ulp
    # here, ~1e-5 in the logits). Upstream's loaded parameters keep requires_grad=True, ours
    # may not; copying first makes the flattened mm the only path, so we match upstream
    # whatever requires_grad says. At batch 1, or on an unsliced x, both paths are the same mm.
    g = torch.nn.functional.linear(x[..., :SMEAR_GATE_CHANNELS].contiguous(), gate_weight.to(x.dtype))
    return smear_lambda.to(x.dtype) * torch.sigmoid(g)


def _smear_within(x: Tensor, gate_weight: Tensor, smear_lambda: Tensor) -> Tensor:
    """Smear positions 1.. from their in-chunk predecessors; position 0 is left alone."""
    gate = smear_gate(x[:, 1:], gate_weight, smear_lambda)  # (B, T-1, 1)
    return torch.cat([x[:, :1], x[:, 1:] + gate * x[:, :-1]], dim=1)


def smear_old(x: Tensor, gate_weight: Tensor, smear_lambda: Tensor,
              prev: Optional[Tensor], cached: bool) -> Tensor:
    """Upstream nanochat's smear (commit 92d63d4), bug included."""
    T = x.size(1)
    if not cached:
        return _smear_within(x, gate_weight, smear_lambda)
    if T > 1:
        # treated as "start of sequence" even when the cache already holds tokens: the bug
        return _smear_within(x, gate_weight, smear_lambda)
    return smear_one_token(x, gate_weight, smear_lambda, prev)


def smear_one_token(x: Tensor, gate_weight: Tensor, smear_lambda: Tensor, prev: Optional[Tensor]) -> Tensor:
    """A cached step of one token (decode): both logics run this very function (`ONE_TOKEN_STEP`)."""
    if prev is None:
        return x  # the sequence's first token: nothing to smear from
    return x + smear_gate(x, gate_weight, smear_lambda) * prev.to(x.dtype)


def smear_fixed(x: Tensor, gate_weight: Tensor, smear_lambda: Tensor,
                prev: Optional[Tensor], cached: bool) -> Tensor:
    """The fix proposed in issue #756: the chunk's first token takes `prev` when it is set."""
    if x.size(1) == 1:
        # a lone uncached token has no predecessor; a cached one is a decode step
        return smear_one_token(x, gate_weight, smear_lambda, prev) if cached else x
    if not cached:
        return _smear_within(x, gate_weight, smear_lambda)  # the fix leaves this branch as is
    # The fix computes the gate over the whole step and takes the rows it needs. At a true start
    # of sequence that is gate[:, 1:], which is not bit-equal to a gate computed from x[:, 1:]
    # (the matmul splits its rows differently), so it is done the same way here.
    gate = smear_gate(x, gate_weight, smear_lambda)  # (B, T, 1)
    if prev is None:
        # a true start of sequence: the first token has no predecessor
        return torch.cat([x[:, :1], x[:, 1:] + gate[:, 1:] * x[:, :-1]], dim=1)
    predecessors = torch.cat([prev.to(x.dtype), x[:, :-1]], dim=1)  # (B, T, C)
    return x + gate * predecessors


def smear_bos_masked(x: Tensor, gate_weight: Tensor, smear_lambda: Tensor, prev: Optional[Tensor],
                     cached: bool, is_bos: Optional[Tensor] = None) -> Tensor:
    """The fixed smear, skipped where the current token is BOS (`is_bos` (B, T, 1); None: no
    token is BOS, and this is `smear_fixed` bit for bit)."""
    out = smear_fixed(x, gate_weight, smear_lambda, prev, cached)
    return out if is_bos is None else torch.where(is_bos, x, out)


SmearFn = Callable[[Tensor, Tensor, Tensor, Optional[Tensor], bool], Tensor]

# The registry every caller (model, CLI, notebooks, tests) picks a logic from, in display order.
LOGICS: dict[str, SmearFn] = {"old": smear_old, "fixed": smear_fixed, BOS_MASKED: smear_bos_masked}
assert tuple(LOGICS) == ALL_LOGICS
TAKES_BOS = frozenset({BOS_MASKED})  # logics called with `is_bos=` (the model needs the BOS id)


# The function each logic's cached one-token step (T == 1, cached=True) calls, whatever `prev`.
# A fact about the code above, checked by tests/core/test_presets.py on random inputs: when two
# logics map to the same function, their decode runs are the same computation, bit for bit.
ONE_TOKEN_STEP: dict[str, Callable] = {"old": smear_one_token, "fixed": smear_one_token}


def get_logic(name: str) -> SmearFn:
    try:
        return LOGICS[name]
    except KeyError:
        raise ValueError(f"unknown smear logic {name!r}; choose from {', '.join(LOGICS)}") from None
