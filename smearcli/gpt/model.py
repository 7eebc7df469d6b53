"""The nanochat GPT, reimplemented from the architecture facts (the nanochat-architecture spec of
issue #756's report; upstream's numbers are in tests/fixtures/), number for number.

Parameter names and shapes match upstream, so a nanochat state dict loads with strict=True.
Shapes in comments: B batch, T tokens in this step, C n_embd, H query heads, Hkv kv heads,
D head_dim, V padded vocab.

The one deliberate departure from upstream's structure: smearing is not written inline but taken
from `smearcli.gpt.smear.LOGICS`, so the same weights can run under the old (buggy) and the fixed logic.
"""

from __future__ import annotations

import functools
from unittest import mock
from typing import Optional

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch import Tensor

from .cache import KVCache
from .config import SMEAR_GATE_CHANNELS, VE_GATE_CHANNELS, GPTConfig
from .smear import TAKES_BOS, get_logic, smear_gate

ROTARY_BASE = 100000
SOFTCAP = 15.0
QK_SCALE = 1.2  # applied to q and k after QK-norm: sharper attention


def rms_norm(x: Tensor) -> Tensor:
    # no learnable weight, default eps, over the last dim
    return F.rms_norm(x, (x.size(-1),))


class Linear(nn.Linear):
    """A bias-free linear layer whose weight is cast to the activation dtype at use, as upstream
    does instead of autocast: master weights stay fp32, the matmul runs in the compute dtype."""

    def __init__(self, in_features: int, out_features: int):
        super().__init__(in_features, out_features, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        w = self.weight  # no cast at all where the dtypes agree: a decode step has 28 of these calls
        return F.linear(x, w if w.dtype == x.dtype else w.to(dtype=x.dtype))


def apply_rotary(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """Rotate the two halves of each head by -theta (upstream's convention). x: (B, T, H, D);
    cos and sin: the full-width tables of `rotary_tables`, (1, T, 1, D).

    Upstream writes [x1*cos + x2*sin, x1*(-sin) + x2*cos] for the halves x1, x2. With
    cos = [cos, cos], sin = [sin, -sin] and the halves swapped, x*cos + swapped*sin is the same
    products added in the other order, so every element is bit for bit upstream's (IEEE addition
    commutes) in 4 ops instead of 10: a decode step runs this once per layer, for q and k together."""
    d = x.size(3) // 2
    swapped = torch.cat([x[..., d:], x[..., :d]], dim=3)
    return x * cos + swapped * sin


def rotary_tables(head_dim: int, length: int, dtype: torch.dtype, device=None) -> tuple[Tensor, Tensor]:
    """(1, length, 1, head_dim) full-width cos and sin for `apply_rotary`: the per-frequency tables
    of upstream (inverse frequencies from ROTARY_BASE, in fp32, then cast) laid out [cos, cos] and
    [sin, -sin] over the two halves of a head."""
    inv_freq = 1.0 / (ROTARY_BASE ** (torch.arange(0, head_dim, 2, dtype=torch.float32, device=device) / head_dim))
    freqs = torch.outer(torch.arange(length, dtype=torch.float32, device=device), inv_freq)
    cos, sin = freqs.cos().to(dtype), freqs.sin().to(dtype)  # (length, D/2)
    return torch.cat([cos, cos], 1)[None, :, None, :], torch.cat([sin, -sin], 1)[None, :, None, :]


def document_mask(lengths, device=None) -> Tensor:
    """(T, T) bool: query i may see key j when j <= i and both lie in the same document (documents
    of `lengths`, back to back): the document-causal mask of packed training rows."""
    doc = torch.repeat_interleave(torch.arange(len(lengths), device=device),
                                  torch.tensor(list(lengths), device=device))
    T = doc.numel()
    causal = torch.ones(T, T, dtype=torch.bool, device=device).tril()
    return causal & (doc.unsqueeze(1) == doc.unsqueeze(0))


def attention(q: Tensor, k: Tensor, v: Tensor, window: int, doc_mask: Optional[Tensor] = None) -> Tensor:
    """Causal attention of Tq queries on the last Tq of Tk keys, with a left window.

    q: (B, H, Tq, D), k and v: (B, Hkv, Tk, D). A query at absolute position i sees keys
    i-window..i. The three branches follow upstream's SDPA path so results agree bit for bit:
    a plain causal kernel when the window covers everything, key slicing for one query,
    and an explicit mask aligned to the cache position otherwise."""
    Tq, Tk = q.size(2), k.size(2)
    gqa = q.size(1) != k.size(1)
    if doc_mask is not None:  # a packed row without a cache, each document seeing only itself
        rows, cols = torch.arange(Tq, device=q.device).unsqueeze(1), torch.arange(Tk, device=q.device).unsqueeze(0)
        mask = doc_mask & ((rows - cols) <= window)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=gqa)
    if Tq == Tk and window >= Tq:
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=gqa)
    if Tq == 1:
        if window < Tk:
            start = max(0, Tk - (window + 1))
            k, v = k[:, :, start:], v[:, :, start:]
        return F.scaled_dot_product_attention(q, k, v, is_causal=False, enable_gqa=gqa)
    rows = (Tk - Tq) + torch.arange(Tq, device=q.device).unsqueeze(1)  # absolute query positions
    cols = torch.arange(Tk, device=q.device).unsqueeze(0)
    mask = cols <= rows
    if window < Tk:
        mask = mask & ((rows - cols) <= window)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=gqa)


