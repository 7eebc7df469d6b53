"""The model's fused forms are upstream's arithmetic, bit for bit."""

import pytest
import torch
import torch.nn.functional as F

from smearcli.gpt import model as M
from smearcli.gpt.cache import KVCache
from smearcli.gpt.weights import random_config, random_model


def upstream_rotary(x, cos, sin):
    """Upstream's form, on the half-width tables: [x1*cos + x2*sin, x1*(-sin) + x2*cos]."""
    d = x.size(3) // 2
    x1, x2 = x[..., :d], x[..., d:]
    return torch.cat([x1 * cos + x2 * sin, x1 * (-sin) + x2 * cos], dim=3)


def half_tables(D, T, dtype):
    inv_freq = 1.0 / (M.ROTARY_BASE ** (torch.arange(0, D, 2, dtype=torch.float32) / D))
    freqs = torch.outer(torch.arange(T, dtype=torch.float32), inv_freq)
    return freqs.cos().to(dtype)[None, :, None, :], freqs.sin().to(dtype)[None, :, None, :]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_full_width_rotary_is_upstreams_bit_for_bit(dtype):
    D, T = 64, 300
    x = torch.randn(2, T, 5, D, generator=torch.Generator().manual_seed(0)).to(dtype) * 3
    cos, sin = M.rotary_tables(D, T, dtype)
    hc, hs = half_tables(D, T, dtype)
    assert cos.shape == (1, T, 1, D)
    assert torch.equal(cos[..., :D // 2], hc) and torch.equal(sin[..., D // 2:], -hs)
    assert torch.equal(M.apply_rotary(x, cos, sin), upstream_rotary(x, hc, hs))


def test_attention_with_q_and_k_together_is_the_two_apart():
    """One rotary/QK-norm/scale over q's and k's heads at once, against the two done apart as
    upstream does, through a whole cached step of a GQA model."""
    torch.manual_seed(0)
    m = random_model(random_config(2), seed=1).model
    attn = m.transformer.h[0].attn
    B, T, C = 2, 7, m.config.n_embd
    x = torch.randn(B, T, C)
    cos, sin = M.rotary_tables(m.config.head_dim, T, torch.float32)
    hc, hs = half_tables(m.config.head_dim, T, torch.float32)
    with torch.inference_mode():
        got = attn(x, None, cos, sin, T, None)
        q = attn.c_q(x).view(B, T, attn.n_head, attn.head_dim)
        k = attn.c_k(x).view(B, T, attn.n_kv_head, attn.head_dim)
        v = attn.c_v(x).view(B, T, attn.n_kv_head, attn.head_dim)
        q, k = upstream_rotary(q, hc, hs), upstream_rotary(k, hc, hs)
        q, k = F.rms_norm(q, (q.size(-1),)) * M.QK_SCALE, F.rms_norm(k, (k.size(-1),)) * M.QK_SCALE
        y = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True,
                                           enable_gqa=attn.n_head != attn.n_kv_head)
        want = attn.c_proj(y.transpose(1, 2).contiguous().view(B, T, C))
    assert torch.equal(got, want)


def test_a_cache_copy_has_its_own_layer_views():
    c = KVCache(1, 2, 4, 3, 8)
    k = torch.ones(1, 2, 2, 4)
    c.write(1, k, k)
    c.commit(2, torch.zeros(1, 1, 8))
    d = c.copy()
    d.write(1, 2 * k, 2 * k)  # at position 2, in the copy only
    keys, _ = d.write(2, k, k)
    assert keys.shape == (1, 4, 2, 4)  # positions 0..3: two committed, two written
    assert torch.equal(d.k[1, :, 2], 2 * k[:, 0]) and not torch.equal(c.k[1, :, 2], d.k[1, :, 2])
    assert d.k.data_ptr() != c.k.data_ptr()
