"""Boundaries other than chunk starts: packed documents (our GPT under old, fixed and bosmask),
padded batches and rolled-back drafts (stand-in runners that get each one right or wrong)."""

import json

import pytest
import torch
from typer.testing import CliRunner

from smearcli.gpt import gpt_runners

from smearcli.measure import packed
from smearcli.measure.boundaries import split_on_bos
from smearcli.cli.app import app
from smearcli.measure.compare import compare
from smearcli.gpt.model import rms_norm
from smearcli.util.defaults import DOCUMENT_START, NOISE_MARGIN, PADDING, ROLLBACK
from smearcli.measure.runner import COPY, CROP, PADDING as PADDED_BATCH, Output, Runner
from smearcli.measure.schedules import ScheduleOptions, run_schedule, runnable, shape
from smearcli.gpt.weights import random_config, random_model

LENGTHS = (12, 8, 10)
BOS = 0


@pytest.fixture(scope="module")
def model():
    return random_model(random_config(1), seed=2).model


@pytest.fixture(scope="module")
def tokens(model):
    return packed.packed_tokens(model.config.vocab_size, LENGTHS, BOS, seed=3)


@pytest.fixture(scope="module")
def result(model, tokens):
    return packed.measure(gpt_runners.runners(model, ["old", "fixed", "bosmask"], bos=BOS), tokens, LENGTHS, first=4)


def test_packed_tokens_hold_bos_at_each_start_only(tokens):
    assert split_on_bos(tokens[0], BOS) == list(LENGTHS)
    with pytest.raises(ValueError, match="starts with BOS"):
        split_on_bos(tokens[0, 1:], BOS)


def test_the_packed_schedule_runs_each_document_alone(model, tokens):
    r = run_schedule(gpt_runners.GPTRunner(model, "fixed"), tokens, "packed", opts=ScheduleOptions(documents=LENGTHS))
    assert r.boundaries == {DOCUMENT_START: [12, 20]} and r.chunk_starts == []  # fresh calls, no cache
    second = gpt_runners.GPTRunner(model, "fixed").forward(tokens[:, 12:20], False).logits
    assert torch.equal(r.logits[:, 12:20], second)


def test_the_smear_part_at_each_bos_is_gate_times_the_previous_token(model, tokens, result):
    x = rms_norm(model.transformer.wte(tokens))  # computed here, not through smear_terms
    w, lam = model.smear_gate.weight, float(model.smear_lambda)
    for label in ("old", "fixed"):
        for d in result.get(label).documents[1:]:
            gate = lam * torch.sigmoid(x[0, d.start, :w.size(1)] @ w[0])
            expected = float((gate * x[0, d.start - 1]).abs().max())
            assert d.smear_predicted == pytest.approx(expected, rel=1e-5) and expected > 1e-3
            assert d.smear_measured == pytest.approx(expected, rel=1e-5)
            assert d.smear_residual < 1e-5 * expected  # rounding
    for d in result.get("bosmask").documents:
        assert d.smear_predicted == 0 and d.smear_measured == 0


def test_the_masks_together_leave_the_noise_floor(result):
    old, masked = result.get("old"), result.get("bosmask")
    assert old.worst("masked_first") > NOISE_MARGIN * old.noise  # the smear alone leaks without the BOS mask
    assert masked.worst() > NOISE_MARGIN * masked.noise  # attention leaks without the document mask
    assert masked.worst("masked_first") <= NOISE_MARGIN * masked.noise
    assert result.get("old").gate_at_bos > 0 and masked.gate_at_bos == 0
    assert result.verdict.startswith("MEASURED") and "not a bug" in result.verdict


def test_a_leak_limit_makes_it_a_gate(model, tokens, result):
    worst = max(lg.worst() for lg in result.logics)
    for limit, failed in ((worst * 2, False), (worst / 2, True)):
        result.limit = limit
        assert result.failed is failed and result.verdict.startswith("LEAK" if failed else "OK")
    result.limit = None
    doc = packed.to_json(result)
    assert doc["schema"] == "smearcli.packed/1" and [lg["logic"] for lg in doc["logics"]] == ["old", "fixed", "bosmask"]


def test_the_bos_mask_is_the_fixed_logic_where_no_token_is_bos(model):
    t = torch.randint(1, 256, (1, 20), generator=torch.Generator().manual_seed(5))
    opts = ScheduleOptions(chunk_sizes=(7, 13))
    a = run_schedule(gpt_runners.GPTRunner(model, "fixed"), t, "chunked", opts=opts)
    b = run_schedule(gpt_runners.GPTRunner(model, "bosmask", bos=BOS), t, "chunked", opts=opts)
    assert torch.equal(a.logits, b.logits)


# -- stand-ins: h_t = E[x_t] + 0.5 E[x_{t-1}], the cache holds the last embedding ------------------
V, C = 32, 8


