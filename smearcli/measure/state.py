"""What a cache carries: every floating-point tensor a cache object holds, by kind, and a runner
that zeroes some kinds of it at chosen positions.

`cache_tensors(cache)` walks a cache object (attributes, lists, tuples, dicts) and names each
tensor's kind: `KV` (attention keys and values), `CONV` (conv taps) or `STATE` (SSM, recurrent and
every other carried state, smearcli's own smear state included). `Zeroing(runner, at, kinds)`
zeroes those kinds after the steps that end at `at`: `smearcli.judging.evidence.power` zeroes once to see
how far a state moves the logits; the census replays "the chunk forgot its state".
"""

from __future__ import annotations

import torch
from torch import Tensor

KV, CONV, STATE = "kv", "conv", "recurrent"  # attention keys/values, conv taps, every other carried state
KV_NAMES = ("keys", "values", "key_cache", "value_cache", "key", "value", "k_cache", "v_cache",
            "k", "v", "_k_layers", "_v_layers")  # the last four: smearcli's own KVCache


def cache_tensors(obj, path: str = "", depth: int = 0, seen=None) -> list[tuple[str, Tensor, str]]:
    """(path, tensor, kind) for every floating-point tensor reachable from a cache object
    (attributes, lists, tuples, dicts; four levels deep). Integer tensors (lengths, positions)
    are bookkeeping, not state."""
    seen = set() if seen is None else seen
    if id(obj) in seen or depth > 4:
        return []
    seen.add(id(obj))
    if isinstance(obj, Tensor):
        if not obj.is_floating_point():
            return []
        parts = path.split(".")
        kind = KV if any(p in KV_NAMES for p in parts) else CONV if "conv" in path.lower() else STATE
        return [(path, obj, kind)]
    items: list = []
    if isinstance(obj, dict):
        items = list(obj.items())
    elif isinstance(obj, (list, tuple)):
        items = list(enumerate(obj))
    elif hasattr(obj, "__dict__") and not isinstance(obj, (torch.nn.Module, type)):
        items = list(vars(obj).items())
    out = []
    for k, v in items:
        if isinstance(v, (torch.dtype, torch.device, str, int, float, bool)) or v is None:
            continue
        out += cache_tensors(v, f"{path}.{k}" if path else str(k), depth + 1, seen)
    return out


def state_of(cache):
    """The object a runner's cache holds its tensors in (a `runner.Holder`'s `inner`)."""
    return cache.inner if hasattr(cache, "inner") and hasattr(cache, "started") else cache


def state_kinds(cache) -> list[str]:
    return sorted({kind for _, t, kind in cache_tensors(state_of(cache)) if t.numel()})


class Zeroing:
    """`inner` with each kind of state in `kinds` zeroed after every step that ends at one of the
    positions `at` (a `Runner` in all but name: run_steps needs new_cache, step and label). Power
    zeroes once; the census replays "the chunk forgot its state" by zeroing at every chunk start."""

    def __init__(self, inner, at, kinds):
        self.inner, self.at, self.kinds = inner, {at} if isinstance(at, int) else set(at), set(kinds)
        self.label, self.layers = inner.label, inner.layers
        self.capabilities, self._pos = frozenset(), {}

    def can(self, capability):
        return False

    def forward(self, tokens, capture):
        return self.inner.forward(tokens, capture)

    def new_cache(self, batch, max_len):
        return self.inner.new_cache(batch, max_len)

    def run(self, schedule, tokens, options):
        return None

    def step(self, tokens, cache, capture):
        out = self.inner.step(tokens, cache, capture)
        pos = self._pos[id(cache)] = self._pos.get(id(cache), 0) + tokens.size(1)
        if pos in self.at:
            with torch.no_grad():
                for _, t, kind in cache_tensors(state_of(cache)):
                    if kind in self.kinds:
                        t.zero_()
        return out