class CausalSelfAttention(nn.Module):
    def __init__(self, config: GPTConfig, layer: int):
        super().__init__()
        self.layer = layer
        self.n_head, self.n_kv_head, self.head_dim = config.n_head, config.n_kv_head, config.head_dim
        C = config.n_embd
        self.c_q = Linear(C, self.n_head * self.head_dim)
        self.c_k = Linear(C, self.n_kv_head * self.head_dim)
        self.c_v = Linear(C, self.n_kv_head * self.head_dim)
        self.c_proj = Linear(C, C)
        # value-embedding gate: per kv head, from the first VE_GATE_CHANNELS of the block input
        self.ve_gate = Linear(VE_GATE_CHANNELS, self.n_kv_head) if config.has_ve(layer) else None

    def forward(self, x: Tensor, ve: Optional[Tensor], cos: Tensor, sin: Tensor, window: int,
                cache: Optional[KVCache], doc_mask: Optional[Tensor] = None) -> Tensor:
        B, T, C = x.shape
        q = self.c_q(x).view(B, T, self.n_head, self.head_dim)
        k = self.c_k(x).view(B, T, self.n_kv_head, self.head_dim)
        v = self.c_v(x).view(B, T, self.n_kv_head, self.head_dim)
        if ve is not None:
            # value residual: add the token's value embedding, gated per kv head in (0, 3)
            ve = ve.view(B, T, self.n_kv_head, self.head_dim)
            gate = 3 * torch.sigmoid(self.ve_gate(x[..., :VE_GATE_CHANNELS]))  # (B, T, Hkv)
            v = v + gate.unsqueeze(-1) * ve
        # rotary, QK-norm and the scale act on each head alone: q's and k's heads go through them
        # together, one op per step instead of two (the results are bit for bit the same)
        qk = rms_norm(apply_rotary(torch.cat([q, k], dim=2), cos, sin)) * QK_SCALE  # (B, T, H+Hkv, D)
        q, k = qk[:, :, :self.n_head], qk[:, :, self.n_head:]
        if cache is not None:
            k, v = cache.write(self.layer, k, v)  # (B, pos+T, Hkv, D): everything seen so far
        y = attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), window, doc_mask)
        y = y.transpose(1, 2).contiguous().view(B, T, C)
        return self.c_proj(y)


class MLP(nn.Module):
    def __init__(self, config: GPTConfig):
        super().__init__()
        self.c_fc = Linear(config.n_embd, 4 * config.n_embd)
        self.c_proj = Linear(4 * config.n_embd, config.n_embd)

    def forward(self, x: Tensor) -> Tensor:
        return self.c_proj(F.relu(self.c_fc(x)).square())  # relu^2


