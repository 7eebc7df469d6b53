"""Stand-in for nanochat/engine.py: only the KV cache, with upstream's constructor and methods.

Layout: k and v are (num_layers, batch, seq_len, num_heads, head_dim); `cache_seqlens` (batch,)
int32 is the position; `prev_embedding` (batch, 1, n_embd) is the last token's pre-smear
embedding, written by the model."""

import torch


class KVCache:
    def __init__(self, batch_size, num_heads, seq_len, head_dim, num_layers, device, dtype):
        self.batch_size = batch_size
        self.max_seq_len = seq_len
        self.n_layers = num_layers
        shape = (num_layers, batch_size, seq_len, num_heads, head_dim)
        self.k_cache = torch.zeros(shape, device=device, dtype=dtype)
        self.v_cache = torch.zeros(shape, device=device, dtype=dtype)
        self.cache_seqlens = torch.zeros(batch_size, dtype=torch.int32, device=device)
        self.prev_embedding = None

    def reset(self):
        self.cache_seqlens.zero_()
        self.prev_embedding = None

    def get_pos(self):
        return int(self.cache_seqlens[0])

    def get_layer_cache(self, layer):
        return self.k_cache[layer], self.v_cache[layer]

    def advance(self, n):
        self.cache_seqlens += n

    def prefill(self, other):
        """Copy a batch-1 cache into every row of this empty one (engine-style expansion)."""
        assert self.get_pos() == 0 and other.batch_size == 1
        n = other.get_pos()
        self.k_cache[:, :, :n] = other.k_cache[:, :, :n]
        self.v_cache[:, :, :n] = other.v_cache[:, :, :n]
        self.cache_seqlens.fill_(n)
        if other.prev_embedding is not None:
            self.prev_embedding = other.prev_embedding.expand(self.batch_size, -1, -1).clone()
