"""Byte-level text input, cached sessions, greedy and speculative generation (smearcli.text)."""

import json

import pytest
import torch
from typer.testing import CliRunner

from smearcli.gpt import generate

from smearcli.measure import inputs
from smearcli.cli.app import app
from smearcli.gpt.config import GPTConfig
from smearcli.util.errors import UserError
from smearcli.gpt.weights import random_config, random_model

runner = CliRunner()


@pytest.fixture(scope="module")
def model():
    return random_model(random_config(2), seed=3).model


PROMPT = inputs.encode("def add(a, b):\n    return a + b\n\nclass Point:\n    x: int\n")


def test_encode_decode_round_trip():
    s = "naïve café: ∑ x² \n\t"
    ids = inputs.encode(s)
    assert ids == list(s.encode("utf-8")) and all(0 <= i < 256 for i in ids)
    assert inputs.decode(ids) == s
    assert inputs.decode([0xFF, 0x41]) == "\ufffdA"  # not UTF-8: replaced, never raises


def test_text_tokens_refuses_other_vocab_and_empty_text():
    with pytest.raises(UserError, match="not the 256 bytes"):
        inputs.text_tokens("hi", GPTConfig(vocab_size=1000))
    with pytest.raises(UserError, match="empty"):
        inputs.text_tokens("", GPTConfig())
    t = inputs.text_tokens("hé", GPTConfig())
    assert t.shape == (1, 3) and t.dtype == torch.long


def test_read_text_file(tmp_path):
    p = tmp_path / "in.txt"
    p.write_bytes(b"\xffab")  # bytes as they are, even when not UTF-8
    assert inputs.read_text_file(p, GPTConfig()).tolist() == [[255, 97, 98]]
    with pytest.raises(UserError, match="not found"):
        inputs.read_text_file(tmp_path / "missing.txt", GPTConfig())
    (tmp_path / "empty.txt").write_bytes(b"")
    with pytest.raises(UserError, match="empty"):
        inputs.read_text_file(tmp_path / "empty.txt", GPTConfig())


def test_chunked_session_fixed_matches_reference_old_does_not(model):
    ref = generate.ReferenceSession(model).feed_chunks(PROMPT)
    sizes = [10, 1, 20, len(PROMPT) - 31]
    fixed = generate.CachedSession(model, "fixed").feed_chunks(PROMPT, sizes)
    old = generate.CachedSession(model, "old").feed_chunks(PROMPT, sizes)
    assert (fixed - ref).abs().max() < 1e-4
    err = (old - ref).abs().amax(-1)
    assert err[:10].max() < 1e-4  # before the first chunk start nothing differs
    assert err[10] < 1e-4  # a one-token step takes the decode path, which is right
    # the first token of each later multi-token chunk loses its predecessor
    assert err[11] > 1e-2 and err[31] > 1e-2


def test_generate_fixed_equals_reference_for_any_chunking(model):
    ref = generate.generate(model, PROMPT, 24, logic="reference")
    for sizes in (None, [1] * len(PROMPT), [7, 3, len(PROMPT) - 10]):
        assert generate.generate(model, PROMPT, 24, logic="fixed", chunk_sizes=sizes) == ref
    assert len(ref) == 24


def test_rewind_restores_the_session(model):
    s = generate.CachedSession(model, "fixed")
    s.feed(PROMPT[:30])
    s.feed(PROMPT[30:40])
    s.rewind(30)
    again = s.feed(PROMPT[30:40])
    fresh = generate.CachedSession(model, "fixed")
    fresh.feed(PROMPT[:30])
    want = fresh.feed(PROMPT[30:40])
    assert s.ids == PROMPT[:40]
    assert (again - want).abs().max() < 1e-5
    with pytest.raises(ValueError):
        s.rewind(0)


def test_speculative_fixed_equals_greedy(model):
    greedy = generate.generate(model, PROMPT, 20, logic="reference")
    res = generate.speculative_generate(model, PROMPT, 20, draft_len=4, logic="fixed")
    assert res.ids == greedy
    assert res.acceptance == 1.0 and res.verify_steps >= 4  # a perfect draft is always accepted
    # a poor draft (another model) changes acceptance, never the output
    other = random_model(random_config(1), seed=9).model
    res2 = generate.speculative_generate(model, PROMPT, 20, draft_len=3, logic="fixed", draft_model=other)
    assert res2.ids == greedy and res2.acceptance < 1.0


def test_first_divergence_and_marker():
    assert generate.first_divergence("abc", "abc") is None
    assert generate.first_divergence("abc", "abd") == 2
    assert generate.first_divergence("ab", "abc") == 2
    assert generate.mark_divergence("abcd", 2, "|") == "ab|cd"
    assert generate.mark_divergence("abcd", None) == "abcd"


def test_cli_text_input_and_conflicts(tmp_path):
    small = ["compare", "--model", "random", "--depth", "1", "--schedules", "chunked", "--chunks", "2"]
    src = "import os\nimport sys  # ∑\n"
    r = runner.invoke(app, [*small, "--text", src, "--json"])
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["input"]["seq_len"] == len(src.encode("utf-8"))
    f = tmp_path / "t.txt"
    f.write_text("x = 1\n")
    r = runner.invoke(app, [*small, "--text-file", str(f), "--json"])
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["input"]["seq_len"] == 6
    r = runner.invoke(app, [*small, "--text", "a", "--text-file", str(f)])
    assert r.exit_code == 2 and "only one" in r.output
    r = runner.invoke(app, [*small, "--text", ""])
    assert r.exit_code == 2 and "empty" in r.output


def test_run_script_chat_turns(model):
    script = [("feed", "def f(x):\n"), ("generate", 6), ("feed", "\n\ndef g(y):\n"), ("generate", 6),
              ("feed", PROMPT, [5, 9, len(PROMPT) - 14]), ("generate", 3)]
    ref = generate.run_script(model, "reference", script)
    fixed = generate.run_script(model, "fixed", script)
    old = generate.run_script(model, "old", script)
    assert fixed.ids == ref.ids and fixed.replies == ref.replies and len(ref.replies) == 3
    assert fixed.logits.shape == ref.logits.shape == (len(ref.ids), 256)
    assert (fixed.logits - ref.logits).abs().max() < 1e-4
    assert fixed.steps == [10] + [1] * 6 + [12] + [1] * 6 + [5, 9, len(PROMPT) - 14] + [1] * 3
    # the second turn is a multi-token step on a non-empty cache: the old logic errs at its start
    start = 10 + 6
    n = generate.first_divergence(old.ids, ref.ids) or len(ref.ids)
    err = (old.logits[:n] - ref.logits[:n]).abs().amax(-1)
    assert err[:start].max() < 1e-4 and err[start] > 1e-2
    assert inputs.decode(ref.ids).startswith("def f(x):\n") and ref.text == inputs.decode(ref.ids)
    with pytest.raises(ValueError):
        generate.run_script(model, "fixed", [("sing", 3)])


def test_cli_tiny_model_reads_text_and_shows_the_bug():
    src = "def area(w, h):\n    return w * h\n\n\nclass Box:\n    size = 3\n"
    r = runner.invoke(app, ["compare", "--model", "tiny", "--text", src, "--schedules", "chunked",
                            "--chunks", "3", "--json"])
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert doc["model"]["source"] == "tiny" and doc["input"]["seq_len"] == len(src)
    passed = {run["logic"]: run["passed"] for run in doc["runs"]}
    assert passed == {"old": False, "fixed": True}
    r = runner.invoke(app, ["compare", "--model", "tiny", "--step", "5"])
    assert r.exit_code == 2 and "--step needs --checkpoint" in r.output
