"""The preflight refuses, before anything is allocated or inflated, what could only fail later:
sizes torch cannot address, configs too deep to build on the meta device in reasonable time, and
compressed records that declare more bytes than the config's weights can take."""

from __future__ import annotations

import math
import time
import zipfile

import pytest
import torch

import smearcli.gpt.checkpoint as checkpoint
import smearcli.gpt.model as model
import smearcli.util.preflight as preflight
from hardening_util import META, PT, copy_checkpoint, edit_config, invoke, write_checkpoint
from smearcli.gpt.config import ConfigError, GPTConfig, nanochat_shape
from smearcli.util.errors import UserError
from smearcli.gpt.weights import load_checkpoint
from zip_util import rezip_deflated

GIB = 1 << 30


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    return write_checkpoint(tmp_path_factory.mktemp("pre") / "d1")


@pytest.fixture
def nothing_built(monkeypatch):
    """Fail the test if a model is built, even on the meta device."""
    def refuse(self, *a, **k):
        raise AssertionError("a model was built")
    monkeypatch.setattr(model.GPT, "__init__", refuse)


DEPTH = 2**60  # nanochat's sizing makes it 2^66 wide


@pytest.mark.parametrize("changes, named", [
    (dict(n_embd=10**9, n_head=1, n_kv_head=1), "n_embd 1,000,000,000 is too large"),
    (dict(vocab_size=10**17), "vocab_size 100,000,000,000,000,000 is too large"),
    (dict(sequence_len=10**18), "sequence_len 1,000,000,000,000,000,000 is too large"),
    (dict(n_layer=2**60), f"n_layer {2**60:,} is too large"),
    ("--depth", f"n_embd {64 * DEPTH:,} is too large"),
])
def test_sizes_beyond_what_a_tensor_can_hold_are_refused_by_name(tmp_path, ckpt, nothing_built, changes, named):
    if changes == "--depth":
        with pytest.raises(ConfigError, match=named):
            nanochat_shape(DEPTH)
        r = invoke(["compare", "--depth", str(DEPTH)], allowed=(2,))
        assert f"--depth {DEPTH}: {named}" in r.stderr
        return
    with pytest.raises(ConfigError, match=named):
        GPTConfig(**changes)
    d = copy_checkpoint(ckpt, tmp_path / "big")
    edit_config(d, **changes)
    r = invoke(["compare", "--seq-len", "16", "--checkpoint", d], allowed=(2,))
    assert f"{META}: {named}" in r.stderr


@pytest.mark.parametrize("n_layer", [9, 10, 13])
@pytest.mark.parametrize("shape", [dict(), dict(vocab_size=1000, n_embd=256, n_head=4, n_kv_head=2)])
def test_deep_configs_are_counted_exactly_from_three_layers(monkeypatch, n_layer, shape):
    config = GPTConfig(n_layer=n_layer, **shape)
    inventory = sum(math.prod(s) for s in model.param_shapes(config).values())
    init = model.GPT.__init__

    def shallow_only(self, c, *a, **k):
        assert c.n_layer <= 3, f"built {c.n_layer} layers"  # counted from the 1-, 2- and 3-layer inventories
        init(self, c, *a, **k)
    monkeypatch.setattr(model.GPT, "__init__", shallow_only)
    model.param_shapes.cache_clear()
    assert preflight.param_count(config) == inventory
    t0 = time.perf_counter()
    deep = preflight.param_count(GPTConfig(n_layer=10**6, **shape))  # building it: about 15 minutes
    assert time.perf_counter() - t0 < 2
    per_layer = (preflight.param_count(GPTConfig(n_layer=12, **shape)) - preflight.param_count(config)) / (12 - n_layer)
    assert deep > per_layer * 10**6 * 0.9


def test_compressed_records_beyond_the_configs_weights_are_refused_from_the_index(tmp_path, ckpt, monkeypatch):
    with zipfile.ZipFile(ckpt / PT) as z:
        record = next(n for n in z.namelist() if n.endswith("/data/0"))
    fine = copy_checkpoint(ckpt, tmp_path / "rezipped")  # the control: deflated, but only its weights
    rezip_deflated(ckpt / PT, fine / PT)
    assert not checkpoint.can_mmap(fine / PT)
    assert torch.equal(load_checkpoint(fine).model.lm_head.weight, load_checkpoint(ckpt).model.lm_head.weight)
    bomb = copy_checkpoint(ckpt, tmp_path / "bomb")
    rezip_deflated(ckpt / PT, bomb / PT, {record: GIB})
    with zipfile.ZipFile(bomb / PT) as z, z.open(record) as f:
        assert z.getinfo(record).file_size == GIB and f.read(1 << 20) == bytes(1 << 20)  # a real one
    assert (bomb / PT).stat().st_size < 4 << 20

    def inflates(*a, **k):
        raise AssertionError("a record was inflated")
    monkeypatch.setattr(checkpoint, "zip_members", inflates)  # the CRC pass
    monkeypatch.setattr(torch, "load", inflates)
    with pytest.raises(UserError, match=rf"{PT}: its compressed records inflate to 1\.0 GiB, more than the "
                       r"[\d,]+ parameters of model_config take"):
        load_checkpoint(bomb)
    r = invoke(["compare", "--seq-len", "16", "--checkpoint", bomb], allowed=(2,))
    assert "inflate to 1.0 GiB" in r.stderr
