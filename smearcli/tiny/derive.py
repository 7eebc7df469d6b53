"""Tiny configs derived from each config class's defaults.

`derive(model_type)` takes the installed transformers' config class for `model_type`, reads its
defaults (`to_dict()`) and shrinks them: width, intermediate sizes, layers, heads, vocabulary,
experts, low-rank projections, SSM heads and state; per-layer lists (layer kinds, block types,
hybrid patterns) are cut to the first layer of each distinct kind, so a hybrid keeps both kinds;
index lists (attention layers, dense layers) are renumbered; periods and offsets are set so that
two layers hold both kinds. Sliding windows become shorter than a chunk (`WINDOW`); blockwise
kernels (SSM chunks, lightning attention, chunked attention, block-sparse indexers) get blocks
below the scan's step widths (`BLOCK`), so steps cross blocks. Composite configs (a text and a
vision config) are shrunk part by part; a multimodal registration whose causal-LM class is declared
on its text config (`text_part`) is derived from that text config, on every release alike.
`Derived.variants` holds one config per layer kind, that kind as layer 0 (`tiny.layers`), the
defaults' order first.

`Derived.changed` records every key derivation set (key -> (default, tiny)); `shrunk_counts` reads
the head and expert counts among them (`COUNTS`), and `default_counts` puts them back to the
config class's defaults, within a memory bound, for the replication of a finding (`engines.transformers.ties`).

Names are matched on the config's own keys, so a new architecture that reuses the common names
is derived with no entry here. `OVERRIDES` holds the few families where derivation alone fails,
each with a comment saying why.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

from . import layers
from .layers import index_name, looks_per_layer

VOCAB = 256
WIDTH = 64
HEADS = 4
HEAD_DIM = 16
WINDOW = 8  # sliding windows: shorter than the scan's chunks (16)
# blockwise kernels' block sizes: below the window and the smallest widths the scan steps by
# (5, 7, 9), so a step boundary falls inside a block and every step of 5 tokens or more crosses
# one: the inter-block path (the carried block state) runs inside the cached steps, not only the
# intra-block one (at the defaults' 256 the scan's 49 tokens all sit in block 0)
BLOCK = 4
SSM_CHUNK = BLOCK  # the chunked SSM scan (Mamba-2 and its hybrids): the chunk state is carried

# The counts a tiny config shrinks that replication restores to the config class's defaults
# (`default_counts`, `engines.transformers.ties`), by what they count; EXACT below sets each key's tiny value.
HEAD_KEYS = ("num_attention_heads", "n_head", "num_heads", "n_heads", "encoder_attention_heads",
             "decoder_attention_heads", "linear_num_value_heads", "linear_num_heads")
KV_HEAD_KEYS = ("num_key_value_heads", "n_head_kv", "num_kv_heads", "multi_query_group_num", "linear_num_key_heads")
EXPERT_KEYS = ("num_experts", "num_local_experts", "n_routed_experts", "moe_num_experts", "num_experts_total")
PER_TOKEN_KEYS = ("num_experts_per_tok", "moe_topk", "top_k", "moe_k", "num_experts_per_token")
EXPERT_GROUP_KEYS = ("n_group", "topk_group", "num_expert_group", "num_group", "group_topk")
INDEXER_KEYS = ("index_n_heads", "index_topk", "index_topk_blocks")
# a sparse-attention indexer's top-k: key -> the tokens one unit of it keeps (a block of BLOCK)
TOKEN_TOPK = {"index_topk": 1, "index_topk_blocks": BLOCK}
# one entry per thing restored together: experts, the experts a token is routed to and their
# groups go as one (a router's top-k of the default count over 4 experts cannot run)
COUNTS = {"attention heads": HEAD_KEYS, "key/value heads": KV_HEAD_KEYS,
          "experts": EXPERT_KEYS + PER_TOKEN_KEYS + EXPERT_GROUP_KEYS,
          "indexer heads": tuple(k for k in INDEXER_KEYS if k not in TOKEN_TOPK),
          "indexer top-k": tuple(TOKEN_TOPK)}
MAX_PARAMS = 50_000_000  # the memory bound of a model at the default counts: 200 MB in float32,
# 400 MB in the float64 twin the confirmation builds, inside the scan's --memory-mb default (3 GiB);
# a tiny config already larger (XLM's embedding width is not one derivation shrinks) is its own bound

# key -> value, for every key a config class spells this way (exact names)
EXACT: dict[str, Any] = {
    "vocab_size": VOCAB,
    # Inkling-2's LM head is `unpadded_vocab_size` wide (its embedding `vocab_size`): shrunk with it,
    # or generate picks ids the shrunk embedding does not hold (an IndexError of our config, not theirs)
    "unpadded_vocab_size": VOCAB,
    **{k: WIDTH for k in ("hidden_size", "d_model", "n_embd", "embedding_dim", "dim", "hidden_dim",
                          "embed_dim", "lru_width", "attention_hidden_size", "word_embed_proj_dim",
                          "d_embed", "hidden_size_per_head_dim")},
    **{k: 128 for k in ("intermediate_size", "ffn_dim", "n_inner", "d_ff", "ffn_hidden_size",
                        "decoder_ffn_dim", "encoder_ffn_dim", "inner_hidden_size", "mlp_dim",
                        "intermediate_dim", "ffn_intermediate_size")},
    **{k: 32 for k in ("moe_intermediate_size", "shared_expert_intermediate_size",
                       "moe_shared_expert_intermediate_size", "expert_intermediate_size")},
    **{k: HEADS for k in HEAD_KEYS},
    **{k: 2 for k in KV_HEAD_KEYS},
    "head_dim": HEAD_DIM,
    "kv_channels": HEAD_DIM,
    **{k: HEAD_DIM for k in ("linear_key_head_dim", "linear_value_head_dim", "qk_nope_head_dim",
                             "v_head_dim", "qk_rope_head_dim", "mamba_d_head", "mamba_headdim",
                             "mamba_head_dim", "ssm_head_dim")},
    **{k: 4 for k in EXPERT_KEYS},
    **{k: 2 for k in PER_TOKEN_KEYS},
    **{k: 1 for k in EXPERT_GROUP_KEYS},
    **{k: 1 for k in ("n_shared_experts", "num_shared_experts", "first_k_dense_replace", "n_groups",
                      "mamba_n_groups", "num_dense_layers")},
    **{k: 32 for k in ("kv_lora_rank", "q_lora_rank", "mamba_dt_rank", "time_step_rank")},
    **{k: 16 for k in ("state_size", "mamba_d_state", "ssm_state_size", "d_state")},
    **{k: 8 for k in ("mamba_n_heads", "n_mamba_heads", "mamba_num_heads")},
    **{k: SSM_CHUNK for k in ("chunk_size", "mamba_chunk_size")},
    # MiniMax's lightning attention: blocks of block_size, the decayed kv state carried between them
    # (BigBird's block_size too, which its decoder ignores: a decoder runs original_full attention)
    "block_size": BLOCK,
    # Llama 4's chunked attention: a token sees its own chunk only, so the cache must drop the
    # previous chunk's keys at each boundary; at 8192 no boundary falls inside the scan's tokens
    "attention_chunk_size": BLOCK,
    # MiniMax-M3's block-sparse indexer: keys pooled in blocks, each query keeps its top blocks;
    # at 128 there is one block (kept whole), at 4 the 49 tokens make 13 and 2 are kept (8 tokens)
    "index_block_size": BLOCK,  # index_topk_blocks 2 (INDEXER_KEYS)
    "mamba_d_ssm": 128,
    "num_nextn_predict_layers": 0,
    "max_position_embeddings": 256,
    "n_positions": 256,
    "context_length": 256,
    "max_sequence_length": 256,
    "attention_window_size": WINDOW,
    "linear_head_dim": HEAD_DIM,
    "rotary_dim": HEAD_DIM // 2,
    "rotary_emb_dim": HEAD_DIM // 2,
    "vocab_size_per_layer_input": VOCAB,
    "hidden_size_per_layer_input": 16,
    "laurel_rank": 8,
    # sparse attention's indexer (DeepSeek-V3.2 and its kin): a top-k under the scan's 49 tokens, so
    # the indexer chooses and its cached keys change the logits (at 2048 it keeps every token)
    **{k: v for k, v in zip(INDEXER_KEYS, (4, 8, 2))},
    "num_kv_shared_layers": 0,
}
# a None default the model reads as a number (DeepSeek-V2's router: topk(k=num_experts_per_tok);
# dots.llm1 sizes its experts by n_routed_experts and n_shared_experts)
NONE_TO = {"head_dim": HEAD_DIM, "num_key_value_heads": 2, "num_experts_per_tok": 2, "n_routed_experts": 4,
           "n_shared_experts": 1}
# sliding windows (Inkling spells it sliding_window_size)
WINDOWS = ("sliding_window", "window_size", "local_window_size", "attention_window", "sliding_window_size")
LAYER_COUNTS = ("num_hidden_layers", "n_layer", "num_layers", "n_layers", "decoder_layers", "num_blocks")
PERIODS = {"attn_layer_period": ("attn_layer_offset", 2, 1), "expert_layer_period": ("expert_layer_offset", 2, 1)}
TOKEN_IDS = ("pad_token_id", "bos_token_id", "eos_token_id", "sep_token_id", "cls_token_id",
             "decoder_start_token_id", "mask_token_id", "unk_token_id")
SUBCONFIGS = ("text_config", "decoder", "language_config", "llm_config", "decoder_config")

# Families whose defaults the rules above do not shrink into a model that builds, key by key.
OVERRIDES: dict[str, dict[str, Any]] = {
    # the Mamba mixers need expand * hidden == heads * head_dim; the generic head count is 8 x 16
    "mamba2": {"num_heads": 8, "head_dim": 16, "expand": 2},
    # the defaults have no attention layer at all (attn_layer_indices None: every layer Mamba),
    # so derivation cannot find both kinds; layer 1 is the attention layer
    "bamba": {"attn_layer_indices": [1]},
    # every default layer is linear attention (Mamba): one of them becomes attention
    "granitemoehybrid": {"layer_types": ["linear_attention", "attention"]},
    # the default leaves layer_types None, which the model indexes; one conv and one attention layer
    "lfm2_moe": {"layer_types": ["conv", "full_attention"]},
    # the defaults make every layer attention (full_attn_idxs: all of them); LFM2 is a conv hybrid
    "lfm2": {"layer_types": ["conv", "full_attention"], "full_attn_idxs": [1]},
    # the Mamba heads must tile mamba_d_ssm (128): 8 heads of 16, not the default head of 8
    "falcon_h1": {"mamba_d_head": 16},
    # the shared transformer block is tied across hybrid layers: it needs two of them (1 and 3)
    # (and its attention reads the concatenated input and embedding: twice the width)
    "zamba": {"attention_hidden_size": 2 * WIDTH, "num_hidden_layers": 4, "layers_block_type": ["linear_attention", "hybrid"] * 2},
    # Zamba2's shared attention reads the concatenated input and embedding as well
    "zamba2": {"attention_hidden_size": 2 * WIDTH},
    # block_types is a 3-layer cycle, not a per-layer list: three layers reach its attention layer.
    # (Its attention width, heads x head_dim, must equal hidden_size: the generic 4 x 16 = 64 holds.
    # A second entry for it, written earlier in this dict, never took effect: a repeated key.)
    "recurrent_gemma": {"num_hidden_layers": 3},
    # xLSTM: at chunk_size 8 the chunkwise kernel fails on the first call (a shape), at 16 the
    # full pass runs and the cached steps reach their xLSTMCache
    "xlstm": {"num_heads": 4, "chunk_size": 16},
}


@dataclass
class Derived:
    """A tiny config (or why there is none) and what derivation changed."""
    model_type: str
    config: Any = None  # a PretrainedConfig
    error: Optional[str] = None  # why no config could be made
    changed: dict = field(default_factory=dict)  # key -> (default, tiny)
    layer_kinds: list = field(default_factory=list)  # the distinct layer kinds kept
    variants: list = field(default_factory=list)  # one `Variant` per layer kind, that kind first

    def summary(self) -> dict:
        return summary(self.changed)


@dataclass
class Variant:
    """One layer order of a derived config: `order` names each layer's kind, layer 0 first."""
    order: list
    config: Any = None
    changed: dict = field(default_factory=dict)
    error: Optional[str] = None  # why the config class refuses this order

    def summary(self) -> dict:
        return summary(self.changed)


