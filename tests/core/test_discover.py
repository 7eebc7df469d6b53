"""smearcli.gpt.discover: checkpoints found in nanochat's layouts; pre-smear checkpoints recognised."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
import torch

from smearcli.gpt import discover as dc
from smearcli.util.errors import UserError
from smearcli.gpt.checkpoint import NoSmearParameters, smear_keys_missing
from smearcli.gpt.weights import load_checkpoint
from hardening_util import PT, edit_state, write_checkpoint

tiktoken = pytest.importorskip("tiktoken")

from smearcli.gpt import tokenizer as tok  # noqa: E402
from tokenizer_util import build_encoding, write_tokenizer  # noqa: E402


@pytest.fixture(scope="module")
def real(tmp_path_factory):
    """One tiny random model, saved in nanochat's format, whose vocabulary is the test tokenizer's."""
    return write_checkpoint(tmp_path_factory.mktemp("real"), depth=1, step=1, vocab_size=build_encoding().n_vocab)


def plant(leaf: Path, real: Path, *steps: int) -> Path:
    """Copies of the real model/meta pair in `leaf` as the given steps."""
    leaf.mkdir(parents=True, exist_ok=True)
    for s in steps:
        shutil.copy(real / PT, leaf / f"model_{s:06d}.pt")
        shutil.copy(real / "meta_000001.json", leaf / f"meta_{s:06d}.json")
    return leaf


def test_largest_tag_and_newest_step(tmp_path, real):
    ck = tmp_path / "base_checkpoints"
    plant(ck / "d4", real, 5000)
    plant(ck / "d12", real, 999, 1000, 20)
    plant(ck / "d8", real, 7000)
    plant(ck / "latest", real, 9000)  # not dN: only used when no tag is
    (ck / "d32").mkdir()  # no checkpoint in it: skipped
    (ck / "d12" / "model_002000.pt").write_bytes(b"")  # no meta beside it: not a step
    found = dc.discover(ck)
    assert (found.tag, found.step, found.source) == ("d12", 1000, "base")
    assert found.leaf == ck / "d12" and found.base_dir == tmp_path
    assert found.description == "base_checkpoints/d12 step 1000"
    assert dc.discover(ck, model_tag="d4").step == 5000
    assert dc.discover(ck, step=20).leaf == ck / "d12"
    assert dc.discover(tmp_path).leaf == ck / "d12"  # the base directory


def test_tag_fallback_is_most_recently_modified(tmp_path, real):
    ck = tmp_path / "chatsft_checkpoints"
    old, new = plant(ck / "new", real, 1), plant(ck / "old", real, 2)
    os.utime(old, (1_000_000, 1_000_000))
    os.utime(new, (2_000_000, 2_000_000))
    assert dc.pick_model_tag(ck) == "old"  # the folder named "old" was modified last
    os.utime(old, (3_000_000, 3_000_000))
    assert dc.pick_model_tag(ck) == "new"


def test_flat_layout_with_tokenizer_beside(tmp_path, real):
    flat = plant(tmp_path / "nanochat-d1", real, 650)
    write_tokenizer(flat / "tokenizer.pkl")
    found = dc.discover(flat)
    assert (found.leaf, found.step, found.source, found.tag, found.base_dir) == (flat, 650, None, None, None)
    assert found.tokenizer == flat / "tokenizer.pkl"
    assert found.description == f"{flat} step 650"


def test_base_layout_finds_the_shared_tokenizer(tmp_path, real):
    base = tmp_path / "nc"
    leaf = plant(base / "base_checkpoints" / "d1", real, 3)
    write_tokenizer(base / "tokenizer" / "tokenizer.pkl")
    for path in (base, base / "base_checkpoints", leaf):
        found = dc.discover(path)
        assert (found.leaf, found.source, found.tag, found.base_dir) == (leaf, "base", "d1", base), path
        assert found.tokenizer == base / "tokenizer" / "tokenizer.pkl"


def test_env_base_dir_end_to_end(tmp_path, real, monkeypatch):
    """$NANOCHAT_BASE_DIR alone: find the model and tokenizer, load both, run the model on a chat."""
    base = tmp_path / "nanochat"
    plant(base / "chatsft_checkpoints" / "d1", real, 1)
    plant(base / "base_checkpoints" / "d1", real, 1)
    write_tokenizer(base / "tokenizer" / "tokenizer.pkl")
    monkeypatch.setenv("NANOCHAT_BASE_DIR", str(base))
    found = dc.discover()
    assert found.source == "sft" and found.description == "chatsft_checkpoints/d1 step 1"  # as nanochat's chat scripts
    assert dc.discover(source="base").leaf == base / "base_checkpoints" / "d1"
    lm = load_checkpoint(found.leaf, found.step)
    enc = tok.load_tokenizer(found.tokenizer)
    tok.check_vocab(enc, lm.model.config.vocab_size)
    chat = tok.encode_chat(enc, ["hello there", "hi", "why?"], vocab_size=lm.model.config.vocab_size)
    with torch.no_grad():
        logits = lm.model(torch.tensor([chat.ids]))
    assert logits.shape[:2] == (1, len(chat.ids)) and torch.isfinite(logits).all()


def test_default_base_dir(monkeypatch, tmp_path):
    monkeypatch.setenv("NANOCHAT_BASE_DIR", str(tmp_path / "x"))
    assert dc.default_base_dir() == tmp_path / "x"
    monkeypatch.delenv("NANOCHAT_BASE_DIR")
    monkeypatch.setenv("HOME", str(tmp_path))
    assert dc.default_base_dir() == tmp_path / ".cache" / "nanochat"
    with pytest.raises(UserError, match="no nanochat base directory at .*NANOCHAT_BASE_DIR"):
        dc.discover()


def test_errors_say_what_was_looked_for_and_found(tmp_path, real):
    base = tmp_path / "base"
    plant(base / "base_checkpoints" / "d4", real, 10, 20)
    (base / "notes.txt").write_text("x")
    cases = [
        (dict(path=base, source="rl"), "no chatrl_checkpoints folder for rl checkpoints .*found base_checkpoints/, notes.txt"),
        (dict(path=base, model_tag="d20"), "no model tag d20 \\(found d4\\)"),
        (dict(path=base, step=15), "no step 15; present: 10, 20"),
        (dict(path=base, source="gpt"), "unknown checkpoint source 'gpt'; choose base, sft or rl"),
        (dict(path=base, model_tag="../x"), "not a folder name"),
        (dict(path=base / "base_checkpoints", source="sft"), "holds base checkpoints, not sft"),
        (dict(path=base / "base_checkpoints" / "d4", source="sft"), "is a base checkpoint"),
        (dict(path=base / "base_checkpoints" / "d4", model_tag="d8"), "model tag d8 does not apply"),
        (dict(path=base / "notes.txt"), "a file, not a directory"),
        (dict(path=tmp_path / "missing"), "directory not found"),
        (dict(path=tmp_path), "no base_checkpoints, chatsft_checkpoints or chatrl_checkpoints folder .*found base/"),
    ]
    for kwargs, msg in cases:
        with pytest.raises(UserError, match=msg):
            dc.discover(**kwargs)
    empty = tmp_path / "e" / "base_checkpoints"
    (empty / "d4").mkdir(parents=True)
    (empty / "d4" / "notes.txt").write_text("x")
    with pytest.raises(UserError, match="its folders \\(d4\\) hold no model_XXXXXX.pt"):
        dc.discover(empty)
    with pytest.raises(UserError, match="no model_XXXXXX.pt / meta_XXXXXX.json pair \\(found notes.txt\\)"):
        dc.discover(empty, model_tag="d4")
    (empty / "d4").rename(empty.parent / "spare")
    with pytest.raises(UserError, match="no model tag folders"):
        dc.discover(empty)


# -- checkpoints from before the smear ------------------------------------------------------------
SMEAR_ERA = ("smear_gate.weight", "smear_lambda", "backout_lambda")


def _drop(*keys):
    return lambda sd: {k: v for k, v in sd.items() if k not in keys}


def test_pre_smear_checkpoint_is_recognised(tmp_path, real):
    d = shutil.copytree(real, tmp_path / "old")
    sd = torch.load(d / PT, weights_only=True)
    assert not smear_keys_missing(sd)
    assert smear_keys_missing(_drop(*SMEAR_ERA)(sd))
    assert smear_keys_missing({"_orig_mod.lm_head.weight": 0})
    assert not smear_keys_missing({"_orig_mod.smear_lambda": 0})
    edit_state(d, _drop(*SMEAR_ERA))
    with pytest.raises(NoSmearParameters) as e:
        load_checkpoint(d)
    assert str(e.value) == f"{PT}: no smear parameters: issue #756 cannot affect this model"
    assert isinstance(e.value, UserError)


def test_other_missing_keys_are_still_named(tmp_path, real):
    d = shutil.copytree(real, tmp_path / "partial")
    edit_state(d, _drop("smear_lambda"))  # one smear key present: a damaged file, not an old model
    with pytest.raises(UserError) as e:
        load_checkpoint(d)
    assert not isinstance(e.value, NoSmearParameters) and "missing smear_lambda" in str(e.value)
    d2 = shutil.copytree(real, tmp_path / "nohead")
    edit_state(d2, _drop("lm_head.weight"))
    with pytest.raises(UserError) as e:
        load_checkpoint(d2)
    assert not isinstance(e.value, NoSmearParameters) and "missing lm_head.weight" in str(e.value)
    d3 = shutil.copytree(real, tmp_path / "old-and-damaged")
    edit_state(d3, _drop(*SMEAR_ERA, "lm_head.weight"))
    with pytest.raises(UserError) as e:  # an old model with more missing: those are named, and the smear
        load_checkpoint(d3)
    assert not isinstance(e.value, NoSmearParameters)
    assert "missing backout_lambda, lm_head.weight, smear_gate.weight, smear_lambda" in str(e.value)
    assert "no smear parameters either, so issue #756 cannot affect it" in str(e.value)
    d4 = shutil.copytree(real, tmp_path / "empty")
    torch.save({}, d4 / PT)  # nothing at all is not "a model from before the smear"
    with pytest.raises(UserError) as e:
        load_checkpoint(d4)
    assert not isinstance(e.value, NoSmearParameters) and "issue #756" not in str(e.value)
