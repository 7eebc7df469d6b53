"""`--impl llamacpp` on the real llama.cpp: runs when $SMEARCLI_LLAMACPP_PYTHON names the Python of
an environment made by scripts/make_env.sh llamacpp (skipped with the reason otherwise). A tiny
Llama must be OK with power; a tiny Mamba must give every schedule a result (measured, refused as
llama.cpp documents, or crashed with llama.cpp's frame), never an error of smearcli's."""

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

pytest.importorskip("transformers", reason="transformers is not installed: pip install 'smearcli[hf]'")

from smearcli.cli.app import app  # noqa: E402
from smearcli.engines import transformers as hf  # noqa: E402
from smearcli.engines.llamacpp import LLAMACPP_SCHEDULES  # noqa: E402
from conftest import LLAMACPP_PYTHON as PYTHON, NEEDS_LLAMACPP, ROOT  # noqa: E402 - ROOT: the clone's root

pytestmark = NEEDS_LLAMACPP
runner = CliRunner()
ALL = list(LLAMACPP_SCHEDULES)  # the engine's own list: one source of truth


def run(tmp_path, name, T=48, *extra):
    d = tmp_path / name
    if not d.exists():
        hf.tiny_model(name).save_pretrained(d, safe_serialization=True)
    r = runner.invoke(app, ["compare", "--impl", "llamacpp", "--hf-model", str(d), "--llamacpp-python", PYTHON,
                            "--seq-len", str(T), "--threads", "2", "--json", *extra])
    assert "Traceback" not in r.output and "internal error" not in r.output, r.output
    return r, json.loads(r.stdout)


def test_a_tiny_llama_is_ok_with_power(tmp_path):
    r, doc = run(tmp_path, "llama", 48, "--check")
    assert r.exit_code == 0, doc["verdict"]
    assert [x["schedule"] for x in doc["runs"]] == ALL and doc["not_measured"] == []
    assert doc["verdict"].startswith("OK") and "would see" in doc["verdict"]
    assert "every cached path matches llama.cpp's own one-call prefill" in doc["verdict"]


def test_a_tiny_mamba_gives_every_schedule_a_result(tmp_path):
    r, doc = run(tmp_path, "mamba", 48)
    got = {x["schedule"]: "measured" for x in doc["runs"]}
    got.update({x["schedule"]: x["outcome"] for x in doc["not_measured"]})
    assert sorted(got) == sorted(ALL), doc["verdict"]
    assert got["prefill"] == "measured" and got["ubatch"] == "measured"
    for x in doc["not_measured"]:  # a refusal names llama.cpp's documented limit; a crash its frame
        assert x["message"] and ("documented limit" in x["message"] or x["outcome"] == "crashed"), x
    print(doc["verdict"])
    print("\n".join(doc["model"]["notes"]))


def gguf_of(tmp_path, name) -> Path:
    """The tiny model `name` converted by the environment's own converter (as the worker does)."""
    import subprocess

    d, out = tmp_path / name, tmp_path / f"{name}.gguf"
    if not d.exists():
        hf.tiny_model(name).save_pretrained(d, safe_serialization=True)
    here = ROOT / "smearcli" / "engines" / "llamacpp"
    subprocess.run([PYTHON, "-c", f"import sys; sys.path.insert(0, {str(here)!r}); from worker_convert import "
                    f"convert; convert({str(d)!r}, {str(out)!r})"], check=True, capture_output=True, timeout=600)
    return out


def test_a_users_gguf_runs_and_one_of_another_architecture_is_refused(tmp_path):
    llama, mamba = gguf_of(tmp_path, "llama"), gguf_of(tmp_path, "mamba")
    r, doc = run(tmp_path, "llama", 32, "--gguf", str(llama), "--schedules", "prefill,ubatch,decode", "--check")
    assert r.exit_code == 0 and [x["schedule"] for x in doc["runs"]] == ["prefill", "ubatch", "decode"], r.output
    assert doc["verdict"].startswith("OK")  # the same weights: its one-call prefill matches transformers
    d = tmp_path / "llama"
    r = runner.invoke(app, ["compare", "--impl", "llamacpp", "--hf-model", str(d), "--llamacpp-python", PYTHON,
                            "--seq-len", "32", "--gguf", str(mamba)])
    assert r.exit_code == 2 and "its architecture is 'mamba'" in r.output and "'llama' in llama.cpp" in r.output


def test_a_decode_past_the_watchdogs_limit_is_aborted_inside_llamacpp():
    """llama.cpp's abort callback stops a llama_decode that runs past the schedule's limit (here a
    microsecond): that schedule's crash, saying so, never a hang."""
    import torch

    from smearcli.engines import llamacpp
    from smearcli.measure.schedules import ScheduleOptions

    import tempfile

    with tempfile.TemporaryDirectory() as t:
        hf.tiny_model("llama").save_pretrained(t, safe_serialization=True)
        s = llamacpp.Settings(python=PYTHON, model=t, vocab=128, stuck_s=1e-6, f16_too=False)
        r = llamacpp.LlamaCppRunner(s, ["prefill", "decode"])
        tokens = torch.randint(0, 128, (1, 16))
        for name in ("prefill", "decode"):
            out = r.run(name, tokens, ScheduleOptions())
            assert out.outcome == "crashed" and "aborted by the watchdog's abort callback" in out.message, out.message