def summary(changed: dict) -> dict:
    """The derived values of `changed` (key -> (default, tiny)), by key."""
    return {k: v[1] for k, v in sorted(changed.items())}


def _per_layer_keys(d: dict, L: int) -> list[str]:
    return [k for k, v in d.items() if L > 2 and _per_layer(k, v, L)]


def _per_layer(k: str, v, L: int) -> bool:
    """Whether `v` holds one value per layer. A string is a pattern only under a layer-ish name
    (Whisper's 4 decoder layers and activation_function "gelu" are no pattern); the increasing list
    of every layer's index (Llama 4's moe_layers, LFM2's full_attn_idxs) is an index list."""
    if not isinstance(v, (list, str)) or len(v) != L or k.endswith("_name") or k == "model_type":
        return False
    if isinstance(v, str):
        return len(set(v)) <= 8 and looks_per_layer(k)
    if index_name(k) and v == list(range(L)):
        return False
    numbers = all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in v)
    return numbers or looks_per_layer(k) and all(isinstance(x, (str, int, bool, type(None))) for x in v)


def _index_keys(d: dict, L: int, per_layer: list[str]) -> list[str]:
    return [k for k, v in d.items() if k not in per_layer and isinstance(v, list) and v
            and all(isinstance(x, int) and not isinstance(x, bool) and 0 <= x < L for x in v)
            and index_name(k)]


