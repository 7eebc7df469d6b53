"""The scan's guarantees on real transformers models, and `compare --impl hf` getting them:
a floor that a wrong decode cannot raise (Bamba fails under --check), state shown to matter
(Zamba2 at default init is inconclusive), `state=` and caller-made caches, their exceptions as the
model's result, and reproducers that exit 1 while the bug is there and 0 on a consistent model."""

from __future__ import annotations

import ast

import pytest
import torch
from typer.testing import CliRunner

pytest.importorskip("transformers", reason="transformers is not installed: pip install 'smearcli[hf]'")

from smearcli.cli.app import app  # noqa: E402
from smearcli.measure.compare import compare  # noqa: E402
from smearcli.engines.transformers import repro  # noqa: E402
from smearcli.engines.transformers.check import check  # noqa: E402
from smearcli.census.record import new as record  # noqa: E402
from smearcli.judging.verdicts import BUG, CRASHED  # noqa: E402
from smearcli.tiny.derive import derive  # noqa: E402
from smearcli.measure.runner import StepRunner  # noqa: E402

FAST = ["--seq-len", "48", "--chunks", "3"]


def invoke(*args):
    r = CliRunner().invoke(app, [str(a) for a in args])
    assert "Traceback" not in r.output and "bug in smearcli" not in r.output, r.output
    return r


def saved(tmp_path, model_type: str):
    from smearcli.engines.transformers.check import build

    path = tmp_path / model_type
    build(derive(model_type).config, None, 0).save_pretrained(path)
    return path


# -- the floor: decode cannot raise it ----------------------------------------------------------
def restart_positions():
    """A stand-in with Bamba's bug: each cached step numbers its tokens from 0."""
    g = torch.Generator().manual_seed(0)
    E, P, W = (torch.randn(16, 8, generator=g), torch.randn(64, 8, generator=g), torch.randn(8, 16, generator=g))

    def logits(ids, start):
        pos = torch.arange(ids.size(1)) + start
        return (torch.tanh((E[ids] + P[pos]).cumsum(1)) @ W)

    full = lambda ids: logits(ids, 0)
    step = lambda ids, cache: (logits(ids, 0), None)  # the offset is ignored: positions restart
    return StepRunner(fn=step, full=full, label="toy"), E, P, W


def test_restarting_positions_fail_decode_too_now_that_no_floor_comes_from_decode():
    """Wrong on every cached call alike: a floor from decode called it "within noise"; the floor
    is now the full pass against itself (float64 where it can be made; here one ulp), never a
    schedule under test."""
    r, E, P, W = restart_positions()
    ids = torch.randint(0, 16, (1, 32), generator=torch.Generator().manual_seed(1))
    new = compare(r, ids, ["prefill", "decode", "chunked"])
    assert not new.passed and not new.get("decode").passed and not new.get("chunked").passed
    assert new.get("prefill").passed and "one ulp" in new.noise.source


@pytest.mark.slow
def test_bamba_fails_compare_check_and_its_shape_is_positions(tmp_path):
    r = invoke("compare", "--impl", "hf", "--hf-model", saved(tmp_path, "bamba"), "--check", "-q", *FAST)
    assert r.exit_code == 1, r.output
    assert "BUG" in r.output and "float64" in r.output


@pytest.mark.slow
def test_zamba2_at_default_init_is_inconclusive_not_ok():
    r = invoke("compare", "--impl", "hf", "--hf-model", "zamba2", "--check", "-q", *FAST)
    assert r.exit_code == 1, r.output
    assert "INCONCLUSIVE" in r.output and "recurrent" in r.output


@pytest.mark.slow
def test_rwkv_runs_through_state_and_xlstm_crash_is_theirs(tmp_path):
    r = invoke("compare", "--impl", "hf", "--hf-model", saved(tmp_path, "rwkv"), "-q", *FAST)
    assert r.exit_code == 0, r.output
    assert "OK" in r.output
    r = invoke("compare", "--impl", "hf", "--hf-model", saved(tmp_path, "xlstm"), "-q", *FAST)
    assert r.exit_code == 1
    assert "the model's own code raised" in r.stderr and "transformers/models/xlstm/" in r.stderr


# -- the scan's check and its reproducers ---------------------------------------------------------
@pytest.mark.slow
def test_check_finds_falcon_mamba_and_its_reproducer_exits_1(tmp_path):
    rec = check("falcon_mamba", repro_dir=tmp_path)
    assert rec.verdict == BUG and rec.shape == "state dropped at chunk starts"
    assert rec.reproducer_status == 1, rec.reproducer_output
    src = (tmp_path / "falcon_mamba.py").read_text()
    imported = {n.names[0].name.split(".")[0] for n in ast.walk(ast.parse(src)) if isinstance(n, ast.Import)}
    imported |= {n.module.split(".")[0] for n in ast.walk(ast.parse(src)) if isinstance(n, ast.ImportFrom)}
    assert imported <= {"contextlib", "copy", "inspect", "json", "sys", "torch", "transformers"}


@pytest.mark.slow
def test_a_reproducer_of_a_consistent_model_exits_0(tmp_path):
    cfg = derive("llama").config
    rec = record("llama", BUG, worst_schedule="chunks of 16", steps=[16, 16, 17], max_abs=0.0, shape="-")
    path = repro.write(rec, cfg, tmp_path / "llama.py")
    status, line = repro.run(path)
    assert status == 0, line
    assert "max |dlogit|" in line or "floor" in line


def test_a_crash_in_their_code_is_the_result():
    cfg = derive("llama").config
    cfg.num_key_value_heads = 3  # 4 query heads over 3 kv heads: their attention cannot build
    rec = check("llama", config=cfg)
    assert rec.verdict in (CRASHED, "not built")
    assert "transformers/" in rec.reason


def test_the_census_names_capture_points_as_compare_impl_hf_does():
    """One name scheme for a Hugging Face model's layers: the census's capture points are
    `hf.hidden_names`, the ones `compare --impl hf` prints (emb, layer0, ...), never hidden_states[i]
    where the count says which is which."""
    from smearcli.engines.transformers.check import layer_names
    from smearcli.engines import transformers as hf
    from smearcli.engines.transformers.cache_runner import CacheRunner

    model, _ = hf.load("llama")
    tokens = hf.random_tokens(model, 8)
    names = layer_names(CacheRunner(model), tokens)
    assert names == list(hf.runner(model, "llama", tokens).layers) == ["emb", "layer0", "layer1", "logits"]
