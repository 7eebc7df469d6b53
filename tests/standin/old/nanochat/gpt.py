"""Stand-in for nanochat/gpt.py, written for smearcli's tests from the architecture facts in
shared/spec (not upstream code). Same module layout, class names, constructor protocol
(build on the meta device, `to_empty`, `init_weights`, `load_state_dict`), state-dict keys and
`forward(idx, targets=None, kv_cache=None)` as upstream.

The two variants, tests/standin/old and tests/standin/fixed, differ only between the `smear:` and
`end of smear` comments: old smears like upstream at commit 92d63d4 (the #756 bug), fixed takes
the predecessor of a chunk's first token from the cache."""

import os
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

# like upstream's nanochat.common: the compute dtype is fixed at import, NANOCHAT_DTYPE overrides
COMPUTE_DTYPE = getattr(torch, os.environ.get("NANOCHAT_DTYPE", "float32"))


@dataclass
class GPTConfig:
    sequence_len: int = 1024
    vocab_size: int = 256
    n_layer: int = 4
    n_head: int = 2
    n_kv_head: int = 2
    n_embd: int = 256
    window_pattern: str = "SSSL"


def norm(x):
    return F.rms_norm(x, (x.size(-1),))


class Linear(nn.Linear):
    """No bias; the weight is cast to the activation dtype at use."""

    def __init__(self, n_in, n_out):
        super().__init__(n_in, n_out, bias=False)

    def forward(self, x):
        return F.linear(x, self.weight.to(x.dtype))


def rotate(x, cos, sin):
    half = x.size(-1) // 2
    a, b = x[..., :half], x[..., half:]
    return torch.cat([a * cos + b * sin, b * cos - a * sin], dim=-1)


def attend(q, k, v, window):
    """q: (B, Tq, H, D) for the last Tq of the Tk positions in k, v: (B, Tk, Hkv, D)."""
    Tq, Tk = q.size(1), k.size(1)
    i = torch.arange(Tk - Tq, Tk, device=q.device)[:, None]
    j = torch.arange(Tk, device=q.device)[None, :]
    mask = (j <= i) & (i - j <= window)
    y = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                       attn_mask=mask, enable_gqa=q.size(2) != k.size(2))
    return y.transpose(1, 2)


class Attention(nn.Module):
    def __init__(self, config, layer):
        super().__init__()
        self.layer = layer
        self.n_head, self.n_kv_head = config.n_head, config.n_kv_head
        self.head_dim = config.n_embd // config.n_head
        C, kv = config.n_embd, config.n_kv_head * self.head_dim
        self.c_q, self.c_k, self.c_v = Linear(C, C), Linear(C, kv), Linear(C, kv)
        self.c_proj = Linear(C, C)
        self.ve_gate = Linear(12, config.n_kv_head) if layer % 2 == (config.n_layer - 1) % 2 else None

    def forward(self, x, ve, cos_sin, window, kv_cache):
        B, T, C = x.shape
        q = self.c_q(x).view(B, T, self.n_head, self.head_dim)
        k = self.c_k(x).view(B, T, self.n_kv_head, self.head_dim)
        v = self.c_v(x).view(B, T, self.n_kv_head, self.head_dim)
        if ve is not None:
            gate = 3 * torch.sigmoid(self.ve_gate(x[..., :12]))
            v = v + gate.unsqueeze(-1) * ve.view(B, T, self.n_kv_head, self.head_dim)
        cos, sin = cos_sin
        q, k = norm(rotate(q, cos, sin)) * 1.2, norm(rotate(k, cos, sin)) * 1.2
        if kv_cache is not None:
            pos = kv_cache.get_pos()
            k_all, v_all = kv_cache.get_layer_cache(self.layer)
            k_all[:, pos:pos + T], v_all[:, pos:pos + T] = k, v
            k, v = k_all[:, :pos + T], v_all[:, :pos + T]
            if self.layer == kv_cache.n_layers - 1:
                kv_cache.advance(T)
        return self.c_proj(attend(q, k, v, window).reshape(B, T, C))


