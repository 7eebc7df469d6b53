"""`--impl vllm` against real vLLM: skipped unless $SMEARCLI_VLLM_PYTHON names vLLM's interpreter.

    scripts/make_env.sh vllm /opt/vllm-env           # once, about 6 to 11 minutes, 3.4 GB
    SMEARCLI_VLLM_PYTHON=/opt/vllm-env/bin/python python -m pytest tests/impls/test_vllm_real.py

A tiny Llama (head_dim 64, which vLLM's CPU attention takes) must match its transformers reference
on every schedule, the prefix schedule having really read the cache; a tiny Mamba2's prefix
schedule crashes inside vLLM 0.32 (`mamba_mixer2.conv_ssm_forward`), which must be reported as
that schedule's result while its other schedules match. Each model takes about a minute on two
CPU cores (vLLM's import and engine starts dominate).
"""

import json
import os

import pytest
import torch
from typer.testing import CliRunner

from smearcli.engines.vllm import ENV_PYTHON

PY = os.environ.get(ENV_PYTHON, "").strip()
pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(not PY, reason=f"set {ENV_PYTHON} to vLLM's interpreter to run these")]
transformers = pytest.importorskip("transformers")

from smearcli.cli.app import app  # noqa: E402

runner = CliRunner()


def save(tmp_path, name, config):
    d = tmp_path / name
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        transformers.AutoModelForCausalLM.from_config(config).float().eval().save_pretrained(d, safe_serialization=True)
    return d


def run(model_dir):
    r = runner.invoke(app, ["compare", "--impl", "vllm", "--hf-model", str(model_dir), "--seq-len", "64",
                            "--chunks", "4", "--json", "--device", "cpu"])
    assert "Traceback" not in r.output, r.output
    return r, json.loads(r.stdout)


def test_llama_matches_transformers_on_every_schedule(tmp_path):
    d = save(tmp_path, "llama", transformers.LlamaConfig(
        vocab_size=256, hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=2,
        num_key_value_heads=1, head_dim=64, max_position_embeddings=512))
    r, doc = run(d)
    assert r.exit_code == 0, r.output
    runs = {x["schedule"]: x for x in doc["runs"]}
    assert set(runs) == {"prefill", "decode", "chunked", "prefix"} and doc["not_measured"] == []
    assert all(x["passed"] for x in runs.values()), doc["verdict"]
    assert runs["chunked"]["steps"] == [16] * 4 and runs["prefix"]["steps"] == [32, 32]  # 32 tokens read from the cache
    assert max(x["max_abs_logits"] for x in runs.values()) < 1e-4


def test_mamba2_prefix_caching_crash_is_the_schedules_result(tmp_path):
    d = save(tmp_path, "mamba2", transformers.Mamba2Config(
        vocab_size=256, hidden_size=128, num_hidden_layers=2, state_size=16, expand=2, n_groups=1, num_heads=8,
        head_dim=32, chunk_size=16, conv_kernel=4))
    r, doc = run(d)
    assert r.exit_code == 0, r.output  # no --check: reported, not an error of ours
    (nm,) = doc["not_measured"]
    assert nm["schedule"] == "prefix" and nm["outcome"] == "crashed" and "IndexError" in nm["message"]
    assert {x["schedule"] for x in doc["runs"]} == {"prefill", "decode", "chunked"}
    assert all(x["passed"] for x in doc["runs"])