def pick_layers(d: dict, L: int, per_layer: list[str]) -> list[int]:
    """Indices of the layers kept: the first of each distinct combination of per-layer values,
    at least two (the first two layers when every layer is alike)."""
    seen, keep = set(), []
    for i in range(L):
        kind = tuple(str(d[k][i]) for k in per_layer)
        if kind not in seen:
            seen.add(kind)
            keep.append(i)
    for i in range(L):
        if len(keep) >= 2:
            break
        if i not in keep:
            keep.append(i)
    return sorted(keep)


def shrink(d: dict, model_type: str = "", hints: Optional[dict] = None, settings: Optional[dict] = None,
           layers: Optional[int] = None) -> tuple[dict, dict, list]:
    """(shrunk dict, changes, kept layer kinds) for a config's `to_dict()` (sub-configs too). With
    `hints`, it gets the per-layer and index keys found, per part: "" the config itself, else the
    sub-config's key (what `layers.layout` reorders). An engine that hard-codes part of an
    architecture gives `layers` (keep the first that many layers of the default's pattern: one
    whole period of a pattern it hard-codes) and `settings` (values set last, like `OVERRIDES`)."""
    out, changed = dict(d), {}
    hints = {} if hints is None else hints

    def setk(k, v):
        if k in out and out[k] != v and not isinstance(out[k], bool):
            changed[k] = (out[k], v)
            out[k] = v

    for k, v in EXACT.items():
        if k in out and isinstance(out[k], int) and not isinstance(out[k], bool):
            # never raise a value: a default smaller than the tiny one stays
            setk(k, min(out[k], v) if k not in ("max_position_embeddings", "n_positions") else v)
    if out.get("is_decoder") is False:  # an encoder's LM head: causal only as a decoder (BERT kin)
        setk("is_decoder", True)
    for k, v in NONE_TO.items():
        if k in out and out[k] is None:
            setk(k, v)
    if out.get("default_language") is None and out.get("languages"):  # X-MOD: one adapter per
        setk("default_language", list(out["languages"])[0])  # language; input in none is refused
    if out.get("rope_parameters") == {}:  # an empty default that __init__ fills from the layer types
        out.pop("rope_parameters")
    for k in WINDOWS:
        if isinstance(out.get(k), int) and out[k] > WINDOW:
            setk(k, WINDOW)
    kinds: list = []
    lkey = next((k for k in LAYER_COUNTS if isinstance(out.get(k), int)), None)
    if lkey is not None:
        L = out[lkey]
        per = _per_layer_keys(out, L)
        idx = _index_keys(out, L, per)
        keep = pick_layers(out, L, per) if per or idx else list(range(min(L, 2)))
        if layers is not None:  # the engine's own count: the default's first layers, its pattern as it is
            keep = list(range(min(L, layers)))
        elif idx and not per:  # layers named by index: keep one listed and one unlisted layer each
            listed = set().union(*[set(out[k]) for k in idx])
            inside = [i for i in range(L) if i in listed][:1]
            outside = [i for i in range(L) if i not in listed][:1]
            keep = sorted(set(inside + outside)) if inside and outside else list(range(min(L, 2)))
        for k in per:
            v = out[k]
            setk(k, "".join(v[i] for i in keep) if isinstance(v, str) else [v[i] for i in keep])
        for k in idx:
            setk(k, [n for n, i in enumerate(keep) if i in out[k]])
        for k in per:  # per-layer sizes shrink like the scalar ones
            if k in EXACT and all(isinstance(x, int) for x in out[k]):
                setk(k, [min(x, EXACT[k]) for x in out[k]])
        for k, v in list(out.items()):  # per-layer settings keyed by layer index
            if isinstance(v, dict) and v and all(str(x).isdigit() for x in v) and k not in ("id2label",):
                setk(k, {n: v[i] if i in v else v[str(i)] for n, i in enumerate(keep) if i in v or str(i) in v})
        for k in LAYER_COUNTS:
            if isinstance(out.get(k), int) and out[k] == L:
                setk(k, len(keep))
        kinds = sorted({str(tuple(out[k][i] for k in per)) for i in range(len(keep))}) if per else []
        hints[""] = (per, idx)
    for p, (o, pv, ov) in PERIODS.items():
        if isinstance(out.get(p), int):
            setk(p, pv)
            setk(o, ov)
    for k in TOKEN_IDS:
        v = out.get(k)
        if isinstance(v, int) and v >= VOCAB:
            setk(k, VOCAB - 1 - TOKEN_IDS.index(k))
        elif isinstance(v, list) and any(isinstance(x, int) and x >= VOCAB for x in v):
            setk(k, [x if x < VOCAB else VOCAB - 1 for x in v])
    for k, v in list(out.items()):
        if isinstance(v, dict) and "model_type" in v:
            inner: dict = {}
            sub, ch, sk = shrink(v, v.get("model_type", ""), inner, layers=layers)
            hints[k] = inner.get("", ((), ()))
            out[k] = sub
            changed.update({f"{k}.{a}": b for a, b in ch.items()})
            kinds = kinds or sk
    if isinstance(out.get("kv_lora_rank"), int):  # MLA: keys come out with one head per query head
        setk("num_key_value_heads", out.get("num_attention_heads", HEADS))
    if "qk_head_dim" in out and isinstance(out.get("qk_nope_head_dim"), int):  # derived in __init__
        setk("qk_head_dim", out["qk_nope_head_dim"] + (out.get("qk_rope_head_dim") or 0))
    for k, v in OVERRIDES.get(model_type, {}).items():
        if k in out and out[k] != v:
            changed[k] = (changed.get(k, (out[k],))[0], v)  # the default, not the value shrunk above
            out[k] = v
    for k, v in (settings or {}).items():  # an engine's: a key the config class does not declare is
        if out.get(k, object()) != v:       # written to config.json all the same (released checkpoints carry it)
            changed[k] = (changed.get(k, (out.get(k),))[0], v)
            out[k] = v
    return out, changed, kinds