class MLP(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.c_fc = Linear(config.n_embd, 4 * config.n_embd)
        self.c_proj = Linear(4 * config.n_embd, config.n_embd)

    def forward(self, x):
        return self.c_proj(F.relu(self.c_fc(x)).square())


class Block(nn.Module):
    def __init__(self, config, layer):
        super().__init__()
        self.attn = Attention(config, layer)
        self.mlp = MLP(config)

    def forward(self, x, ve, cos_sin, window, kv_cache):
        x = x + self.attn(norm(x), ve, cos_sin, window, kv_cache)
        return x + self.mlp(norm(x))


class GPT(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.config = config
        L, C = config.n_layer, config.n_embd
        V = -(-config.vocab_size // 64) * 64
        kv = config.n_kv_head * (C // config.n_head)
        self.transformer = nn.ModuleDict({"wte": nn.Embedding(V, C),
                                          "h": nn.ModuleList([Block(config, i) for i in range(L)])})
        self.lm_head = Linear(C, V)
        self.resid_lambdas = nn.Parameter(torch.ones(L))
        self.x0_lambdas = nn.Parameter(torch.zeros(L))
        self.smear_gate = Linear(24, 1)
        self.smear_lambda = nn.Parameter(torch.zeros(1))
        self.backout_lambda = nn.Parameter(torch.full((1,), 0.2))
        self.value_embeds = nn.ModuleDict({str(i): nn.Embedding(V, kv) for i in range(L)
                                           if i % 2 == (L - 1) % 2})
        short = -(-config.sequence_len // 4 // 128) * 128
        self.windows = [config.sequence_len if config.window_pattern[i % len(config.window_pattern)] == "L"
                        else short for i in range(L)]
        self.windows[-1] = config.sequence_len
        half = C // config.n_head // 2
        self.register_buffer("cos", torch.empty(1, 10 * config.sequence_len, 1, half), persistent=False)
        self.register_buffer("sin", torch.empty(1, 10 * config.sequence_len, 1, half), persistent=False)

    @torch.no_grad()
    def init_weights(self):
        # a test double: real weights are always loaded next, so plain small values do
        for p in self.parameters():
            p.fill_(0.01)
        D = self.config.n_embd // self.config.n_head
        dev = self.transformer.wte.weight.device
        inv_freq = 1.0 / (100000 ** (torch.arange(0, D, 2, dtype=torch.float32, device=dev) / D))
        freqs = torch.outer(torch.arange(self.cos.size(1), dtype=torch.float32, device=dev), inv_freq)
        self.cos = freqs.cos().to(COMPUTE_DTYPE)[None, :, None, :]
        self.sin = freqs.sin().to(COMPUTE_DTYPE)[None, :, None, :]

    def get_device(self):
        return self.transformer.wte.weight.device

    def forward(self, idx, targets=None, kv_cache=None):
        B, T = idx.shape
        # as upstream: the rotary table must be in the module's compute dtype, read at call time
        assert self.cos.dtype == COMPUTE_DTYPE, f"rotary table in {self.cos.dtype}, not {COMPUTE_DTYPE}"
        T0 = 0 if kv_cache is None else kv_cache.get_pos()
        cos_sin = self.cos[:, T0:T0 + T], self.sin[:, T0:T0 + T]
        x = norm(self.transformer.wte(idx).to(COMPUTE_DTYPE))

        # smear: mix a gated copy of the previous token's embedding into each token
        gate = self.smear_lambda.to(x.dtype) * torch.sigmoid(self.smear_gate(x[..., :24]))
        if kv_cache is None:
            x = torch.cat([x[:, :1], x[:, 1:] + gate[:, 1:] * x[:, :-1]], dim=1)
        else:
            prev, kv_cache.prev_embedding = kv_cache.prev_embedding, x[:, -1:]
            if T > 1:  # taken to start the sequence, even after earlier chunks: the bug
                x = torch.cat([x[:, :1], x[:, 1:] + gate[:, 1:] * x[:, :-1]], dim=1)
            elif prev is not None:
                x = x + gate * prev
        # end of smear

        x0, x_backout = x, None
        for i, block in enumerate(self.transformer.h):
            x = self.resid_lambdas[i] * x + self.x0_lambdas[i] * x0
            ve = self.value_embeds[str(i)](idx).to(x.dtype) if str(i) in self.value_embeds else None
            x = block(x, ve, cos_sin, self.windows[i], kv_cache)
            if i == self.config.n_layer // 2:
                x_backout = x
        x = x - self.backout_lambda.to(x.dtype) * x_backout
        logits = self.lm_head(norm(x))[..., :self.config.vocab_size].float()
        logits = 15 * torch.tanh(logits / 15)
        if targets is not None:
            return F.cross_entropy(logits.flatten(0, 1), targets.flatten(), ignore_index=-1)
        return logits
