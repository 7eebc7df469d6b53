"""The packed schedule on a user's nanochat checkout, and packed text split at `<|bos|>` markers.

The checkout is the stand-in of test_audit (tests/standin/old, upstream's layout and API, the old
smear), run on our model's weights; variants are made from it in temporary directories: a smear
that skips BOS tokens (the bosmask logic in their code), attention through an aliased SDPA import,
and attention computed by hand (no SDPA call for the document mask to be laid over)."""

import json
import shutil
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from typer.testing import CliRunner

from smearcli.gpt import gpt_runners

from smearcli.measure import inputs, packed
from smearcli.cli.app import app
from smearcli.engines.nanochat import adapter, sandbox
from smearcli.engines.nanochat.docmask import document_attention
from smearcli.gpt.model import rms_norm
from smearcli.util.defaults import NOISE_MARGIN
from smearcli.gpt.gpt_runners import GPTRunner
from smearcli.measure.runner import DOCUMENT_MASK, SMEAR_TERMS, NoDocumentMask
from smearcli.gpt.weights import random_config

OLD = Path(__file__).resolve().parents[1] / "standin" / "old"
LENGTHS = (12, 8, 10)
BOS = 0
GATE_LINE = "        gate = self.smear_lambda.to(x.dtype) * torch.sigmoid(self.smear_gate(x[..., :24]))\n"
cli = CliRunner()


def variant(tmp_path: Path, name: str, edits=()) -> Path:
    root = tmp_path / name
    shutil.copytree(OLD, root, ignore=shutil.ignore_patterns("__pycache__"))
    gpt = root / "nanochat" / "gpt.py"
    text = gpt.read_text()
    for old, new in edits:
        assert text.count(old) == 1, old
        text = text.replace(old, new)
    gpt.write_text(text)
    return root


def theirs(path, model):
    return adapter.NanochatRunner(adapter.nanochat_from_model(sandbox.import_nanochat(path, dtype=torch.float32), model))


@pytest.fixture(scope="module")
def row(ours):
    return packed.packed_tokens(ours.config.vocab_size, LENGTHS, BOS, seed=3)


@pytest.fixture(scope="module")
def result(ours, row):
    group = ours_runners(ours) + [theirs(OLD, ours)]
    return packed.measure(group, row, LENGTHS, first=4)


def ours_runners(model):
    return gpt_runners.runners(model, ["old", "bosmask"], bos=BOS)


# -- the user's runner, split like ours -----------------------------------------------------------

def test_the_users_code_gets_a_row_per_document_and_its_split(result):
    yours = result.get("yours")
    assert [(d.start, d.length) for d in yours.documents] == [(0, 12), (12, 8), (20, 10)]
    assert yours.unsplit is None
    for d in yours.documents[1:]:
        assert d.first > NOISE_MARGIN * yours.noise  # the old smear and causal attention leak
        assert d.masked_first is not None and d.attention_first > NOISE_MARGIN * yours.noise
    doc = packed.to_json(result)
    assert [lg["attention_part"]["measured"] for lg in doc["logics"]] == [True, True, True]


def test_the_users_split_is_ours_under_the_old_logic(ours, row, result):
    """Same weights: their leak, smear part and attention part are ours under old, to the noise floor;
    their smear part at each BOS is gate * x_prev at block 0's input, computed here from the weights."""
    mine, yours = result.get("old"), result.get("yours")
    noise = max(mine.noise, yours.noise)
    for a, b in zip(mine.documents, yours.documents):
        for attr in ("bos", "first", "whole", "masked_first", "attention_first"):
            assert abs(getattr(a, attr) - getattr(b, attr)) <= NOISE_MARGIN * noise, attr
    x = rms_norm(ours.transformer.wte(row))
    w, lam = ours.smear_gate.weight, float(ours.smear_lambda)
    scale = float(ours.resid_lambdas[0] + ours.x0_lambdas[0])
    for d in yours.documents[1:]:
        gate = lam * torch.sigmoid(x[0, d.start, :w.size(1)] @ w[0])
        expected = float((scale * gate * x[0, d.start - 1]).abs().max())
        assert expected > 1e-3 and d.smear_measured == pytest.approx(expected, rel=1e-5)
        assert d.smear_predicted == pytest.approx(expected, rel=1e-5) and d.smear_residual < 1e-5 * expected
    assert yours.gate_at_bos == pytest.approx(mine.gate_at_bos, rel=1e-6)


