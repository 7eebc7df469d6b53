"""Loading nanochat checkpoint directories: format details upstream checkpoints carry, and names
of them torch's own code cannot take."""

import json
import os
from pathlib import Path

import pytest
import torch

from smearcli.util.errors import UserError
from smearcli.gpt.checkpoint import can_mmap, read_state_dict
from smearcli.gpt.weights import load_checkpoint, random_config, random_model, save_checkpoint


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


def _mapped_inodes() -> set[int]:
    """Inodes of the files this process has memory-mapped (/proc/self/maps' fifth column)."""
    with open("/proc/self/maps", "rb") as f:  # binary: the paths are the file system's bytes
        return {int(line.split()[4]) for line in f if len(line.split()) >= 6}


# directory names torch's C++ code cannot be given as they are (it encodes a name as UTF-8):
# a byte that is not UTF-8 (a surrogate escape in Python's name of it), and "café" as Python
# names it under LC_ALL=C PYTHONUTF8=0 (its two UTF-8 bytes escaped, the file system encoding ASCII)
ODD_NAMES = {"not-utf8": b"ckpt-\xff", "c-locale": "caf\u00e9".encode()}


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="checks Linux's /proc memory maps")
@pytest.mark.parametrize("kind", sorted(ODD_NAMES))
def test_names_torch_cannot_take_load_and_stay_memory_mapped(tmp_path, src, kind):
    raw = os.fsencode(tmp_path) + b"/" + ODD_NAMES[kind]
    name = os.fsdecode(raw) if kind == "not-utf8" else \
        f"{tmp_path}/" + ODD_NAMES[kind].decode("ascii", "surrogateescape")
    assert os.fsencode(name) == raw  # the same directory, as Python names it in that locale
    try:
        save_checkpoint(src, name, 1)
    except OSError as e:  # a file system that takes UTF-8 names only
        pytest.skip(f"the file system refuses the name ({e})")
    with pytest.raises(UnicodeEncodeError):
        name.encode("utf-8")  # what torch's mmap (UntypedStorage.from_file) would have to do
    path = Path(name) / "model_000001.pt"
    assert can_mmap(path)
    sd = read_state_dict(path)
    assert os.stat(path).st_ino in _mapped_inodes()  # memory-mapped, not read into memory
    assert torch.equal(sd["lm_head.weight"], src.state_dict()["lm_head.weight"])
    assert torch.equal(_logits(load_checkpoint(name).model), _logits(src))
