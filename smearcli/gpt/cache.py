"""A KV cache with the smear state, laid out like upstream nanochat's `KVCache`.

k and v: (n_layer, B, max_len, n_kv_head, head_dim); `seqlens`: (B,) int32, all rows at the same
position; `prev_embedding`: the pre-smear normed embedding of the last token seen, (B, 1, C), or
None before the first step.

A step is transactional: the model writes the new keys/values beyond the current position (where
nothing reads them yet) and only `commit()`s the new position and `prev_embedding` after every layer
has succeeded, so a step that raises leaves the cache exactly as it was.
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor


class CacheFullError(RuntimeError):
    """A step would write past the cache's capacity."""


class KVCache:
    def __init__(self, batch_size: int, n_kv_head: int, head_dim: int, n_layer: int,
                 max_len: int, device=None, dtype=torch.float32):
        shape = (n_layer, batch_size, max_len, n_kv_head, head_dim)
        # uninitialised: nothing reads a position before a step has written it (`write` returns
        # only [0, pos+T)), and a d12 cache's zero fill cost about a second of a compare
        self._hold(torch.empty(shape, device=device, dtype=dtype), torch.empty(shape, device=device, dtype=dtype))
        self.seqlens = torch.zeros(batch_size, dtype=torch.int32, device=device)
        self._pos = 0  # mirrors seqlens[0] without a device sync per step
        self.prev_embedding: Optional[Tensor] = None

    def _hold(self, k: Tensor, v: Tensor) -> None:
        """Take k and v, (n_layer, B, max_len, Hkv, D), with a view of each layer made once: a
        decode step reads and writes every layer, and indexing the layer anew costs ops each time."""
        self.k, self.v = k, v
        self._k_layers, self._v_layers = k.unbind(0), v.unbind(0)

    @classmethod
    def for_model(cls, config, batch_size: int, max_len: int, device=None, dtype=torch.float32):
        return cls(batch_size, config.n_kv_head, config.head_dim, config.n_layer, max_len,
                   device=device, dtype=dtype)

    @property
    def batch_size(self) -> int:
        return self.k.size(1)

    @property
    def max_len(self) -> int:
        return self.k.size(2)

    @property
    def n_layer(self) -> int:
        return self.k.size(0)

    def get_pos(self) -> int:
        return self._pos

    def reset(self) -> None:
        self.seqlens.zero_()
        self._pos = 0
        self.prev_embedding = None

    def check_room(self, T: int) -> None:
        if self._pos + T > self.max_len:
            raise CacheFullError(f"cache full: position {self._pos} + {T} new tokens > capacity {self.max_len}")

    def write(self, layer: int, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Store a step's k, v (B, T, Hkv, D) at [pos, pos+T); return all keys/values so far."""
        end = self._pos + k.size(1)
        keys, values = self._k_layers[layer], self._v_layers[layer]  # (B, max_len, Hkv, D)
        keys[:, self._pos:end] = k
        values[:, self._pos:end] = v
        return keys[:, :end], values[:, :end]

    def commit(self, T: int, last_embedding: Tensor) -> None:
        """Advance by T tokens and remember the step's last pre-smear embedding (B, 1, C)."""
        self.seqlens += T
        self._pos += T
        self.prev_embedding = last_embedding

    def truncate(self, length: int, prev_embedding: Tensor) -> None:
        """Forget every position from `length` on (a rejected speculative draft); the caller gives
        the smear state that goes with the kept prefix: the pre-smear embedding of its last token."""
        if not 0 < length <= self._pos:
            raise ValueError(f"cannot truncate {self._pos} cached tokens to {length}")
        self.seqlens.fill_(length)
        self._pos = length
        self.prev_embedding = prev_embedding

    def copy(self) -> "KVCache":
        """An independent copy: positions, keys, values and the smear state (a rolled-back draft
        restores one where a cache is not cropped)."""
        out = KVCache.__new__(KVCache)
        out._hold(self.k.clone(), self.v.clone())
        out.seqlens = self.seqlens.clone()
        out._pos = self._pos
        out.prev_embedding = None if self.prev_embedding is None else self.prev_embedding.clone()
        return out

    def expand_from(self, other: "KVCache") -> None:
        """Engine-style batch expansion: copy a batch-1 cache into every row of this empty one.

        `prev_embedding` is copied too: without it the first decoded token of every sample would
        lose its smear predecessor, the same class of bug as #756."""
        if self._pos != 0:
            raise ValueError("can only expand into an empty cache")
        if other.batch_size != 1:
            raise ValueError("expand_from takes a batch-1 cache")
        if other.k.shape[0] != self.k.shape[0] or other.k.shape[3:] != self.k.shape[3:]:
            raise ValueError("caches belong to different model shapes")
        n = other.get_pos()
        if n > self.max_len:
            raise CacheFullError(f"cannot expand {n} cached tokens into capacity {self.max_len}")
        self.k[:, :, :n] = other.k[:, :, :n]
        self.v[:, :, :n] = other.v[:, :, :n]
        self.seqlens.fill_(n)
        self._pos = n
        if other.prev_embedding is not None:
            self.prev_embedding = other.prev_embedding.expand(self.batch_size, -1, -1).clone()