class Block(nn.Module):
    def __init__(self, config: GPTConfig, layer: int):
        super().__init__()
        self.attn = CausalSelfAttention(config, layer)
        self.mlp = MLP(config)

    def forward(self, x, ve, cos, sin, window, cache, doc_mask=None):
        x = x + self.attn(rms_norm(x), ve, cos, sin, window, cache, doc_mask)
        return x + self.mlp(rms_norm(x))


class GPT(nn.Module):
    """nanochat's GPT. `smear` picks the smear logic ("old" or "fixed") used by forward."""

    def __init__(self, config: GPTConfig, dtype: torch.dtype = torch.float32, smear: str = "fixed"):
        super().__init__()
        self.config = config
        self.dtype = dtype  # the compute dtype of activations
        self.smear = smear
        # forward's `smear=` names a logic of smearcli.gpt.smear.LOGICS (what compare's decode sharing needs)
        self.smear_registry = "smearcli"
        V, C = config.padded_vocab_size, config.n_embd
        kv_dim = config.n_kv_head * config.head_dim
        self.transformer = nn.ModuleDict({
            "wte": nn.Embedding(V, C),
            "h": nn.ModuleList([Block(config, i) for i in range(config.n_layer)]),
        })
        self.lm_head = Linear(C, V)
        self.resid_lambdas = nn.Parameter(torch.ones(config.n_layer))
        self.x0_lambdas = nn.Parameter(torch.zeros(config.n_layer))
        self.smear_gate = Linear(SMEAR_GATE_CHANNELS, 1)
        self.smear_lambda = nn.Parameter(torch.zeros(1))
        self.backout_lambda = nn.Parameter(torch.full((1,), 0.2))
        self.value_embeds = nn.ModuleDict({
            str(i): nn.Embedding(V, kv_dim) for i in range(config.n_layer) if config.has_ve(i)
        })
        self.windows = config.window_sizes
        self._rotary_device = None
        self.cos: Tensor
        self.sin: Tensor

    # -- rotary table ---------------------------------------------------------------------------
    def _rotary(self) -> tuple[Tensor, Tensor]:
        """(1, rotary_len, 1, D) full-width cos and sin in the compute dtype, built once per device."""
        dev = self.transformer.wte.weight.device
        if self._rotary_device != (dev, self.dtype):
            self.cos, self.sin = rotary_tables(self.config.head_dim, self.config.rotary_len, self.dtype, dev)
            self._rotary_device = (dev, self.dtype)
        return self.cos, self.sin

    def set_dtype(self, dtype: torch.dtype) -> "GPT":
        """Store embeddings in the compute dtype (fp32 for fp16, as upstream), the rest in fp32."""
        self.dtype = dtype
        emb_dtype = torch.float32 if dtype == torch.float16 else dtype
        self.float()
        self.transformer.wte.to(emb_dtype)
        for ve in self.value_embeds.values():
            ve.to(emb_dtype)
        self._rotary_device = None
        return self

    @property
    def device(self) -> torch.device:
        return self.transformer.wte.weight.device

    def lookup_tables(self) -> list[Tensor]:
        """The embedding tables (`is_embedding`): only indexed, and every row read is converted to
        the compute dtype before use (`.to(self.dtype)` in `forward`), so a float64 twin
        (`precision.float64_model`) reads them in their stored dtype and shares them."""
        return [p for name, p in self.named_parameters() if is_embedding(name)]

    def new_cache(self, batch_size: int, max_len: int) -> KVCache:
        return KVCache.for_model(self.config, batch_size, max_len, device=self.device, dtype=self.dtype)

    @torch.inference_mode()
    def smear_terms(self, idx: Tensor, bos: Optional[int] = None) -> tuple[Tensor, Tensor, float]:
        """What smearing mixes in, for the analytic check (`smearcli.measure.metrics`): the pre-smear
        embedding x (B, T, C), the gate (B, T, 1), and the scale from the post-smear embedding to
        our first capture point (1: we capture the post-smear embedding itself). With `bos`, the
        gate of a BOS-masked logic: zero where the token is `bos`."""
        x = rms_norm(self.transformer.wte(idx).to(self.dtype))
        gate = smear_gate(x, self.smear_gate.weight, self.smear_lambda)
        if bos is not None:
            gate = gate.masked_fill((idx == bos).unsqueeze(-1), 0.0)
        return x, gate, 1.0

    # -- forward --------------------------------------------------------------------------------
    def forward(self, idx: Tensor, cache: Optional[KVCache] = None, smear: Optional[str] = None,
                capture: Optional[list] = None, bos: Optional[int] = None, documents=None) -> Tensor:
        """idx: (B, T) token ids -> logits (B, T, vocab_size) in fp32.

        With a cache, the tokens sit at positions [pos, pos+T) and the cache advances by T once
        the step has succeeded. `capture`, if a list, receives fp32 copies of the post-smear
        embedding and every block's output, each (B, T, C). `bos`: the BOS id, which a BOS-masked
        logic (`smear.TAKES_BOS`) needs. `documents`: lengths of the documents packed in the row
        (no cache): attention then stays inside each document (the smear does not)."""
        B, T = idx.shape
        cfg = self.config
        pos = 0 if cache is None else cache.get_pos()
        if pos + T > cfg.rotary_len:
            raise ValueError(f"positions up to {pos + T} exceed the rotary table ({cfg.rotary_len})")
        if cache is not None:
            cache.check_room(T)
        cos, sin = self._rotary()
        cos, sin = cos[:, pos:pos + T], sin[:, pos:pos + T]

        x = rms_norm(self.transformer.wte(idx).to(self.dtype))  # (B, T, C), pre-smear
        prev = None if cache is None else cache.prev_embedding
        logic = smear or self.smear
        smear_fn = get_logic(logic)
        x_pre = x
        if logic in TAKES_BOS:
            if bos is None:
                raise ValueError(f"the {logic} smear logic needs the BOS token id (bos=)")
            x = smear_fn(x, self.smear_gate.weight, self.smear_lambda, prev, cache is not None,
                         is_bos=(idx == bos).unsqueeze(-1))
        else:
            x = smear_fn(x, self.smear_gate.weight, self.smear_lambda, prev, cache is not None)
        doc_mask = None
        if documents is not None:
            if cache is not None or sum(documents) != T:
                raise ValueError(f"documents {list(documents)} must cover the {T} tokens of an uncached call")
            doc_mask = document_mask(documents, idx.device)
        if capture is not None:
            capture.append(x.float())

        x0 = x  # the smeared embedding is blended back into every layer
        x_backout = None
        resid, blend = self.resid_lambdas.unbind(0), self.x0_lambdas.unbind(0)  # one op, not one per layer
        for i, block in enumerate(self.transformer.h):
            x = resid[i] * x + blend[i] * x0
            ve = self.value_embeds[str(i)](idx).to(x.dtype) if str(i) in self.value_embeds else None
            x = block(x, ve, cos, sin, self.windows[i], cache, doc_mask)
            if capture is not None:
                capture.append(x.float())
            if i == cfg.backout_layer:
                x_backout = x
        if x_backout is not None:
            # backout: remove the mid-depth residual to drop low-level features before the head
            x = x - self.backout_lambda.to(x.dtype) * x_backout
        logits = self.lm_head(rms_norm(x))[..., :cfg.vocab_size].float()
        logits = SOFTCAP * torch.tanh(logits / SOFTCAP)

        if cache is not None:
            cache.commit(T, x_pre[:, -1:, :])
        return logits


# -- the parameter inventory ------------------------------------------------------------------------
@functools.lru_cache(maxsize=16)
def param_shapes(config: GPTConfig) -> dict[str, tuple[int, ...]]:
    """name -> shape of every tensor in `GPT(config).state_dict()`, derived by building the model on
    the meta device: no memory is allocated, and this is the one inventory that loading (checked
    before any weight is read), the memory preflight and the FLOP counts use."""
    # nn.Embedding fills its table with normal_, which on the meta device imports torch's
    # compiler (over a second); shapes need no values, so that one initialiser is skipped
    with torch.device("meta"), mock.patch.object(nn.Embedding, "reset_parameters", lambda self: None):
        net = GPT(config)
    return {k: tuple(v.shape) for k, v in net.state_dict().items()}


def is_embedding(name: str) -> bool:
    """Tables that are looked up, not multiplied: they cost no FLOPs per token."""
    return name.startswith(("transformer.wte.", "value_embeds."))