def test_a_bos_masked_smear_in_their_code_with_the_document_mask_reaches_the_noise_floor(tmp_path, ours, row, result):
    """Their smear skipping BOS (the bosmask logic, written into their code) and the document mask
    laid over their attention: each document computes what it computes alone, as ours does."""
    root = variant(tmp_path, "bosmask", [(GATE_LINE, GATE_LINE + "        gate = gate * (idx != 0).unsqueeze(-1).to(gate.dtype)\n")])
    r = packed.measure([theirs(root, ours)], row, LENGTHS, first=4).get("yours")
    mine = result.get("bosmask")
    assert mine.worst("masked_first") <= NOISE_MARGIN * mine.noise
    assert r.worst() > NOISE_MARGIN * r.noise  # attention still leaks without the mask
    assert all(d.masked_first is not None for d in r.documents)  # measured, not left out
    assert r.worst("masked_first") <= NOISE_MARGIN * r.noise and r.gate_at_bos > 0  # their gate; their mask
    assert all(d.smear_measured == 0 for d in r.documents)


def test_an_aliased_sdpa_import_is_masked_too(tmp_path, ours, row, result):
    root = variant(tmp_path, "alias", [
        ("import torch.nn.functional as F\n", "import torch.nn.functional as F\n"
         "from torch.nn.functional import scaled_dot_product_attention as attend_fn\n"),
        ("    y = F.scaled_dot_product_attention(", "    y = attend_fn(")])
    r = packed.measure([theirs(root, ours)], row, LENGTHS, first=4).get("yours")
    assert r.unsplit is None
    for a, b in zip(result.get("yours").documents, r.documents):
        assert a.masked_first == b.masked_first and a.attention_first == b.attention_first
    assert F.scaled_dot_product_attention.__module__.startswith("torch")  # restored


# -- where the mask cannot be laid: measured without the split, and said so ------------------------

HAND_ATTENTION = """    s = (q.transpose(1, 2) @ k.transpose(1, 2).transpose(-1, -2)) / q.size(-1) ** 0.5
    y = s.masked_fill(~mask, float("-inf")).softmax(-1) @ v.transpose(1, 2)
"""


def test_attention_without_sdpa_is_measured_without_the_split(tmp_path, ours, row):
    root = variant(tmp_path, "hand", [
        ("""    y = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                       attn_mask=mask, enable_gqa=q.size(2) != k.size(2))
""", HAND_ATTENTION)])
    runner = theirs(root, ours)
    with pytest.raises(NoDocumentMask, match="does not call"):
        runner.forward_documents(row, LENGTHS, False)
    res = packed.measure([runner], row, LENGTHS, first=4)
    yours = res.get("yours")
    assert "does not call torch.nn.functional.scaled_dot_product_attention" in yours.unsplit
    assert all(d.masked_first is None and d.attention_first is None for d in yours.documents)
    assert yours.worst() > NOISE_MARGIN * yours.noise  # the leak itself is still measured
    assert "yours: attention's part not measured: its attention does not call" in res.table()
    assert "attention's part not measured under yours" in res.verdict
    doc = packed.to_json(res)["logics"][0]
    assert doc["attention_part"] == {"measured": False, "why_not": yours.unsplit}
    assert doc["documents"][1]["attention_first"] is None


def test_a_runner_without_a_document_mask_says_so(ours, row):
    class NoMask(GPTRunner):
        capabilities = GPTRunner.capabilities - {DOCUMENT_MASK}

    res = packed.measure([NoMask(ours, "bosmask", bos=BOS)], row, LENGTHS, first=4)
    assert res.get("bosmask").unsplit == "bosmask takes no document mask"
    assert "bosmask: attention's part not measured: bosmask takes no document mask" in res.table()
    assert "with the BOS mask and a document mask" not in res.verdict  # no floor claimed from a mask never run


