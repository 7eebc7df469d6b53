"""The random model: one sizing rule for --depth, --preset and weights.random_config, and seeded
weights drawn in place in the dtype they are stored in."""

import json

import pytest
import torch
from typer.testing import CliRunner

from smearcli.gpt import weights
from smearcli.cli import build
from smearcli.cli.app import app
from smearcli.cli.options import RunSpec, PresetName
from smearcli.gpt.config import PRESETS, nanochat_shape, preset_config


class Built(Exception):
    pass


def config_built(monkeypatch, spec: RunSpec):
    """The config build_setup hands to random_model for `spec` (nothing is built)."""
    def record(config, **_):
        raise Built(config)
    monkeypatch.setattr(build, "random_model", record)
    with pytest.raises(Built) as e:
        build.build_setup(spec)
    return e.value.args[0]


@pytest.mark.parametrize("depth", range(1, 9))
def test_depth_alone_and_small_preset_build_the_same_config(monkeypatch, depth):
    alone = config_built(monkeypatch, RunSpec(depth=depth))
    small = config_built(monkeypatch, RunSpec(depth=depth, preset=PresetName.small))
    assert alone == small == weights.random_config(depth) == preset_config("small", depth)
    # the rule the --depth help states: width 64 x depth rounded up to 128-dim heads, kv = heads
    width = 128 * -(-64 * depth // 128)
    assert (alone.n_layer, alone.n_embd, alone.head_dim, alone.n_head, alone.n_kv_head) == \
        (depth, width, 128, width // 128, width // 128)
    assert (alone.vocab_size, alone.sequence_len) == (256, 512)


def test_depth_help_states_the_rule():
    from smearcli.cli.options import SHARED

    text = SHARED["depth"][1].help
    c = nanochat_shape(5)
    assert f"--depth 5: {c.n_embd} wide, {c.n_head} heads" in text and "rounded up" in text


def test_the_default_random_model_is_the_small_preset():
    assert weights.random_config() == preset_config("small") == PRESETS["small"].config()


def test_depth_5_in_compare_json_is_the_small_presets():
    def cfg(*extra):
        r = CliRunner().invoke(app, ["compare", *extra, "--depth", "5", "--seq-len", "8", "--schedules",
                                     "prefill", "--json", "--quiet"])
        assert r.exit_code == 0, r.output
        return json.loads(r.stdout)["model"]["config"]
    alone = cfg()
    assert alone == cfg("--preset", "small")
    assert (alone["n_embd"], alone["n_head"]) == (384, 3)


# -- random weights drawn in place ----------------------------------------------------------------
def plain_uniform_(t, bound, g):  # the plain way to draw: a float32 draw, then a copy
    t.copy_((torch.rand(t.shape, generator=g) * 2 - 1) * bound)


def plain_normal_(t, std, g):
    t.copy_(torch.randn(t.shape, generator=g) * std)


@pytest.mark.parametrize("shape,scale", [((7,), 0.3), ((33, 17), 0.0625), ((128, 256), 1.7), ((1, 24), 0.5)])
def test_draws_in_place_equal_plain_draws_bit_for_bit(shape, scale):
    for new, old in ((weights.uniform_, plain_uniform_), (weights.normal_, plain_normal_)):
        a, b = torch.empty(shape), torch.empty(shape)
        ga, gb = torch.Generator().manual_seed(11), torch.Generator().manual_seed(11)
        new(a, scale, ga)
        old(b, scale, gb)
        assert torch.equal(a, b), new.__name__
        assert torch.equal(torch.rand(3, generator=ga), torch.rand(3, generator=gb))  # same stream left


@pytest.mark.parametrize("depth", [1, 3])
def test_random_model_equals_plain_draws_for_the_same_seed(monkeypatch, depth):
    cfg = weights.random_config(depth, sequence_len=64)
    new = weights.random_model(cfg, seed=7).model.state_dict()
    monkeypatch.setattr(weights, "uniform_", plain_uniform_)
    monkeypatch.setattr(weights, "normal_", plain_normal_)
    old = weights.random_model(cfg, seed=7).model.state_dict()
    assert new.keys() == old.keys()
    for k in new:
        assert torch.equal(new[k], old[k]), k


def test_random_model_draws_without_temporaries_in_its_stored_dtypes(monkeypatch):
    def refuse(*a, **k):
        raise AssertionError("a temporary draw")
    monkeypatch.setattr(torch, "rand", refuse)
    monkeypatch.setattr(torch, "randn", refuse)
    cfg = weights.random_config(2, sequence_len=64)
    m = weights.random_model(cfg, seed=0, dtype=torch.bfloat16).model
    assert m.transformer.wte.weight.dtype == torch.bfloat16 and m.lm_head.weight.dtype == torch.float32
    assert all(ve.weight.dtype == torch.bfloat16 for ve in m.value_embeds.values())
    assert m.dtype == torch.bfloat16
    again = weights.random_model(cfg, seed=0, dtype=torch.bfloat16).model
    assert all(torch.equal(a, b) for a, b in zip(m.state_dict().values(), again.state_dict().values()))
    # the float32 tensors of a bfloat16 model are the float32 model's own
    f32 = weights.random_model(cfg, seed=0).model.state_dict()
    assert torch.equal(m.lm_head.weight, f32["lm_head.weight"])


def test_the_float64_copy_made_while_drawing_is_the_one_converted_after(monkeypatch):
    """`random_model(float64=True)` converts each drawn tensor on a second thread while the next is
    drawn (`weights.Beside`): the weights are the same as without it, bit for bit, and the float64
    copy `precision.float64_model` then makes takes those conversions (no second conversion) and
    equals a copy converted afterwards; a tensor changed since is converted anew."""
    from smearcli.measure import precision

    cfg = weights.random_config(2, sequence_len=64)
    plain = weights.random_model(cfg, seed=5).model
    ahead = weights.random_model(cfg, seed=5, float64=True).model
    assert all(torch.equal(a, b) for a, b in zip(plain.state_dict().values(), ahead.state_dict().values()))
    provided = ahead.__dict__["_float64_provided"]
    drawn = [t for t, _, _ in weights.draws(ahead)]
    shared = {id(t) for t in ahead.lookup_tables()}
    assert set(provided) == {id(t) for t in drawn if id(t) not in shared}  # every drawn tensor but the tables
    with torch.no_grad():
        ahead.lm_head.weight.mul_(2.0)  # changed after its copy was made: that copy is stale
    converted = []
    real = precision.float64_copy
    monkeypatch.setattr(precision, "float64_copy", lambda t: converted.append(t) or real(t))
    twin, want = precision.float64_model(ahead), precision.float64_model(plain)
    ids = {id(t) for t in converted}
    assert id(ahead.lm_head.weight) in ids and id(ahead.transformer.h[0].attn.c_q.weight) not in ids
    assert twin.transformer.h[0].attn.c_q.weight.data_ptr() == provided[id(ahead.transformer.h[0].attn.c_q.weight)][3].data_ptr()
    for (k, a), b in zip(twin.state_dict().items(), want.state_dict().values()):
        assert a.dtype == b.dtype and torch.equal(a, b * 2 if k == "lm_head.weight" else b), k
    assert "_float64_provided" not in ahead.__dict__  # taken once


def test_every_drawn_tensor_is_touched_before_it_is_drawn(monkeypatch):
    """The second thread maps each tensor's memory (`weights._touch`) before the draw writes it:
    never during or after, which would overwrite drawn values with zeros."""
    order = []
    touch = weights._touch
    monkeypatch.setattr(weights, "_touch", lambda t: (touch(t), order.append(("touch", id(t)))))
    for name, fill in list(weights.FILLS.items()):
        monkeypatch.setitem(weights.FILLS, name, lambda t, s, g, _f=fill: (order.append(("draw", id(t))), _f(t, s, g)))
    model = weights.random_model(weights.random_config(1, sequence_len=64), seed=0).model
    for t, _, _ in weights.draws(model):
        assert order.index(("touch", id(t))) < order.index(("draw", id(t)))
