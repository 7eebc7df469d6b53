"""Smoke tests for examples/: each script runs through its main() with small settings."""

import importlib.util
import json

import torch

from smearcli.gpt import weights
from smearcli.gpt.checkpoint import list_steps
from smearcli.gpt.weights import load_checkpoint
from conftest import ROOT  # noqa: E402 - the clone's root

EXAMPLES = ROOT / "examples"


def load_example(name):
    spec = importlib.util.spec_from_file_location(f"example_{name}", EXAMPLES / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


SMALL_TRAINING = ["--steps", "3", "--batch-size", "2", "--seq-len", "64", "--depth", "2",
                  "--n-embd", "128", "--n-head", "1", "--corpus-bytes", "100000", "--eval-windows", "2"]


def test_train_tiny_smoke_writes_a_loadable_reproducible_checkpoint(tmp_path, capsys):
    train = load_example("train_tiny")
    threads = torch.get_num_threads()
    try:
        assert train.main([*SMALL_TRAINING, "--out", str(tmp_path / "a")]) == 0
        assert train.main([*SMALL_TRAINING, "--out", str(tmp_path / "b")]) == 0
    finally:
        torch.set_num_threads(threads)  # the script pins threads; leave the test session as it was
    assert "saved" in capsys.readouterr().out
    metas = []
    for d in ("a", "b"):
        assert list_steps(tmp_path / d) == [3]
        lm = load_checkpoint(tmp_path / d)
        assert lm.model.config.n_layer == 2 and lm.model.config.vocab_size == 256
        metas.append(json.loads((tmp_path / d / "meta_000003.json").read_text())["smearcli_training"])
    a, b = metas
    assert a["corpus"]["sha256"] == b["corpus"]["sha256"] and a["corpus"]["bytes"] == 100000
    assert a["final_train_loss"] == b["final_train_loss"]  # same seed, same threads: same run
    assert 0 < a["final_train_loss"] < 10 and a["tokens_seen"] == 3 * 2 * 64
    assert a["torch"] == torch.__version__


def test_train_tiny_checks_out_before_training(tmp_path, capsys):
    existing = tmp_path / "a-file"
    existing.write_text("not a checkpoint directory")
    assert load_example("train_tiny").main([*SMALL_TRAINING, "--out", str(existing)]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""  # nothing ran: no corpus line, no training steps
    assert len(captured.err.strip().splitlines()) == 1 and str(existing) in captured.err
    assert existing.read_text() == "not a checkpoint directory"


def test_shipped_tiny_model_matches_its_meta():
    lm = weights.tiny_model()
    training = lm.meta["smearcli_training"]
    assert lm.model.config.is_byte_level
    assert abs(float(lm.model.smear_lambda) - training["smear_lambda"]) < 1e-2  # bf16 storage
    assert abs(float(lm.model.smear_lambda)) > 0.2  # a trained model that can show the bug
    size = sum(p.stat().st_size for p in weights.TINY_DIR.iterdir())
    assert size <= 8 * 1024 * 1024


def test_chunked_chat_shows_the_bug(capsys):
    """The example is there to show the bug: with its defaults, the old logic's replies differ
    from the uncached reference and the fixed logic's match every turn."""
    threads = torch.get_num_threads()
    try:
        assert load_example("chunked_chat").main([]) == 0
    finally:
        torch.set_num_threads(threads)
    out = capsys.readouterr().out
    assert out.count("--- turn") == 3
    assert "fixed logic reproduces the reference: True; old logic: False" in out
    olds = [line for line in out.splitlines() if line.strip().startswith("old:")]
    fixeds = [line for line in out.splitlines() if line.strip().startswith("fixed:")]
    assert len(olds) == len(fixeds) == 3
    assert all("same as reference" in line for line in fixeds)
    assert any("differs from character" in line for line in olds)


def test_speculative_verify(capsys):
    assert load_example("speculative_verify").main(["--new", "12", "--draft", "3"]) == 0
    out = capsys.readouterr().out
    fixed = out.split("speculative, fixed logic")[1].split("speculative, old logic")[0]
    assert "same text as greedy decoding" in fixed and "(100%)" in fixed


def test_audit_checkpoint(capsys):
    # the shipped model's directory, given by path like any nanochat checkpoint directory
    rc = load_example("audit_checkpoint").main([str(weights.TINY_DIR), "--chunks", "3", "--schedules", "prefill,chunked"])
    out = capsys.readouterr().out
    assert rc == 0  # the fixed logic passes every schedule
    assert "chunked" in out and "BUG" in out  # and the old logic shows the bug on a trained model
