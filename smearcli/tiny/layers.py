"""How a tiny config spells its layers, and its layer orders: one config per layer kind, that kind
as layer 0.

Cache code often reads its length or sizes a mask from layer 0 (`get_seq_length()` defaults to
`layer_idx=0`), so a hybrid derived with attention first hides a bug that the other order shows.
Derivation keeps one layer of each kind in the defaults' order (`tiny.derive`); this module makes
the others:

- `layout(d, per, idx)` finds how a shrunk config dict spells its layers: per-layer lists (layer
  kinds, block types, per-layer flags), index lists (the attention layers' indices), per-layer
  dicts keyed by index, and period/offset pairs (`attn_layer_period` style);
- `orders(d, lay)` is the defaults' order first, then, for every other kind, the order with that
  kind's first layer moved to the front (the rest in default order);
- `reorder(d, lay, order)` rewrites the dict for one order; `label` names each layer's kind.

How the census reads the records of an architecture's orders (the worst heads it; a finding only
another order shows is `latent`) is the transformers engine's (`engines.transformers.orders`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

PERIODS = {"attn_layer_period": "attn_layer_offset", "expert_layer_period": "expert_layer_offset"}
SCALARS = (str, int, float, bool, type(None))
# per-layer settings of the MLP alone (dense or MoE, experts, activation sparsity): layers that
# differ only there hold the same cache, so one of them as layer 0 stands for both (an order per
# such kind would double the check's cost and could show no order effect the other misses)
MLP_WORDS = ("mlp", "moe", "expert", "ffn", "sparsity", "intermediate")


@dataclass
class Layout:
    """How one config dict spells its `n` layers (key names; see the module docstring)."""
    n: int
    per: list = field(default_factory=list)
    idx: list = field(default_factory=list)
    maps: list = field(default_factory=list)
    periods: list = field(default_factory=list)  # (period key, offset key)


def looks_per_layer(key: str) -> bool:
    return any(w in key for w in ("layer", "block", "type", "pattern", "sliding", "mlp", "attn", "kind"))


def index_name(key: str) -> bool:
    return any(w in key for w in ("idx", "indices", "layers", "layer_ids"))


def layout(d: dict, count_keys, per=(), idx=()) -> Optional[Layout]:
    """The layers of `d` (None when it has no layer count or no list of them). `per` and `idx` are
    the keys shrinking found per-layer and index lists; overrides that set a layout are found by
    name: a list of `n` values named like a layer list, a list of layer indices named like one."""
    n = next((d[k] for k in count_keys if isinstance(d.get(k), int) and not isinstance(d.get(k), bool)), None)
    if n is None:  # the count is a property of the layer list (NemotronH's layers_block_type)
        lists = [v for k, v in d.items() if looks_per_layer(k) and isinstance(v, list) and v
                 and all(isinstance(x, str) for x in v)]
        n = max((len(v) for v in lists), default=None)
    if not n:
        return None
    lay = Layout(n)
    for k, v in d.items():
        if k in idx or (k not in per and index_name(k) and _indices(v, n) and not _flags(v, n)):
            if _indices(v, n):  # [1]: the attention layers' indices (Bamba's attn_layer_indices)
                lay.idx.append(k)
        elif isinstance(v, (list, str)) and len(v) == n and (k in per or (
                isinstance(v, list) and looks_per_layer(k) and all(isinstance(x, SCALARS) for x in v))):
            lay.per.append(k)
        elif isinstance(v, dict) and v and all(str(x).isdigit() for x in v) and k != "id2label":
            lay.maps.append(k)
    lay.periods = [(p, o) for p, o in PERIODS.items() if isinstance(d.get(p), int) and isinstance(d.get(o), int)]
    return lay


def _indices(v, n: int) -> bool:
    return isinstance(v, list) and bool(v) and all(isinstance(x, int) and not isinstance(x, bool)
                                                   and 0 <= x < n for x in v)


def _flags(v, n: int) -> bool:  # [1, 0]: one flag per layer, not a sorted list of indices
    return len(v) == n and v != sorted(set(v))


def kinds(d: dict, lay: Layout) -> list[tuple]:
    """Each layer's kind as its cache sees it: its per-layer values, then whether each index list
    and period holds it, the MLP's own settings left out (`MLP_WORDS`)."""
    cache = [k for k in lay.per + lay.idx + [p for p, _ in lay.periods] if not any(w in k for w in MLP_WORDS)]
    return [tuple([d[k][i] for k in lay.per if k in cache] + [i in d[k] for k in lay.idx if k in cache]
                  + [i % d[p] == d[o] for p, o in lay.periods if p in cache]) for i in range(lay.n)]


def label(d: dict, lay: Layout, i: int) -> str:
    """Layer `i`'s kind in words, from what tells the layers apart: "linear_attention",
    "full_attention/sparse", "no_rope_layers=0", "in attn_layer_indices", "attn_layer"."""
    parts = [str(d[k][i]) if isinstance(d[k][i], str) else f"{k}={d[k][i]}"
             for k in lay.per if len({str(x) for x in d[k]}) > 1]
    parts += [("in " if i in d[k] else "not in ") + k for k in lay.idx if 0 < len(set(d[k])) < lay.n]
    parts += [("" if i % d[p] == d[o] else "no ") + p.removesuffix("_period") for p, o in lay.periods]
    return "/".join(parts) or f"layer {i}"


def orders(d: dict, lay: Layout) -> list[list[int]]:
    """The defaults' order, then one per other kind: its first layer moved to the front."""
    ks, firsts = kinds(d, lay), []
    for i, k in enumerate(ks):
        if k not in [ks[j] for j in firsts]:
            firsts.append(i)
    return [[f] + [i for i in range(lay.n) if i != f] for f in firsts]


def reorder(d: dict, lay: Layout, order: list[int]) -> dict:
    """`d` with its layers in `order` (old indices, new layer 0 first)."""
    out, new = dict(d), {old: i for i, old in enumerate(order)}
    for k in lay.per:
        v = [d[k][i] for i in order]
        out[k] = "".join(v) if isinstance(d[k], str) else v
    for k in lay.idx:
        out[k] = sorted(new[i] for i in d[k])
    for k in lay.maps:
        out[k] = {type(old)(new[int(old)]): v for old, v in d[k].items() if int(old) in new}
    for p, o in lay.periods:  # an offset that gives the moved layers; else the lists above decide
        held = sorted(new[i] for i in range(lay.n) if i % d[p] == d[o])
        out[o] = next((off for off in range(d[p]) if held == [i for i in range(lay.n) if i % d[p] == off]), d[o])
    return out
