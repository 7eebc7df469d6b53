"""smearcli.testing: the one-line cache check, on our GPT with the fixed and the old smear logic."""

import pytest
import torch

from smearcli.util.defaults import layer_names
from smearcli.gpt.weights import random_config, random_model
from smearcli.gpt.smear import smear_gate
from smearcli.gpt.model import rms_norm
from smearcli.measure.compare import Comparison
from smearcli.testing import assert_cache_consistent, check_cache_consistency, gpt_step
from smearcli.judging.verdicts import OK

T = 48
CHUNKS = (16, 16, 16)


@pytest.fixture(scope="module")
def model():
    return random_model(random_config(2), seed=3).model


@pytest.fixture(scope="module")
def tokens():
    return torch.randint(0, 256, (1, T), generator=torch.Generator().manual_seed(5))


def _names(model):
    return layer_names(model.config.n_layer)


def test_fixed_logic_passes(model, tokens):
    check = assert_cache_consistent(gpt_step(model, "fixed"), tokens, chunk_sizes=CHUNKS,
                                    layer_names=_names(model))
    assert isinstance(check, Comparison) and check.passed
    chunked = check.get("chunked")
    assert chunked.steps == list(CHUNKS) and chunked.chunk_starts == [16, 32]
    assert chunked.logits_multiple <= check.tolerance
    assert check.word is OK


def test_old_logic_fails_naming_first_chunk_start(model, tokens):
    with pytest.raises(AssertionError) as err:
        assert_cache_consistent(gpt_step(model, "old"), tokens, chunk_sizes=CHUNKS, layer_names=_names(model))
    msg = str(err.value)
    # where born (the post-smear embedding, at the first chunk start), how big, how far it spreads
    assert "born at emb@16, the first chunk start (16)" in msg
    assert "max |dlogit|" in msg and "positions above" in msg
    assert "decode" in msg and "chunked" in msg


def test_old_logic_result_fields(model, tokens):
    check = check_cache_consistency(gpt_step(model, "old"), tokens, chunks=3, layer_names=_names(model))
    assert not check.passed
    assert [m.schedule for m in check.failures] == ["chunked"]
    m = check.get("chunked")
    assert check.born_at(m) == ("emb", 16)
    assert check.start_share(m) > 0.999  # the embedding error sits on chunk starts (rest: rounding)
    # decode passes (one-token steps are the same in both logics), measured against the float64 floor
    assert check.get("decode").passed and check.noise.float64
    assert check.confirmation(m).status == "bug" and check.word == "bug"  # keeps its size in float64
    # the error at the first chunk start equals the term the old logic drops: gate_t * x_{t-1}
    with torch.inference_mode():
        x = rms_norm(model.transformer.wte(tokens))
        term = (smear_gate(x, model.smear_gate.weight, model.smear_lambda)[:, 16] * x[:, 15]).abs().max()
    assert float(m.abs_err[0, 16]) == pytest.approx(float(term), rel=1e-4)
    assert m.max_abs_logits > 100 * check.noise.per_layer[-1]


def test_logits_only_step_still_locates_position(model, tokens):
    inner = gpt_step(model, "old")

    def logits_only(ids, cache):
        logits, _, cache = inner(ids, cache)
        return logits, cache

    check = check_cache_consistency(logits_only, tokens, chunk_sizes=(20, 28))
    assert check.layers == ["logits"]
    assert check.born_at(check.get("chunked")) == ("logits", 20)
    assert "first chunk start (20)" in check.describe(check.get("chunked"))
    assert "at the chunk start of chunked: 20" in check.verdict


def test_full_reference_and_more_schedules(model, tokens):
    def full(ids):
        cap = []
        return model(ids, smear="fixed", capture=cap), cap

    check = check_cache_consistency(gpt_step(model, "fixed"), tokens, schedules=("prefill", "decode", "chunked", "speculative"),
                                    full=full, layer_names=_names(model))
    assert [m.schedule for m in check.metrics] == ["prefill", "decode", "chunked", "speculative"]
    assert check.passed, check.table()
    assert check.get("speculative").steps == [16] + [4] * 8
    assert "16,8x4" in check.table()


def test_bad_step_and_sizes(model, tokens):
    with pytest.raises(ValueError, match="sum to"):
        check_cache_consistency(gpt_step(model), tokens, chunk_sizes=(10, 10))
    with pytest.raises(TypeError, match="must return"):
        check_cache_consistency(lambda ids, cache: ids, tokens)
    with pytest.raises(ValueError, match="layer names"):
        check_cache_consistency(gpt_step(model), tokens, layer_names=["a", "b"])


# -- arguments and answers that cannot mean anything: one error naming the argument ---------------
def _returning(model, change):
    inner = gpt_step(model, "fixed")

    def step(ids, cache):
        logits, hs, cache = inner(ids, cache)
        return change(logits), hs, cache
    return step


@pytest.mark.parametrize("kwargs, error, words", [
    (dict(tokens="float"), TypeError, "tokens must be integer token ids, got float32"),
    (dict(tokens="one"), ValueError, "tokens must be (batch, seq_len) with at least 2 tokens, got shape (1, 1)"),
    (dict(chunk_sizes=(24.5, 23.5)), TypeError, "chunk_sizes must be whole numbers of tokens, got 24.5"),
    (dict(chunk_sizes=(16, 16)), ValueError, "chunk_sizes must be positive and sum to the 48 tokens, got 16, 16"),
    (dict(chunk_sizes=(48, 0)), ValueError, "chunk_sizes must be positive"),
    (dict(chunks=0), ValueError, "chunks must be a whole number >= 1, got 0"),
    (dict(tolerance=float("nan")), ValueError, "tolerance must be a finite number > 0"),
    (dict(tolerance=-1.0), ValueError, "tolerance must be a finite number > 0"),
    (dict(change=lambda x: x[:, :-1]), ValueError, "step returned logits of shape"),
    (dict(change=lambda x: torch.cat([x, x])), ValueError, "for ids of shape (1, 2): they must be (batch, tokens, vocab)"),
    (dict(change=lambda x: x.long()), TypeError, "step returned int64 logits; they must be floating point"),
    (dict(change=lambda x: x * float("nan")), ValueError, "step returned non-finite logits"),
    (dict(change=lambda x: x.masked_fill(x > 0, float("inf"))), ValueError, "step returned non-finite logits"),
])
def test_what_cannot_mean_anything_is_one_error_naming_it(model, tokens, kwargs, error, words):
    kwargs = dict(kwargs)
    ids = {"float": tokens.float(), "one": tokens[:, :1]}.get(kwargs.pop("tokens", None), tokens)
    change = kwargs.pop("change", None)
    step = gpt_step(model, "fixed") if change is None else _returning(model, change)
    with pytest.raises(error) as err:
        check_cache_consistency(step, ids, **kwargs)
    assert words in str(err.value)


def test_a_full_pass_that_returns_nan_is_named():
    model = random_model(random_config(2), seed=3).model
    ids = torch.randint(0, 256, (1, 8), generator=torch.Generator().manual_seed(0))
    with pytest.raises(ValueError, match="full returned non-finite logits"):
        check_cache_consistency(gpt_step(model, "fixed"), ids, full=lambda x: model(x) * float("nan"))


def test_an_exception_in_the_step_goes_through_as_it_is(model, tokens):
    def step(ids, cache):
        raise KeyError("their cache slot")
    with pytest.raises(KeyError, match="their cache slot"):
        check_cache_consistency(step, tokens)
