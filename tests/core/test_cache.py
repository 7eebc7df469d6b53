"""The KV cache: transactional steps and engine-style expansion."""

import pytest
import torch

from smearcli.gpt.cache import CacheFullError
from smearcli.gpt.weights import random_config, random_model


@pytest.fixture(scope="module")
def model():
    return random_model(random_config(2), seed=1).model


def _state(cache):
    return cache.get_pos(), cache.seqlens.clone(), None if cache.prev_embedding is None else cache.prev_embedding.clone()


def test_full_cache_raises_and_leaves_state(model):
    tok = torch.randint(0, 256, (1, 12))
    cache = model.new_cache(1, 10)
    model(tok[:, :8], cache=cache)
    before = _state(cache)
    with pytest.raises(CacheFullError):
        model(tok[:, 8:12], cache=cache)
    after = _state(cache)
    assert before[0] == after[0] == 8
    assert torch.equal(before[1], after[1]) and torch.equal(before[2], after[2])


def test_failure_mid_step_leaves_state(model, monkeypatch):
    tok = torch.randint(0, 256, (1, 8))
    cache = model.new_cache(1, 16)
    model(tok[:, :4], cache=cache)
    before = _state(cache)
    last = model.transformer.h[-1]
    monkeypatch.setattr(last.mlp, "forward", lambda x: (_ for _ in ()).throw(RuntimeError("boom")))
    with pytest.raises(RuntimeError):
        model(tok[:, 4:], cache=cache)
    monkeypatch.undo()
    after = _state(cache)
    assert before[0] == after[0] and torch.equal(before[2], after[2])
    # the cache is still usable and gives the same answer as if nothing had happened
    ref = model(tok)
    out = model(tok[:, 4:], cache=cache, smear="fixed")
    torch.testing.assert_close(out, ref[:, 4:], rtol=0, atol=1e-5)


def test_expand_copies_prev_embedding(model):
    tok = torch.randint(0, 256, (1, 6))
    c1 = model.new_cache(1, 6)
    model(tok, cache=c1)
    c3 = model.new_cache(3, 10)
    c3.expand_from(c1)
    assert c3.get_pos() == 6 and c3.seqlens.tolist() == [6, 6, 6]
    assert c3.prev_embedding.shape == (3, 1, model.config.n_embd)
    assert torch.equal(c3.prev_embedding[2], c1.prev_embedding[0])
    assert torch.equal(c3.k[:, 1, :6], c1.k[:, 0, :6])
    with pytest.raises(ValueError):
        c3.expand_from(c1)  # not empty any more


def test_reset(model):
    c = model.new_cache(1, 4)
    model(torch.zeros(1, 2, dtype=torch.long), cache=c)
    c.reset()
    assert c.get_pos() == 0 and c.prev_embedding is None and int(c.seqlens[0]) == 0
