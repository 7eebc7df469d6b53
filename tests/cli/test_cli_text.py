"""Real nanochat layouts through the CLI: checkpoint discovery (flat, base_checkpoints/dN, a base
directory via $NANOCHAT_BASE_DIR), --text through the checkpoint's tokenizer.pkl, --chat with one
chunk per turn, a malicious tokenizer.pkl, and a checkpoint from before the smear."""

from __future__ import annotations

import json
import pickle

import pytest
import torch
from typer.testing import CliRunner

from smearcli.gpt import tokenizer as tok
from smearcli.cli.app import app
from smearcli.gpt.weights import random_config, random_model, save_checkpoint
from tokenizer_util import build_encoding, write_tokenizer

tiktoken = pytest.importorskip("tiktoken")
runner = CliRunner()
FAST = ["--schedules", "chunked", "--device", "cpu", "--gen-len", "2"]
TEXT = "the quick brown fox jumps over the lazy dog. hello world!"
CHAT = ["hello there!", "hello world.", "the fox runs away into the woods?"]


@pytest.fixture(scope="module")
def enc():
    return build_encoding()


@pytest.fixture(scope="module")
def model(enc):
    """A tiny random model whose vocabulary is the tokenizer's."""
    return random_model(random_config(depth=1, sequence_len=128, vocab_size=enc.n_vocab), seed=3).model


@pytest.fixture(scope="module")
def layouts(tmp_path_factory, enc, model):
    root = tmp_path_factory.mktemp("layouts")
    flat = root / "flat"
    save_checkpoint(model, flat, 7)
    write_tokenizer(flat / tok.TOKENIZER_FILE, enc)
    base = root / "base"
    save_checkpoint(model, base / "base_checkpoints" / "d1", 5)
    save_checkpoint(model, base / "base_checkpoints" / "d1", 9)
    write_tokenizer(base / "tokenizer" / tok.TOKENIZER_FILE, enc)
    return {"flat": flat, "base": base, "leaf": base / "base_checkpoints" / "d1"}


def invoke(*args, env=None):
    return runner.invoke(app, [str(a) for a in args], env=env)


def _json(r) -> dict:
    assert r.exit_code == 0, r.output
    return json.loads(r.stdout)


@pytest.mark.parametrize("where,announced", [("flat", "flat step 7"), ("leaf", "base_checkpoints/d1 step 9"),
                                             ("base", "base_checkpoints/d1 step 9")])
def test_text_runs_on_every_layout(layouts, enc, where, announced):
    r = invoke("compare", "--checkpoint", layouts[where], "--text", TEXT, "--json", *FAST)
    doc = _json(r)
    assert announced in r.stderr and "checkpoint" in r.stderr
    ids = tok.encode_text(enc, TEXT)
    assert doc["input"]["seq_len"] == len(ids) and ids[0] == enc.encode_single_token(tok.BOS)
    ck = doc["model"]["checkpoint"]
    assert ck["step"] == int(announced.split()[-1]) and ck["tokenizer"].endswith("tokenizer.pkl")
    assert [run["logic"] for run in doc["runs"]] == ["old", "fixed"]


def test_base_dir_from_the_environment_with_source(layouts, tmp_path):
    text = tmp_path / "in.txt"
    text.write_text(TEXT, encoding="utf-8")
    r = invoke("compare", "--source", "base", "--text-file", text, "--json", *FAST,
               env={"NANOCHAT_BASE_DIR": str(layouts["base"])})
    doc = _json(r)
    assert f"base_checkpoints/d1 step 9 under {layouts['base']}" in r.stderr
    assert doc["model"]["checkpoint"]["source"] == "base" and doc["model"]["checkpoint"]["tag"] == "d1"
    r = invoke("compare", "--source", "base", "--model-tag", "d1", "--step", "5", "--text", TEXT, "--json", *FAST,
               env={"NANOCHAT_BASE_DIR": str(layouts["base"])})
    assert _json(r)["model"]["step"] == 5


def test_chat_feeds_one_chunk_per_turn(layouts, enc):
    r = invoke("compare", "--checkpoint", layouts["flat"], "--chat", "--text", json.dumps(CHAT), "--json", *FAST)
    doc = _json(r)
    expected = tok.encode_chat(enc, CHAT)
    assert len(expected.turns) == 4  # three turns and the primed assistant turn
    assert doc["options"]["chunk_sizes"] == expected.chunk_sizes
    assert doc["runs"][0]["steps"] == expected.chunk_sizes
    starts = [t.start for t in expected.turns[1:] if t.length > 1]  # multi-token steps only
    assert doc["runs"][0]["chunk_starts"] == starts
    # an explicit --chunks wins over the turns
    doc = _json(invoke("compare", "--checkpoint", layouts["flat"], "--chat", "--text", json.dumps(CHAT),
                       "--chunks", "2", "--json", *FAST))
    assert len(doc["runs"][0]["steps"]) == 2