def test_a_runner_without_smear_terms_leaves_the_check_blank_not_zero(ours, row):
    class NoTerms(GPTRunner):
        capabilities = GPTRunner.capabilities - {SMEAR_TERMS}

    lg = packed.measure([NoTerms(ours, "old")], row, LENGTHS, first=4).get("old")
    assert all(d.smear_predicted is None and d.smear_residual is None for d in lg.documents[1:])
    assert all(d.smear_measured > 1e-3 for d in lg.documents[1:])  # the embedding still differs
    assert lg.gate_at_bos is None


@pytest.mark.parametrize("call,why", [
    (lambda q: F.scaled_dot_product_attention(q, q, q), "not causal"),
    (lambda q: F.scaled_dot_product_attention(q[:, :, :5], q, q, is_causal=False), "5 queries"),
    (lambda q: F.scaled_dot_product_attention(q, q, q, attn_mask=torch.ones(q.size(2), q.size(2), dtype=torch.bool)),
     "see later keys"),
])
def test_a_call_the_mask_cannot_be_laid_over_runs_as_asked_and_is_refused_afterwards(call, why):
    q = torch.randn(1, 2, sum(LENGTHS), 8, generator=torch.Generator().manual_seed(0))
    with document_attention(LENGTHS, [], q.device) as patch:
        out = call(q)
    assert torch.equal(out, call(q))  # their computation, unchanged
    with pytest.raises(NoDocumentMask, match=why):
        patch.check(1)


def test_a_causal_call_gets_the_document_mask():
    q = torch.randn(1, 2, sum(LENGTHS), 8, generator=torch.Generator().manual_seed(0))
    with document_attention(LENGTHS, [], q.device) as patch:
        out = F.scaled_dot_product_attention(q, q, q, is_causal=True)
    patch.check(1)
    s = 0
    for n in LENGTHS:  # each document alone, computed here
        alone = F.scaled_dot_product_attention(q[:, :, s:s + n], q[:, :, s:s + n], q[:, :, s:s + n], is_causal=True)
        assert torch.allclose(out[:, :, s:s + n], alone, atol=1e-6)
        s += n
    with pytest.raises(NoDocumentMask, match="2 blocks"):
        patch.check(2)


# -- the CLI ----------------------------------------------------------------------------------------
SMALL = ["--depth", "2", "--schedules", "packed", "--documents", "12,8,10"]


@pytest.mark.parametrize("impl,labels", [("nanochat", ["yours"]), ("both", ["old", "fixed", "yours"])])
def test_cli_packed_on_a_checkout(impl, labels):
    r = cli.invoke(app, ["compare", "--impl", impl, "--nanochat-path", str(OLD), *SMALL, "--json"])
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert doc["schema"] == packed.SCHEMA and [lg["logic"] for lg in doc["logics"]] == labels
    yours = doc["logics"][-1]
    assert [d["length"] for d in yours["documents"]] == [12, 8, 10] and yours["attention_part"]["measured"]
    if impl == "both":
        old = doc["logics"][0]
        noise = max(old["noise_floor_logits"], yours["noise_floor_logits"])
        for a, b in zip(old["documents"], yours["documents"]):
            assert abs(a["first"] - b["first"]) <= NOISE_MARGIN * noise
    r = cli.invoke(app, ["compare", "--impl", impl, "--nanochat-path", str(OLD), *SMALL])
    assert r.exit_code == 0, r.output
    assert [line.split()[:2] for line in r.output.splitlines() if line.split()[:1] == ["yours"]] == [
        ["yours", "0"], ["yours", "1"], ["yours", "2"]]
    assert "laid over your code's own attention calls" in r.output


# -- text split at <|bos|> ----------------------------------------------------------------------------
TEXT = "the fox runs.<|bos|>hello world<|bos|>!<|bos|>a dog"  # a one-character document among them
BYTES = ["--model", "random", "--depth", "1", "--schedules", "packed", "--json"]


def pieces(text):
    """The documents of a marked text, split here by hand: what precedes the first marker is a
    document unless the text starts with one."""
    parts = text.split("<|bos|>")
    return parts[1:] if text.startswith("<|bos|>") else parts


@pytest.mark.parametrize("text", [TEXT, "<|bos|>" + TEXT])  # one document, or an empty one: refused
                                                        # (tests/core/test_boundary_inputs.py)