class Toy(Runner):
    label, layers, dtype = "toy", ("emb", "logits"), torch.float32

    def __init__(self, capabilities=(CROP,), forgets=False, leaks_padding=False):
        g = torch.Generator().manual_seed(0)
        self.E, self.W = torch.randn(V, C, generator=g), torch.randn(C, V, generator=g)
        self.capabilities = frozenset(capabilities)
        self.forgets, self.leaks = forgets, leaks_padding

    def _run(self, ids, prev):
        e = self.E[ids]
        prev = torch.zeros_like(e[:, :1]) if prev is None else prev
        h = e + 0.5 * torch.cat([prev, e[:, :-1]], dim=1)
        return Output(h @ self.W, [h])

    def forward(self, ids, capture):
        return self._run(ids, None)

    def new_cache(self, batch, max_len):
        return {"prev": None, "ids": ids_empty(batch)}

    def step(self, ids, cache, capture):
        out = self._run(ids, cache["prev"])
        cache["prev"], cache["ids"] = self.E[ids[:, -1:]], torch.cat([cache["ids"], ids], dim=1)
        return out

    def crop(self, cache, length):
        cache["ids"] = cache["ids"][:, :length]
        if not self.forgets:  # the bug: the state of the rejected token stays
            cache["prev"] = self.E[cache["ids"][:, -1:]]

    def copy(self, cache):
        return dict(cache)

    def forward_padded(self, ids, mask, capture):
        if self.leaks:  # the mask ignored: a left-padded row's first token smears from padding
            return self._run(ids, None)
        rows = []
        for r in range(ids.size(0)):
            real = mask[r].bool()
            out = self._run(ids[r:r + 1, real], None)
            full = [torch.zeros(1, ids.size(1), x.size(-1)) for x in [out.hiddens[0], out.logits]]
            for f, x in zip(full, [out.hiddens[0], out.logits]):
                f[:, real] = x
            rows.append(full)
        return Output(torch.cat([r[1] for r in rows]), [torch.cat([r[0] for r in rows])])


def ids_empty(batch):
    return torch.zeros(batch, 0, dtype=torch.long)


def toy_tokens(T=24):
    return torch.randint(1, V, (2, T), generator=torch.Generator().manual_seed(1))


OPTS = ScheduleOptions(gen_len=12, draft=4, reject=2)


def test_a_cropped_draft_matches_the_full_pass():
    c = compare(Toy(), toy_tokens(), ["rollback"], options=OPTS)
    assert c.passed, c.table()
    assert c.runs[0].boundaries[ROLLBACK] == [14, 16, 18, 20, 22] and "cropped back" in c.table()


def test_state_not_rolled_back_is_reported_with_its_shape():
    c = compare(Toy(forgets=True), toy_tokens(), ["rollback"], options=OPTS)
    assert not c.passed and c.born_at(c.metrics[0]) == ("emb", 14)
    assert shape("rollback") in c.verdict


def test_without_crop_a_copy_taken_before_the_draft_is_restored():
    c = compare(Toy(capabilities=(COPY,), forgets=True), toy_tokens(), ["rollback"], options=OPTS)
    assert c.passed and "restored from a copy" in c.table()


def test_a_runner_that_can_neither_crop_nor_copy_is_reported_not_skipped():
    toy = Toy(capabilities=())
    assert not runnable(toy, "rollback")
    with pytest.raises(ValueError, match="toy cannot run the rollback schedule .*neither copy nor crop"):
        compare(toy, toy_tokens(), ["rollback"], options=OPTS)


def test_a_padded_batch_matches_each_row_alone():
    c = compare(Toy(capabilities=(PADDED_BATCH,)), toy_tokens(), ["padded"])
    assert c.passed, c.table()
    r = c.runs[0]
    assert r.row_map == [0, 0, 0, 1, 1, 1] and r.boundaries == {PADDING: [18]}


def test_padding_that_leaks_into_a_row_is_reported_with_its_shape():
    c = compare(Toy(capabilities=(PADDED_BATCH,), leaks_padding=True), toy_tokens(), ["padded"])
    assert not c.passed and shape("padded") in c.verdict
    assert c.born_at(c.metrics[0]) == ("emb", 0)  # the left-padded row's first real token


# -- the CLI ------------------------------------------------------------------------------------------
ARGS = ["compare", "--model", "random", "--depth", "1", "--schedules", "packed", "--documents", "12,8,10", "-q"]


def test_cli_packed_prints_every_logic_and_gates_on_a_limit():
    cli = CliRunner()
    r = cli.invoke(app, ARGS)
    assert r.exit_code == 0, r.output
    for label in ("old", "fixed", "bosmask"):
        assert f"under {label}" in r.output
    doc = json.loads(cli.invoke(app, ARGS + ["--json"]).output)
    worst = max(d["first"] for lg in doc["logics"] for d in lg["documents"])
    assert cli.invoke(app, ARGS + ["--check"]).exit_code == 2  # no limit given
    assert cli.invoke(app, ARGS + ["--check", "--leak-limit", str(worst * 2)]).exit_code == 0
    assert cli.invoke(app, ARGS + ["--check", "--leak-limit", str(worst / 2)]).exit_code == 1
    r = cli.invoke(app, ARGS[:-3] + ["chunked,packed"])
    assert r.exit_code == 2


def test_cli_hf_padded_and_rollback_pass_on_a_consistent_model():
    pytest.importorskip("transformers")
    r = CliRunner().invoke(app, ["compare", "--impl", "hf", "--hf-model", "llama", "--schedules", "padded,rollback",
                                 "--seq-len", "32", "--gen-len", "12", "-q"])
    assert r.exit_code == 0 and "OK: every schedule matches the full forward pass within 10x the noise floor" in r.output, r.output
    assert "restored from a copy" in r.output


@pytest.mark.parametrize("model", ["mamba", "mamba2"])
def test_padded_passes_on_the_mamba_family(model):
    """transformers #48256 is a right-padded prefill corrupting Mamba-family caches: the built-in
    tiny Mamba and Mamba-2 keep each row of a padded batch equal to the row alone, with the padding
    boundary recorded (so padding really was in the batch) and the state shown to matter."""
    pytest.importorskip("transformers")
    r = CliRunner().invoke(app, ["compare", "--impl", "hf", "--hf-model", model, "--schedules", "padded",
                                 "--seq-len", "24", "--json", "-q"])
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    (run,) = doc["runs"]
    assert run["passed"] and run["boundaries"]["padding"] == [18], run["boundaries"]
    assert doc["verdict"].startswith("OK"), doc["verdict"]