def test_chat_input_must_be_a_json_list(layouts):
    r = invoke("compare", "--checkpoint", layouts["flat"], "--chat", "--text", "not json", *FAST)
    assert r.exit_code == 2 and "JSON list of turns" in r.stderr


def test_bpe_model_without_tokenizer_names_where_it_looked(tmp_path, model):
    save_checkpoint(model, tmp_path / "ck", 1)
    r = invoke("compare", "--checkpoint", tmp_path / "ck", "--text", TEXT, *FAST)
    assert r.exit_code == 2, r.output
    assert str(tmp_path / "ck" / "tokenizer.pkl") in r.stderr and "--tokens" in r.stderr


def test_missing_tiktoken_names_the_extra(layouts, monkeypatch):
    import builtins
    real = builtins.__import__

    def no_tiktoken(name, *a, **k):
        if name == "tiktoken":
            raise ImportError("no tiktoken")
        return real(name, *a, **k)

    monkeypatch.setattr(builtins, "__import__", no_tiktoken)
    r = invoke("compare", "--checkpoint", layouts["flat"], "--text", TEXT, *FAST)
    assert r.exit_code == 2 and "pip install 'smearcli[text]'" in r.stderr


class Payload:
    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return eval, (f"open({self.marker!r}, 'w')",)


def test_malicious_tokenizer_is_refused_without_running(tmp_path, model):
    save_checkpoint(model, tmp_path / "ck", 1)
    marker = tmp_path / "pwned"
    (tmp_path / "ck" / tok.TOKENIZER_FILE).write_bytes(pickle.dumps(Payload(marker)))
    r = invoke("compare", "--checkpoint", tmp_path / "ck", "--text", TEXT, *FAST)
    assert r.exit_code == 2, r.output
    assert "refused" in r.stderr and "builtins.eval" in r.stderr
    assert not marker.exists()


# -- a checkpoint from before the smear -----------------------------------------------------------
@pytest.fixture(scope="module")
def pre_smear(tmp_path_factory, model):
    d = tmp_path_factory.mktemp("presmear") / "base_checkpoints" / "d1"
    save_checkpoint(model, d, 4)
    sd = torch.load(d / "model_000004.pt", weights_only=True)
    for k in ("smear_gate.weight", "smear_lambda", "backout_lambda"):
        del sd[k]
    torch.save(sd, d / "model_000004.pt")
    return d


VERDICT = "no smear parameters: issue #756 cannot affect this model"


@pytest.mark.parametrize("extra", [[], ["--check"], ["--check", "--logic", "old"]])
def test_pre_smear_checkpoint_gets_the_verdict(pre_smear, extra):
    r = invoke("compare", "--checkpoint", pre_smear, *FAST, *extra)
    assert r.exit_code == 0, r.output
    assert VERDICT in r.stdout and "base_checkpoints/d1 step 4" in r.stderr


def test_pre_smear_json(pre_smear):
    doc = _json(invoke("compare", "--checkpoint", pre_smear.parent.parent, "--json", "--check", *FAST))
    assert doc["schema"] == "smearcli.compare/1" and doc["no_smear"] is True
    assert doc["runs"] == [] and doc["verdict"] == VERDICT
    assert doc["model"]["checkpoint"]["step"] == 4 and doc["model"]["checkpoint"]["source"] == "base"


def test_pre_smear_plot_writes_nothing(pre_smear, tmp_path):
    out = tmp_path / "fig.png"
    r = invoke("plot", "--checkpoint", pre_smear, "--out", out, *FAST)
    assert r.exit_code == 0, r.output
    assert VERDICT in r.stdout and "no figure written" in r.stdout and not out.exists()


def test_other_missing_keys_stay_an_error(tmp_path, model):
    d = tmp_path / "ck"
    save_checkpoint(model, d, 1)
    sd = torch.load(d / "model_000001.pt", weights_only=True)
    del sd["lm_head.weight"]
    torch.save(sd, d / "model_000001.pt")
    r = invoke("compare", "--checkpoint", d, *FAST)
    assert r.exit_code == 2 and "lm_head.weight" in r.stderr


@pytest.mark.parametrize("chat", [False, True])
def test_text_that_is_not_utf8_is_refused_not_replaced(layouts, chat):
    """A shell hands bytes that are not UTF-8 (here 0xe9, latin-1's é) over as a lone surrogate; the
    tokenizer would have encoded U+FFFD in their place."""
    text = "caf\udce9 au lait"  # what Python makes of argv b"caf\xe9 au lait" under a UTF-8 locale
    args = ["--chat", "--text", json.dumps([text], ensure_ascii=False)] if chat else ["--text", text]
    r = invoke("compare", "--checkpoint", layouts["flat"], *args, *FAST)
    assert r.exit_code == 2, r.output
    errors = [line for line in r.stderr.splitlines() if line.startswith("smearcli: error:")]
    assert len(errors) == 1 and "--text" in errors[0] and "not UTF-8 (byte 0xe9 at character 3)" in errors[0], r.stderr