def test_byte_level_text_splits_at_each_marker(text, tmp_path):
    expected = [1 + len(p.encode()) for p in pieces(text)]
    doc = json.loads(cli.invoke(app, ["compare", "--text", text, *BYTES]).stdout)
    assert doc["documents"] == expected and doc["bos"] == packed.BYTE_BOS
    f = tmp_path / "t.txt"
    f.write_text(text)
    assert json.loads(cli.invoke(app, ["compare", "--text-file", str(f), *BYTES]).stdout)["documents"] == expected
    row = inputs.text_documents(text, random_config(1), BOS)[0].tolist()
    want = []
    for p in pieces(text):
        want += [BOS] + list(p.encode())
    assert row == want
    # without the packed schedule the marker is ordinary text, as before
    doc = json.loads(cli.invoke(app, ["compare", "--text", text, *BYTES[:4], "--schedules", "chunked", "--json"]).stdout)
    assert doc["input"]["seq_len"] == len(text.encode())


def test_marked_text_and_documents_must_agree(tmp_path):
    good = ",".join(str(1 + len(p.encode())) for p in pieces(TEXT))
    assert cli.invoke(app, ["compare", "--text", TEXT, *BYTES, "--documents", good]).exit_code == 0
    r = cli.invoke(app, ["compare", "--text", TEXT, *BYTES, "--documents", "10,10,8,6"])  # the same sum
    assert r.exit_code == 2 and "markers split it into documents of " + good in r.stderr
    f = tmp_path / "nul.txt"
    f.write_bytes(b"ab\0c<|bos|>d")
    r = cli.invoke(app, ["compare", "--text-file", str(f), *BYTES])
    assert r.exit_code == 2 and "holds byte 0" in r.stderr and len(r.stderr.strip().splitlines()) == 1


def test_bpe_text_splits_at_each_marker_with_the_tokenizers_bos(tmp_path):
    pytest.importorskip("tiktoken")
    from smearcli.gpt import tokenizer as tok
    from smearcli.gpt.weights import random_model, save_checkpoint
    from tokenizer_util import build_encoding, write_tokenizer

    enc = build_encoding()
    model = random_model(random_config(depth=1, sequence_len=128, vocab_size=enc.n_vocab), seed=3).model
    save_checkpoint(model, tmp_path / "ck", 7)
    write_tokenizer(tmp_path / "ck" / tok.TOKENIZER_FILE, enc)
    bos = enc.encode_single_token("<|bos|>")
    for text in (TEXT, "<|bos|>" + TEXT):
        expected = [1 + len(enc.encode_ordinary(p)) for p in pieces(text)]
        r = cli.invoke(app, ["compare", "--checkpoint", str(tmp_path / "ck"), "--text", text, "--schedules",
                             "packed", "--json"])
        assert r.exit_code == 0, r.output
        doc = json.loads(r.stdout)
        assert doc["documents"] == expected and doc["bos"] == bos
        want = []
        for p in pieces(text):
            want += [bos] + enc.encode_ordinary(p)
        assert tok.encode_documents(enc, text) == want
    r = cli.invoke(app, ["compare", "--checkpoint", str(tmp_path / "ck"), "--text", TEXT, "--schedules", "chunked",
                         "--json"])
    assert json.loads(r.stdout)["input"]["seq_len"] == len(tok.encode_text(enc, TEXT))  # ordinary text there


def test_rollback_on_a_checkout_is_refused_with_what_its_cache_lacks():
    """A user's KVCache can neither be cropped nor copied through the adapter: rollback is not
    offered to --impl nanochat, refused at --schedules in one line naming that, exit 2 (it was an
    internal error, then a refusal once the run began)."""
    r = cli.invoke(app, ["compare", "--impl", "nanochat", "--nanochat-path", str(OLD), "--model", "random",
                         "--depth", "2", "--seq-len", "32", "--schedules", "rollback", "--quiet"])
    assert r.exit_code == 2, r.output
    lines = [ln for ln in r.output.splitlines() if ln.strip()]
    assert len(lines) == 1 and "neither copy nor crop its cache" in lines[0] and "internal" not in lines[0], r.output
    assert "--schedules: rollback cannot run with --impl nanochat" in lines[0], r.output
