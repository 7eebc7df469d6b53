"""Hugging Face models through their own cache API (the optional extra `hf`)."""

import time

import pytest
import torch

pytest.importorskip("transformers", reason="transformers is not installed: pip install 'smearcli[hf]'")

from smearcli.util.errors import UserError  # noqa: E402
from smearcli.engines import transformers as hf  # noqa: E402
from smearcli.engines.transformers import api  # noqa: E402
from smearcli.engines.transformers.cache_runner import CacheRunner  # noqa: E402
from smearcli.util.defaults import DEFAULT_SCHEDULES  # noqa: E402
from smearcli.measure.schedules import runnable  # noqa: E402

# what check_model and compare --impl hf run by default: the default schedules its runner can run
HF_DEFAULT = [s for s in DEFAULT_SCHEDULES if runnable(CacheRunner, s)]

T = 48


def _check(model, **kw):
    return hf.check_model(model, hf.random_tokens(model, T), chunks=3, **kw)


def test_llama_is_consistent():
    model, info = hf.load("llama")
    check = _check(model, source=info.source)
    assert check.passed, check.table()
    assert [m.schedule for m in check.metrics] == list(HF_DEFAULT)
    assert check.get("chunked").steps == [16, 16, 16]
    assert check.layers[0] == "emb" and check.layers[-1] == "logits"
    assert info.cache_keyword in api.KEYWORDS
    assert any(info.transformers_version in n for n in check.notes)


@pytest.mark.parametrize("bug_layer", [0, 1])
def test_standin_chunk_boundary_bug_located(bug_layer):
    from hf_standin import shift_model
    check = _check(shift_model(bug_layer))
    assert not check.passed
    assert {m.schedule for m in check.failures} == {"chunked", "speculative"}
    m = check.get("chunked")
    assert check.born_at(m) == (f"layer{bug_layer}", 16)
    assert check.start_share(m) > 0.999  # born exactly on the chunk starts
    assert "born at layer%d@16, the first chunk start (16)" % bug_layer in check.verdict
    # the same model with the state carried is consistent: the check reacts to the bug, not the model
    assert _check(shift_model(-1)).passed


def test_builtin_names_build_and_run_fast():
    """Every built-in config runs every schedule; numbers are printed, not asserted, since whether
    a given transformers release still has a real bug (Mamba v1) is not this test's business."""
    t0 = time.time()
    for name in hf.TINY_CONFIGS:
        model, info = hf.load(name)
        check = _check(model, source=info.source)
        chunked = check.get("chunked")
        print(f"{name}: chunked max|dlogit| {chunked.max_abs_logits:.2g}, decode {check.noise.per_layer[-1]:.2g}")
        assert check.get("prefill").passed and check.get("decode").passed
        assert torch.isfinite(check.reference.logits).all()
    assert time.time() - t0 < 20


def test_local_dir_roundtrip_and_refusals(tmp_path):
    model = hf.tiny_model("llama")
    model.save_pretrained(tmp_path / "m")
    loaded, info = hf.load(str(tmp_path / "m"))
    ids = hf.random_tokens(model, 8)
    with torch.inference_mode():
        assert torch.equal(model(ids).logits, loaded(ids).logits)
    assert info.source == str(tmp_path / "m")
    pickled = tmp_path / "pickled"
    pickled.mkdir()
    (pickled / "config.json").write_text((tmp_path / "m" / "config.json").read_text())
    (pickled / "pytorch_model.bin").write_bytes(b"not loaded")
    with pytest.raises(UserError, match="only pickled weights"):
        hf.load(str(pickled))
    with pytest.raises(UserError, match="neither a built-in"):
        hf.load(str(tmp_path / "missing"))
