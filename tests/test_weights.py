"""The random model: one sizing rule for --depth, --preset and weights.random_config, and seeded
weights drawn in place in the dtype they are stored in."""

import json

import pytest
import torch
from typer.testing import CliRunner

from smearcli import weights
from smearcli.cli import build
from smearcli.cli.app import app
from smearcli.cli.options import RunSpec, PresetName
from smearcli.config import PRESETS, nanochat_shape, preset_config


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
