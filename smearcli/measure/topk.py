"""Exact ties in a top-k choice, in any engine's transformers pass (torch-level, engine-free).

A top-k (a sparse-attention indexer, an MoE router) chooses by comparing numbers; where the k-th and
the (k+1)-th are exactly equal, which one is kept depends on the order a kernel evaluates them in.

- `tied(input, k)`: whether a top-k of `input` has such a tie at its edge;
- `watching()`: every top-k call checked while it is open, counted in the `Seen` it yields;
- `tie_break()`: every top-k keeps the lower index among equal values (a stable sort) while open.

The transformers census replicates a bug with them (`engines.transformers.ties`); the llama.cpp
census counts the ties of the transformers reference it compares against (`engines.llamacpp.session`).
"""

from __future__ import annotations

import contextlib

import torch

_TOPK = torch.topk


def _stable(input, k, dim=-1, largest=True, sorted=True, **kw):
    vals, idx = torch.sort(input, dim=dim, descending=largest, stable=True)
    return torch.return_types.topk((vals.narrow(dim, 0, k), idx.narrow(dim, 0, k)))


def tied(input, k: int, dim: int = -1, largest: bool = True) -> bool:
    """Whether a top-k of `input` has an exact tie at its edge: the k-th and (k+1)-th values equal
    and finite in some row."""
    n = input.size(dim) if input.dim() else 1
    if not 0 < k < n or not input.is_floating_point():
        return False
    with torch.no_grad():
        vals = _TOPK(input.detach(), k + 1, dim=dim, largest=largest).values
        a, b = vals.narrow(dim, k - 1, 1), vals.narrow(dim, k, 1)
        return bool(((a == b) & torch.isfinite(a)).any())


@contextlib.contextmanager
def _patched(topk):
    function, method = torch.topk, torch.Tensor.topk
    torch.topk = topk
    torch.Tensor.topk = lambda self, *a, **kw: topk(self, *a, **kw)
    try:
        yield
    finally:
        torch.topk, torch.Tensor.topk = function, method


class Seen:
    """The top-k calls with a tie at their edge while `watching()` was open."""

    def __init__(self):
        self.calls = self.ties = 0


@contextlib.contextmanager
def watching():
    """Every top-k call checked for an exact tie at its edge (`tied`), counted in the `Seen` yielded."""
    seen = Seen()

    def topk(input, k, dim=-1, largest=True, sorted=True, **kw):
        seen.calls += 1
        seen.ties += tied(input, int(k), dim, largest)
        return _TOPK(input, k, dim=dim, largest=largest, sorted=sorted, **kw)

    with _patched(topk):
        yield seen


@contextlib.contextmanager
def tie_break():
    """Every top-k keeps the lower index among equal values (a stable sort), on every path."""
    with _patched(_stable):
        yield
