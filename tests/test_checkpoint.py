"""Loading nanochat checkpoint directories: format details upstream checkpoints carry."""

import json

import pytest
import torch

from smearcli.errors import UserError
from smearcli.weights import load_checkpoint, random_config, random_model, save_checkpoint


@pytest.fixture(scope="module")
def src():
    return random_model(random_config(2), seed=3).model


def _logits(model):
    tokens = torch.arange(20).unsqueeze(0)
    return model(tokens)


def _write(d, step, sd, config):
    d.mkdir(parents=True, exist_ok=True)
    torch.save(sd, d / f"model_{step:06d}.pt")
    (d / f"meta_{step:06d}.json").write_text(json.dumps({"step": step, "model_config": config}))


def test_roundtrip(tmp_path, src):
    save_checkpoint(src, tmp_path, 7, {"note": "x"})
    lm = load_checkpoint(tmp_path)
    assert lm.step == 7 and lm.meta["note"] == "x"
    assert torch.equal(_logits(lm.model), _logits(src))


def test_newest_step_and_explicit_step(tmp_path, src):
    sd = src.state_dict()
    cfg = src.config.to_dict()
    _write(tmp_path, 5, sd, cfg)
    zeroed = {k: torch.zeros_like(v) if k == "smear_lambda" else v for k, v in sd.items()}
    _write(tmp_path, 12, zeroed, cfg)
    assert load_checkpoint(tmp_path).step == 12
    assert float(load_checkpoint(tmp_path).model.smear_lambda) == 0.0
    assert float(load_checkpoint(tmp_path, step=5).model.smear_lambda) == 0.5
    with pytest.raises(UserError, match="no step 6; present: 5, 12"):
        load_checkpoint(tmp_path, step=6)


def test_compiled_prefix_bf16_and_missing_lambdas(tmp_path, src):
    sd = {}
    for k, v in src.state_dict().items():
        if k in ("resid_lambdas", "x0_lambdas"):
            continue  # older checkpoints predate them
        if k == "transformer.wte.weight" or k.startswith("value_embeds."):
            v = v.to(torch.bfloat16)  # as GPU-trained checkpoints store them
        sd["_orig_mod." + k] = v
    _write(tmp_path, 1, sd, src.config.to_dict())
    model = load_checkpoint(tmp_path).model
    assert model.transformer.wte.weight.dtype == torch.float32
    assert torch.equal(model.resid_lambdas, torch.ones(2)) and torch.equal(model.x0_lambdas, torch.zeros(2))
    expect = src.transformer.wte.weight.to(torch.bfloat16).float()
    assert torch.equal(model.transformer.wte.weight, expect)


def test_old_meta_without_window_pattern_is_all_long(tmp_path, src):
    cfg = src.config.to_dict()
    del cfg["window_pattern"]
    _write(tmp_path, 1, src.state_dict(), cfg)
    model = load_checkpoint(tmp_path).model
    assert model.windows == [model.config.sequence_len] * model.config.n_layer


def test_bfloat16_compute(tmp_path, src):
    save_checkpoint(src, tmp_path, 1)
    model = load_checkpoint(tmp_path, dtype=torch.bfloat16).model
    logits = _logits(model)
    assert logits.dtype == torch.float32  # softcapped in fp32, as upstream
    assert (logits - _logits(src)).abs().max() < 0.5


@pytest.mark.parametrize("mutate, fragment", [
    (lambda sd: sd.pop("lm_head.weight"), "missing lm_head.weight"),
    (lambda sd: sd.__setitem__("extra.weight", torch.zeros(1)), "unexpected extra.weight"),
    (lambda sd: sd.__setitem__("smear_lambda", torch.zeros(2)), "smear_lambda has shape (2,)"),
    (lambda sd: sd.__setitem__("smear_lambda", torch.tensor([float("nan")])), "smear_lambda contains NaN"),
])
def test_bad_state_dicts_are_named(tmp_path, src, mutate, fragment):
    sd = dict(src.state_dict())
    mutate(sd)
    _write(tmp_path, 1, sd, src.config.to_dict())
    with pytest.raises(UserError) as e:
        load_checkpoint(tmp_path)
    assert fragment in str(e.value)
