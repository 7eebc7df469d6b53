"""smearcli scan reaches every layer order and block size, and tells theirs from ours:
one derived config per layer kind with that kind as layer 0, blockwise sizes below the scan's
step widths, a failing full pass is `not built`, a failing cached path `crashed`."""

from __future__ import annotations

import dataclasses

import pytest

pytest.importorskip("transformers")

import torch  # noqa: E402
from torch import nn  # noqa: E402
from transformers import AutoConfig, AutoModelForCausalLM, PretrainedConfig, PreTrainedModel  # noqa: E402
from transformers.modeling_outputs import CausalLMOutputWithPast  # noqa: E402

from smearcli.engines.transformers import check  # noqa: E402
from smearcli.measure import shapes  # noqa: E402
from smearcli.census import record  # noqa: E402
from smearcli.engines.transformers import orders  # noqa: E402
from smearcli.tiny import derive, layers  # noqa: E402
from smearcli.judging.verdicts import BUG, CRASHED, LATENT, NOT_BUILT, OK, worst  # noqa: E402

_FIELDS = {f.name for f in dataclasses.fields(CausalLMOutputWithPast)}
_CACHE_FIELD = "cache" if "cache" in _FIELDS else "past_key_values"


# -- a two-kind hybrid whose cache reads its length from layer 0 --------------------------------
class ReachConfig(PretrainedConfig):
    """Attention and recurrent layers, attention first by default (the order that hides the bug);
    `fail`: "" runs, "full" makes the full pass raise, "cached" a multi-token cached step."""
    model_type = "smearcli_reach_standin"

    def __init__(self, vocab_size=1000, hidden_size=128, num_hidden_layers=6, layer_types=None,
                 max_position_embeddings=4096, fail="", **kw):
        self.vocab_size, self.hidden_size = vocab_size, hidden_size
        self.num_hidden_layers, self.max_position_embeddings = num_hidden_layers, max_position_embeddings
        self.layer_types = list(layer_types or ["full_attention", "linear_attention"] * (num_hidden_layers // 2))
        self.fail = fail
        super().__init__(**kw)


class ReachCache:
    """Keys and values for attention layers, a state for recurrent ones: per layer, None if unused."""
    def __init__(self, n):
        self.keys, self.values, self.state = [None] * n, [None] * n, [None] * n

    def get_seq_length(self, layer_idx: int = 0) -> int:
        # the bug class: the length of layer 0's keys, 0 when layer 0 is a recurrent layer
        k = self.keys[layer_idx]
        return 0 if k is None else k.size(1)


class Attention(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.qkv, self.out = nn.Linear(c, 3 * c), nn.Linear(c, c)

    def forward(self, x, cache, i):
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        if cache is not None:
            if cache.keys[i] is not None:
                k, v = torch.cat([cache.keys[i], k], 1), torch.cat([cache.values[i], v], 1)
            cache.keys[i], cache.values[i] = k, v
        T, S = q.size(1), k.size(1)
        mask = torch.ones(T, S, dtype=torch.bool).tril(S - T)  # every cached key, causal among new ones
        att = (q @ k.transpose(1, 2) / q.size(-1) ** 0.5).masked_fill(~mask, float("-inf")).softmax(-1)
        return self.out(att @ v)


class Recurrent(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.inp, self.out = nn.Linear(c, c), nn.Linear(c, c)

    def forward(self, x, cache, i):
        h = cache.state[i] if cache is not None and cache.state[i] is not None else torch.zeros_like(x[:, 0])
        u, outs = self.inp(x), []
        for t in range(x.size(1)):
            h = 0.9 * h + u[:, t]
            outs.append(h)
        if cache is not None:
            cache.state[i] = h
        return self.out(torch.tanh(torch.stack(outs, 1)))


class ReachLM(PreTrainedModel):
    config_class = ReachConfig
    base_model_prefix = "reach"

    def __init__(self, config):
        super().__init__(config)
        c = config.hidden_size
        self.embed, self.pos = nn.Embedding(config.vocab_size, c), nn.Embedding(config.max_position_embeddings, c)
        self.layers = nn.ModuleList(Attention(c) if t == "full_attention" else Recurrent(c) for t in config.layer_types)
        self.head = nn.Linear(c, config.vocab_size, bias=False)
        self.post_init()

    def _init_weights(self, module):
        pass  # torch's default init, seeded by the caller

    def get_input_embeddings(self):
        return self.embed

    def forward(self, input_ids=None, cache=None, use_cache=None, output_hidden_states=None,
                return_dict=None, **kwargs):
        T = input_ids.size(1)
        if self.config.fail == "full" and not use_cache:
            raise ValueError("stand-in: the full pass refuses these inputs")
        if self.config.fail == "cached" and cache is not None and T > 1:
            raise ValueError("stand-in: a cached step over one token")
        if use_cache and cache is None:
            cache = ReachCache(len(self.layers))
        start = cache.get_seq_length() if cache is not None else 0  # layer 0's length
        x = self.embed(input_ids) + self.pos(torch.arange(start, start + T))
        hs = [x]
        for i, layer in enumerate(self.layers):
            x = x + layer(x, cache, i)
            hs.append(x)
        out = {"logits": self.head(x), "hidden_states": tuple(hs) if output_hidden_states else None}
        out[_CACHE_FIELD] = cache if use_cache else None
        return CausalLMOutputWithPast(**out)


@pytest.fixture(scope="module")
def reach():
    """The stand-in registered with transformers' auto classes, as a real architecture is."""
    try:
        AutoConfig.register(ReachConfig.model_type, ReachConfig)
        AutoModelForCausalLM.register(ReachConfig, ReachLM)
    except ValueError:  # already registered in this process
        pass
    return ReachConfig.model_type


def test_census_flags_the_hybrid_only_with_its_recurrent_layer_first(reach):
    d = derive.derive(reach)
    attention_first, recurrent_first = ["full_attention", "linear_attention"], ["linear_attention", "full_attention"]
    assert [v.order for v in d.variants] == [attention_first, recurrent_first]
    # each order on its own: attention first passes, recurrent first is the bug
    alone = {tuple(v.order): check.check(reach, config=v.config) for v in d.variants}
    assert alone[tuple(attention_first)].verdict == OK
    assert alone[tuple(recurrent_first)].verdict == BUG
    rec = check.check(reach)  # the default configuration has attention first: the finding is latent
    assert rec.verdict == LATENT and rec.order == recurrent_first
    assert [(v.order, v.verdict) for v in rec.variants] == [(attention_first, OK), (recurrent_first, BUG)]
    finding = rec.variants[1]
    assert finding.worst_schedule == rec.worst_schedule and finding.max_abs == rec.max_abs > 0
    assert rec.config["layer_types"] == recurrent_first  # the head order's own config
    assert any("only with layer 0 'linear_attention', which the default configuration does not have" in n
               for n in rec.notes)


def test_a_failing_full_pass_is_not_built_and_a_failing_cached_step_crashed(reach):
    cfg = derive.derive(reach).config
    full = check.check(reach, config=ReachConfig(**{**cfg.to_dict(), "fail": "full"}))
    assert full.verdict == NOT_BUILT and "full pass (no cache)" in full.reason
    assert "the full pass refuses" in full.reason
    cached = check.check(reach, config=ReachConfig(**{**cfg.to_dict(), "fail": "cached"}))
    assert cached.verdict == CRASHED and "a cached step over one token" in cached.reason
    assert any(n.endswith("raised; the full pass runs") for n in cached.notes)


# -- derivation: one variant per kind, blockwise sizes ------------------------------------------
def test_one_variant_per_kind_with_that_kind_first():
    d = derive.derive("lara_mini")  # three kinds: linear, sliding, full attention
    default = d.config.layer_types
    assert len(set(default)) == 3 and len(d.variants) == 3
    for kind, v in zip(default, d.variants):
        types = v.config.layer_types
        assert types[0] == kind and [t for t in default if t != kind] == types[1:]  # the rest in order
        assert v.order == types
    assert derive.derive("llama").variants[0].order == [] and len(derive.derive("llama").variants) == 1
    # layers that differ in their MLP alone (dense or MoE) hold the same cache: one order for both
    moe = derive.derive("axk1").config
    assert len(set(moe.mlp_layer_types)) == 2 and len(derive.derive("axk1").variants) == 1
    # NemotronH's MLP-only layers are kinds of their own (such a layer 0 holds no cache at all)
    assert [v.order[0] for v in derive.derive("nemotron_h").variants] == [
        "linear_attention", "moe", "full_attention", "mlp"]


def test_orders_follow_periods_and_index_lists():
    j = derive.derive("jamba")  # attention and experts by period: layer 1 holds both by default
    assert [(v.config.attn_layer_offset, v.config.expert_layer_offset) for v in j.variants] == [(1, 1), (0, 0)]
    assert [v.config.layers_block_type[0] for v in j.variants] == ["mamba", "attention"]
    b = derive.derive("bamba")  # attention named by index
    assert [v.config.attn_layer_indices for v in b.variants] == [[1], [0]]
    r = derive.derive("recurrent_gemma")  # a block cycle: the attention block moves to the front
    assert [v.config.block_types for v in r.variants] == [
        ["recurrent", "recurrent", "attention"], ["attention", "recurrent", "recurrent"]]


def test_reorder_moves_every_per_layer_setting_together():
    d = {"num_hidden_layers": 3, "layer_types": ["a", "b", "c"], "mlp_layer_types": ["dense", "moe", "moe"],
         "full_attn_idxs": [2], "per_layer_config": {"2": {"x": 1}}, "no_rope_layers": [1, 0, 1]}
    lay = layers.layout(d, ("num_hidden_layers",), per=("no_rope_layers",))
    assert layers.orders(d, lay) == [[0, 1, 2], [1, 0, 2], [2, 0, 1]]
    new = layers.reorder(d, lay, [2, 0, 1])
    for old, i in ((2, 0), (0, 1), (1, 2)):  # old layer -> its new place
        assert new["layer_types"][i] == d["layer_types"][old]
        assert new["mlp_layer_types"][i] == d["mlp_layer_types"][old]
        assert new["no_rope_layers"][i] == d["no_rope_layers"][old]
        assert (i in new["full_attn_idxs"]) == (old in d["full_attn_idxs"])
        assert (str(i) in new["per_layer_config"]) == (str(old) in d["per_layer_config"])


def test_blockwise_sizes_fall_below_the_scan_widths():
    sizes = {"mamba2": "chunk_size", "bamba": "mamba_chunk_size", "minimax": "block_size",
             "minimax_m3_vl_text": "index_block_size", "llama4_text": "attention_chunk_size"}
    for mt, key in sizes.items():
        cfg = derive.text_config(derive.derive(mt).config)
        assert 1 < getattr(cfg, key) < 8, (mt, key)
    m3 = derive.derive("minimax_m3_vl_text").config  # the indexer keeps fewer blocks than 49 tokens fill
    assert m3.index_topk_blocks * m3.index_block_size < check.T
    plans = check.split_points(derive.derive("minimax").config)
    assert any(b.startswith("widths around the block") for b in plans)


def test_worst_order_heads_the_record():
    recs = [record.new("x", "ok"), record.new("x", "not built", reason="refused"), record.new("x", "inconclusive")]
    out = orders.combine(recs, [["a", "b", "c"], ["b", "a", "c"], ["c", "a", "b"]])
    assert out.verdict == worst(["ok", "inconclusive"]) and out.order == ["c", "a", "b"]
    assert [v.verdict for v in out.variants] == ["ok", "not built", "inconclusive"]
    one = record.new("x", "ok")
    assert orders.combine([one], [[]]) is one  # one kind: nothing new in the record


def test_a_finding_only_in_an_order_the_defaults_lack_is_latent():
    names = [["attention", "recurrent"], ["recurrent", "attention"]]
    ok, bug = record.new("x", "ok"), record.new("x", "bug", max_abs=0.5)
    out = orders.combine([ok, bug], names)
    assert out.verdict == LATENT and out.order == names[1] and out.max_abs == 0.5
    assert [v.verdict for v in out.variants] == ["ok", "bug"]  # each order says what it showed
    assert "not counted as a bug" in out.notes[-1]
    assert orders.combine([bug, ok], names[::-1]).verdict == BUG  # the defaults' own order: a bug
    crashed = record.new("x", "crashed", reason="x")
    assert orders.combine([crashed, bug], names).verdict == CRASHED  # the defaults' crash outranks



def test_a_finding_in_an_order_a_published_configuration_has_is_a_bug():
    """MiniMax's config class puts full attention first, its published configurations linear
    attention (`orders.PUBLISHED`): a finding with linear attention first is reachable as
    shipped, so a bug; the same order on an architecture without a published layout stays latent."""
    first, _ = orders.PUBLISHED["minimax"]
    names = [["full_attention", first], [first, "full_attention"]]
    ok = record.new("minimax", "ok")
    bug = record.new("minimax", "bug", max_abs=0.5)
    out = orders.combine([ok, bug], names)
    assert out.verdict == BUG and out.order == names[1]
    assert "published configuration" in out.notes[-1]
    other = [dataclasses.replace(r, model_type="llama") for r in (ok, bug)]
    assert orders.combine(other, names).verdict == LATENT


# -- theirs or ours: architectures that crashed on our inputs ------------------------------------
@pytest.mark.parametrize("model_type", ["xmod", "deepseek_v2"])
def test_architectures_run_on_the_inputs_their_config_asks_for(model_type):
    rec = check.check(model_type)
    assert rec.verdict not in (CRASHED, NOT_BUILT), rec.reason


def test_prophetnet_is_a_full_pass_that_leaks_future_tokens():
    """ProphetNet's decoder full pass moves earlier positions when later tokens are removed (its
    n-gram self-attention reads ahead): the reference is the finding (`engines.transformers.causal`), confirmed
    in float64, and no cached schedule (decode, which it accepts; chunks, which it refuses) is
    judged against it."""

    rec = check.check("prophetnet")
    assert rec.verdict == BUG and rec.shape == shapes.LEAK, rec
    assert rec.confirmation.status == BUG and rec.born_at.startswith("logits@")
    assert rec.born_in.class_name == "ProphetNetNgramSelfAttention"
    assert not rec.schedules and not rec.boundaries


def test_a_declared_limit_is_told_from_a_crash():
    """`frames.declared_limit` names an error their code raised to refuse a use; any other error
    (theirs or ours) stays a crash."""
    from smearcli.util import frames

    def theirs(exc):
        code = compile("def forward():\n    raise EXC\n", "/x/site-packages/transformers/models/m/modeling_m.py", "exec")
        ns = {"EXC": exc}
        exec(code, ns)
        try:
            ns["forward"]()
        except BaseException as e:
            return e
    assert frames.declared_limit(theirs(AssertionError("`use_cache` is only supported for length 1")), "transformers")
    assert frames.declared_limit(theirs(NotImplementedError("chunked prefill")), "transformers")
    assert frames.declared_limit(theirs(IndexError("index 3 is out of bounds")), "transformers") is None
    assert frames.declared_limit(theirs(ValueError("shapes do not match")), "transformers") is None
    try:
        raise NotImplementedError("ours")
    except NotImplementedError as e:
        assert frames.declared_limit(e, "transformers") is None  # raised in our code: not their limit