def causal_lm_types() -> list[str]:
    """Every model type the installed transformers maps to a causal LM, sorted."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    return sorted(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES)


def derive(model_type: str, settings: Optional[dict] = None, layers: Optional[int] = None) -> Derived:
    """The tiny config of one registered architecture, or the reason there is none; `variants`
    holds one config per layer kind, that kind as layer 0 (`tiny.layers`: the defaults' order first).
    `settings` and `layers`: an engine's own (`shrink`)."""
    from transformers import CONFIG_MAPPING

    try:
        cls = CONFIG_MAPPING[model_type]
        default = cls()
    except Exception as e:  # the config class itself is theirs
        return Derived(model_type, error=f"the config class cannot be built with its defaults: "
                                         f"{type(e).__name__}: {str(e)[:160]}")
    part = text_part(cls, default)
    if part is not None:  # a multimodal registration: its causal LM is built from its text config
        default = getattr(default, part)
        cls = type(default)
    d = {k: v for k, v in default.to_dict().items() if k not in ("transformers_version", "architectures")}
    hints: dict = {}
    small, changed, kinds = shrink(d, model_type, hints, settings, layers)
    small["initializer_range"] = small.get("initializer_range", 0.02)
    try:
        cfg = _config(cls, small, changed)
    except Exception as e:
        return Derived(model_type, error=f"the shrunk config is refused: {type(e).__name__}: {str(e)[:160]}",
                       changed=changed)
    out = Derived(model_type, cfg, None, changed, kinds)
    out.variants = layer_orders(cls, small, changed, hints, cfg)
    return out


def text_part(cls, default) -> Optional[str]:
    """The part (`SUBCONFIGS`: text_config, ...) of a composite config `default` (of the registered
    class `cls`) that its causal-LM class is declared on, or None. A multimodal registration (the
    qwen3_5 family, Llama 4) maps its composite config to a causal LM whose `config_class` is the
    text config; some releases build that model from the composite and some do not, so the tiny
    config is derived from the text part, where the causal-LM mapping builds the same class from it."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING

    try:
        model_class = MODEL_FOR_CAUSAL_LM_MAPPING[cls]
    except Exception:  # not mapped by class (a registration by name only): derived as registered
        return None
    wants = getattr(model_class, "config_class", None)
    if not isinstance(wants, type) or isinstance(default, wants):
        return None
    for part in SUBCONFIGS:
        sub = getattr(default, part, None)
        if not isinstance(sub, wants):
            continue
        try:
            if MODEL_FOR_CAUSAL_LM_MAPPING[type(sub)] is model_class:
                return part
        except Exception:  # the text config is not mapped itself: AutoModelForCausalLM could not build it
            return None
    return None


def _config(cls, small: dict, changed: dict):
    cfg = cls(**small)
    if getattr(cfg, "is_decoder", None) is False:  # an encoder's LM head is causal only as a decoder
        cfg.is_decoder = True  # (BERT kin; to_dict() leaves the flag out, so shrink() cannot see it)
        changed["is_decoder"] = (False, True)
    return cfg


def layer_orders(cls, small: dict, changed: dict, hints: dict, cfg) -> list[Variant]:
    """One `Variant` per layer kind of the part that holds the layers (the config, else its text
    part), the defaults' order first (`cfg` itself); one variant when every layer is alike."""
    for part in ("",) + SUBCONFIGS:
        d = small if part == "" else small.get(part)
        if not isinstance(d, dict):
            continue
        per, idx = hints.get(part, ((), ()))
        lay = layers.layout(d, LAYER_COUNTS, per, idx)
        orders = layers.orders(d, lay) if lay else []
        if len(orders) < 2:
            continue
        out = []
        for order in orders:
            names = [layers.label(d, lay, i) for i in order]
            new = layers.reorder(d, lay, order)
            moved = {f"{part}.{k}" if part else k: (d[k], new[k]) for k in new if new[k] != d[k]}
            ch = {**changed, **{k: (changed.get(k, (v[0],))[0], v[1]) for k, v in moved.items()}}
            if order == orders[0]:
                out.append(Variant(names, cfg, changed))
                continue
            try:
                out.append(Variant(names, _config(cls, new if part == "" else {**small, part: new}, ch), ch))
            except Exception as e:  # the config class refuses this order
                out.append(Variant(names, None, ch, f"the config class refuses this layer order: "
                                                    f"{type(e).__name__}: {str(e)[:160]}"))
        return out
    return [Variant([], cfg, changed)]


@dataclass
class Counts:
    """A tiny config with the counts derivation shrank put back to the config class's defaults
    (`default_counts`): `restored` key -> (tiny, default), `skipped` what -> why (over the memory
    bound, refused by the config class or the model), `config` the config to rerun (None when
    nothing was restored)."""
    restored: dict = field(default_factory=dict)
    skipped: dict = field(default_factory=dict)
    config: Any = None

    def entry(self) -> dict:
        """The record's `replication["default_counts"]` without the rerun's summary."""
        return {"restored": {k: list(v) for k, v in sorted(self.restored.items())},
                "skipped": dict(sorted(self.skipped.items()))}

    def words(self) -> str:
        """"num_attention_heads 4 -> 32, num_experts 4 -> 256"."""
        return ", ".join(f"{k} {a} -> {b}" for k, (a, b) in sorted(self.restored.items()))


def shrunk_counts(changed: dict) -> dict[str, dict[str, tuple]]:
    """what (a `COUNTS` entry) -> {key: (default, tiny)}: the counts in `changed` (derivation's key ->
    (default, tiny); a sub-config's key as "part.key") that derivation lowered."""
    out: dict = {}
    for key, (default, tiny) in changed.items():
        name = key.rsplit(".", 1)[-1]
        what = next((w for w, keys in COUNTS.items() if name in keys), None)
        if what and all(isinstance(x, int) and not isinstance(x, bool) for x in (default, tiny)) and default > tiny:
            out.setdefault(what, {})[key] = (default, tiny)
    return out


def rebuilt(config, values: dict):
    """`config` rebuilt by its class from its `to_dict()` with `values` (key, or "part.key", -> value)
    set, head_dim set explicitly (HEAD_DIM) beside every head count set, so more heads do not
    narrow each head of the same width."""
    d = {k: v for k, v in config.to_dict().items() if k not in ("transformers_version", "architectures")}
    for key, v in values.items():
        part, _, name = key.rpartition(".")
        target = d[part] if part else d
        target[name] = v
        if name in HEAD_KEYS + KV_HEAD_KEYS and target.get("head_dim") is None:
            target["head_dim"] = HEAD_DIM
    return _config(type(config), d, {})


def parameters(config) -> int:
    """The parameter count of the model `config` builds, built on the meta device (no memory):
    `default_counts`'s `size` for every engine's census."""
    import torch
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    return sum(p.numel() for p in model.parameters())


def default_counts(config, changed: dict, size, tokens: int, bound: int = MAX_PARAMS) -> Counts:
    """`config` (a derived tiny config, `changed` its derivation) with the counts derivation shrank
    (`shrunk_counts`) restored to their defaults, one `COUNTS` entry at a time in order, each kept
    when the config class takes it and the model's parameter count, `size(config)`, stays within
    `bound` (or the tiny model's own size, where that is larger); an entry that does not is
    `skipped`, with why. An indexer's top-k whose default keeps all of the check's `tokens` is
    skipped too: restored, the indexer would choose nothing. Width, head_dim and everything else
    stay tiny."""
    out = Counts()
    values: dict = {}
    limit = None
    for what, keys in shrunk_counts(changed).items():
        wide = {k: d for k, (d, _) in keys.items() if d * TOKEN_TOPK.get(k.rsplit(".", 1)[-1], 0) >= tokens}
        if wide:
            out.skipped[what] = (f"the default {', '.join(f'{k} {d}' for k, d in wide.items())} keeps every one of "
                                 f"the {tokens} tokens: restored, the indexer would choose nothing")
            continue
        trial = {**values, **{k: default for k, (default, _) in keys.items()}}
        try:
            cfg = rebuilt(config, trial)
        except Exception as e:
            out.skipped[what] = f"the config class refuses the defaults: {type(e).__name__}: {str(e)[:120]}"
            continue
        try:
            n = size(cfg)
        except Exception as e:
            out.skipped[what] = f"the model cannot be built at the defaults: {type(e).__name__}: {str(e)[:120]}"
            continue
        limit = max(bound, size(config)) if limit is None else limit
        if n > limit:
            out.skipped[what] = f"{n / 1e6:.0f}M parameters at the defaults, over the bound of {limit / 1e6:.0f}M"
            continue
        values, out.config = trial, cfg
        out.restored.update({k: (tiny, default) for k, (default, tiny) in keys.items()})
    return out


# -- reading a derived config, and the tiny model built from it (every engine's reference) --------

CONV_KEYS = ("conv_kernel", "mamba_d_conv", "conv1d_width", "linear_conv_kernel_dim", "d_conv", "conv_L_cache")


def text_config(cfg):
    """The config's text part (itself when there is none, or when the choice is ambiguous)."""
    try:
        return cfg.get_text_config()
    except Exception:
        return getattr(cfg, "decoder", None) or cfg


def vocab_of(cfg) -> int:
    """The token ids a check draws below: the model's vocabulary, at most 256 (every engine's)."""
    return min(256, int(getattr(text_config(cfg), "vocab_size", 256) or 256))


def first_int(cfg, keys) -> Optional[int]:
    """The first of `keys` the config (or its text config) sets to an integer above 1."""
    for src in (cfg, text_config(cfg)):
        for k in keys:
            v = getattr(src, k, None)
            if isinstance(v, int) and not isinstance(v, bool) and v > 1:
                return v
    return None


def build(cfg, init: Optional[float], seed: int):
    """The tiny model of `cfg`, float32, in eval mode: built seeded, at the init scale `init`
    (None: the config's own `initializer_range`)."""
    import torch
    from transformers import AutoModelForCausalLM

    if init is not None:
        for sub in {id(c): c for c in (cfg, text_config(cfg))}.values():
            if hasattr(sub, "initializer_range"):
                sub.initializer_range = init
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(cfg)
    return model.float().eval()
