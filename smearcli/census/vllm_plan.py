"""What the census on vLLM runs (`smearcli scan`'s vLLM engine): which architectures, on which
tiny config, under which schedules.

Which architectures: `census.reference.model_types` of the worker's answer (vLLM's ModelRegistry).
`tiny_config(model_type)`: the census's
own tiny config (`derive.derive`, unchanged) with what vLLM's CPU backend needs applied on top
(`adjust`, each change with why); `census.reference.save` writes the directory vLLM loads.
`schedule_entries(config)`: the worker's schedules, chunked
prefill at several budgets among them (`budgets`).
"""

from __future__ import annotations

from typing import Optional

from ..impls.vllm import BLOCK_SIZE
from . import derive

T = 64  # two cache blocks of BLOCK_SIZE (32): the prefix request reads the first
STATE_T = 128  # a model with a conv state: vLLM raises its block until a page holds the Mamba state's (64
# tokens for the tiny hybrids) and caches whole blocks only, so the input is two of those
HEAD = 32  # the smallest head size vLLM's CPU attention takes (32, 64, 80, ... 512); derive's is 16
ODD = 13  # an odd chunk budget that straddles no block, conv width or window edge
DEFAULT_CONV = 4  # the conv width budgets stand on when the model has none
KV_CACHE_BYTES = 16 << 20  # a 64-token sequence of a tiny model needs kilobytes; Mamba states a few MB
HEAD_COUNT_KEYS = ("num_attention_heads", "n_head", "n_heads")  # attention heads, as configs spell them


def adjust(d: dict) -> dict:
    """vLLM's CPU needs on one (text) config dict, as changes {key: new value}:

    - attention heads of HEAD (32): derive makes 4 heads of 16, which the CPU attention refuses,
      so the same width (64) is 2 heads of 32 and the key/value heads 1 (grouped query attention
      kept: 2 query heads share it); a config that spells the head size out gets it as well;
    - positions for the longest request (`length` + 1 rounded up to a block) at least.
    A config without attention heads (Mamba), or with latent attention (MLA), is left as derived."""
    heads_key = next((k for k in HEAD_COUNT_KEYS if isinstance(d.get(k), int)), None)
    width = next((d[k] for k in ("hidden_size", "d_model", "n_embd") if isinstance(d.get(k), int)), None)
    if heads_key is None or width is None:  # "num_heads" alone is an SSM's (Mamba2, xLSTM): left alone
        return {}
    if isinstance(d.get("kv_lora_rank"), int):  # MLA: its head sizes are the rope and nope parts (16 + 16),
        return {}  # and one key/value head per query head, as derived; a head_dim of 32 breaks its rotary
    attn_width = d.get("attention_hidden_size") if isinstance(d.get("attention_hidden_size"), int) else width
    out = {heads_key: max(1, attn_width // HEAD)}
    if isinstance(d.get("head_dim"), int):
        out["head_dim"] = HEAD
    for k in ("num_key_value_heads", "n_head_kv", "num_kv_heads", "multi_query_group_num"):
        if isinstance(d.get(k), int) and d[k] > 1:
            out[k] = 1
    for k in ("max_position_embeddings", "n_positions"):
        if isinstance(d.get(k), int) and d[k] < 2 * STATE_T:
            out[k] = 2 * STATE_T
    return out


def tiny_config(model_type: str):
    """(config, changes {key: value}) of one architecture for vLLM, or (None, why)."""
    got = derive.derive(model_type)
    if got.error:
        return None, got.error
    cfg = got.config
    d = {k: v for k, v in cfg.to_dict().items() if k not in ("transformers_version",)}
    changes = {}
    for key in ("text_config", "language_config", "llm_config"):  # a composite's text part
        if isinstance(d.get(key), dict):
            ch = adjust(d[key])
            d[key] = {**d[key], **ch}
            changes.update({f"{key}.{k}": v for k, v in ch.items()})
    ch = adjust(d)
    d.update(ch)
    changes.update(ch)
    try:
        new = type(cfg)(**{k: v for k, v in d.items() if k != "architectures"})
    except Exception as e:
        return None, f"the tiny config adjusted for vLLM's CPU backend is refused: {type(e).__name__}: {str(e)[:160]}"
    return new, {**got.summary(), **changes}


def conv_width(config) -> Optional[int]:
    from .check import CONV_KEYS, first_int

    return first_int(config, CONV_KEYS)


def length(config) -> int:
    """The input's length: T, or STATE_T for a model with a conv (so a recurrent) state."""
    return STATE_T if conv_width(config) else T


def budgets(config) -> list[int]:
    """Chunked prefill's token budgets: below and at the conv width, one cache block, an odd size.
    Without a conv, one small budget (3) stands for both: nothing in the model has that width."""
    cw = conv_width(config)
    small = (cw - 1, cw) if cw else (DEFAULT_CONV - 1,)
    return sorted({b for b in (*small, BLOCK_SIZE, ODD) if 1 <= b < length(config)})


def one_engine(config) -> bool:
    """Whether one engine, prefix caching on (vLLM's default), serves every schedule: yes without
    a conv state. A model with one gets a second for the prefix schedule: caching on switches vLLM's
    Mamba layers to another path (`mamba_cache_mode` "align"), and the other schedules must run
    the path a model without caching runs."""
    return conv_width(config) is None


def schedule_entries(config) -> list[dict]:
    """The worker's schedules: prefill, chunked at each budget, decode, then prefix (a block) last
    (on the engine the others ran on, or a second: `one_engine`)."""
    return ([{"name": "prefill"}] + [{"name": "chunked", "budget": b} for b in budgets(config)]
            + [{"name": "decode"}, {"name": "prefix", "prefix": BLOCK_SIZE}])


def label(entry: dict) -> str:
    """A schedule's name in the record: "chunked@13" for chunked prefill at a budget of 13."""
    return f"chunked@{entry['budget']}" if entry["name"] == "chunked" else entry["name"]
