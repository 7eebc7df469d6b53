"""`--impl vllm` without vLLM: the adapter against a stand-in worker (tests/vllm_standin.py) that
speaks the worker's protocol and computes with transformers, including one whose prefix request
returns garbage at the cached positions (dropped, so it passes), one that never reads the cache
(checked nothing), one that crashes in the prefix schedule, one that dies, and one with a
chunk-boundary error. The real vLLM checks are tests/test_vllm_real.py."""

import json
import stat
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

pytest.importorskip("transformers", reason="transformers is not installed: pip install 'smearcli[hf]'")

from smearcli.cli.app import app  # noqa: E402
from smearcli.impls import hf, vllm  # noqa: E402
from smearcli.schedules import ScheduleOptions  # noqa: E402

runner = CliRunner()
STANDIN = Path(__file__).with_name("vllm_standin.py")
T = 64  # two cache blocks of 32: the prefix request covers the first


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("llama")
    hf.tiny_model("llama").save_pretrained(d, safe_serialization=True)
    return d


@pytest.fixture
def fake_python(tmp_path):
    """An executable that runs the stand-in with the worker's two arguments, as vLLM's Python would
    run the worker."""
    p = tmp_path / "python"
    p.write_text(f'#!/bin/sh\nshift\nexec "{sys.executable}" "{STANDIN}" "$@"\n')
    p.chmod(p.stat().st_mode | stat.S_IXUSR)
    return p


def compare(model_dir, fake_python, monkeypatch, tmp_path, mode="good", *extra):
    monkeypatch.setenv("SMEARCLI_STANDIN_MODE", mode)
    monkeypatch.setenv("SMEARCLI_STANDIN_SEEN", str(tmp_path / "seen.json"))
    r = runner.invoke(app, ["compare", "--impl", "vllm", "--hf-model", str(model_dir), "--vllm-python",
                            str(fake_python), "--seq-len", str(T), "--chunks", "4", "--json", *extra])
    assert "Traceback" not in r.output, r.output
    return r, (json.loads(r.stdout) if r.stdout.strip().startswith("{") else None)


def test_every_schedule_against_the_transformers_reference(model_dir, fake_python, monkeypatch, tmp_path):
    r, doc = compare(model_dir, fake_python, monkeypatch, tmp_path)
    assert r.exit_code == 0, r.output
    runs = {x["schedule"]: x for x in doc["runs"]}
    assert list(runs) == ["prefill", "decode", "chunked", "prefix"] and doc["not_measured"] == []
    assert doc["layers"] == ["logits"] and all(x["logic"] == "vllm" and x["passed"] for x in runs.values())
    assert runs["chunked"]["steps"] == [16] * 4 and runs["decode"]["steps"] == [1] * T
    # the prefix request's garbage below num_cached_tokens was dropped: positions 0..31 come
    # from the first request, so the run is measured on every position and passes
    assert runs["prefix"]["steps"] == [32, 32] and runs["prefix"]["chunk_starts"] == [32]
    assert runs["prefix"]["max_abs_logits"] < 1e-4
    seen = json.loads((tmp_path / "seen.json").read_text())
    assert seen["protocol"] == vllm.PROTOCOL and len(seen["rows"][0]) == T and seen["vocab"] == 128
    assert {s["name"]: s for s in seen["schedules"]}["prefix"]["prefix"] == 32
    assert doc["verdict"].startswith("OK")


@pytest.mark.slow  # a subprocess of its own, seconds each (the fast loop leaves it out)
def test_a_cache_that_was_never_read_checked_nothing(model_dir, fake_python, monkeypatch, tmp_path):
    r, doc = compare(model_dir, fake_python, monkeypatch, tmp_path, "nocache")
    assert r.exit_code == 0, r.output
    (nm,) = doc["not_measured"]
    assert nm["schedule"] == "prefix" and nm["outcome"] == "checked nothing" and "num_cached_tokens 0" in nm["message"]
    assert "prefix" not in {x["schedule"] for x in doc["runs"]}
    assert "prefix checked nothing" in doc["verdict"]


@pytest.mark.slow  # a subprocess of its own, seconds each (the fast loop leaves it out)
def test_a_crash_in_vllm_is_that_schedules_result(model_dir, fake_python, monkeypatch, tmp_path):
    r, doc = compare(model_dir, fake_python, monkeypatch, tmp_path, "crash", "--check")
    assert r.exit_code == 1, r.output  # the engine's failure, not ours: no "internal error"
    assert "internal error" not in r.output and "bug in smearcli" not in r.output
    (nm,) = doc["not_measured"]
    assert nm["outcome"] == "crashed" and "IndexError" in nm["message"] and "conv_ssm_forward" in nm["message"]
    assert all(x["passed"] for x in doc["runs"]) and len(doc["runs"]) == 3
    assert doc["verdict"].startswith("BUG: prefix crashed: IndexError")
    assert "every run measured matches" in doc["verdict"]


@pytest.mark.slow  # a subprocess of its own, seconds each (the fast loop leaves it out)
def test_a_worker_that_dies_crashes_every_schedule(model_dir, fake_python, monkeypatch, tmp_path):
    r, doc = compare(model_dir, fake_python, monkeypatch, tmp_path, "die")
    assert r.exit_code == 0 and doc["runs"] == []  # without --check: reported, exit 0
    assert [x["schedule"] for x in doc["not_measured"]] == ["prefill", "decode", "chunked", "prefix"]
    assert all("exited with status 1: Fatal Python error" in x["message"] for x in doc["not_measured"])


@pytest.mark.slow  # a subprocess of its own, seconds each (the fast loop leaves it out)
def test_a_chunk_boundary_error_is_found_where_it_is_born(model_dir, fake_python, monkeypatch, tmp_path):
    r, doc = compare(model_dir, fake_python, monkeypatch, tmp_path, "skew", "--batch", "2")
    assert doc["input"] == {"batch": 2, "seq_len": T}
    runs = {x["schedule"]: x for x in doc["runs"]}
    assert not runs["chunked"]["passed"] and runs["chunked"]["first_departure"] == {"layer": "logits", "position": 16}
    assert runs["prefill"]["passed"] and runs["prefix"]["passed"]


@pytest.mark.slow  # a subprocess of its own, seconds each (the fast loop leaves it out)
def test_the_table_says_what_ran(model_dir, fake_python, monkeypatch, tmp_path):
    monkeypatch.setenv("SMEARCLI_STANDIN_MODE", "crash")
    r = runner.invoke(app, ["compare", "--impl", "vllm", "--hf-model", str(model_dir), "--vllm-python",
                            str(fake_python), "--seq-len", str(T)])
    assert "prefix crashed: IndexError" in r.output and "log-probabilities" in r.output
    assert "vLLM stand-in on cpu" in r.output


def test_refusals(model_dir, fake_python, monkeypatch, tmp_path):
    base = ["compare", "--impl", "vllm", "--hf-model", str(model_dir)]
    monkeypatch.delenv(vllm.ENV_PYTHON, raising=False)
    cases = [
        ([], "needs --vllm-python PATH"),
        (["--vllm-python", str(tmp_path / "nope")], "--vllm-python " + str(tmp_path / "nope") + ": no Python"),
        (["--vllm-python", str(fake_python), "--schedules", "engine"], "engine cannot run with --impl vllm"),
        (["--vllm-python", str(fake_python), "--chunk-sizes", "20,24,20"], "fixed token budget"),
        (["--vllm-python", str(fake_python), "--seq-len", "32", "--schedules", "prefix"], "more than one cache block"),
        (["--vllm-python", str(fake_python), "--tensor-parallel-size", "2"], "give --device cuda"),
        (["--vllm-python", str(fake_python), "--gen-len", "4"], "does not apply|does not run"),
    ]
    for extra, want in cases:
        r = runner.invoke(app, base + extra)
        assert r.exit_code == 2, (extra, r.output)
        assert any(w in r.stderr for w in want.split("|")), (extra, r.stderr)
        assert len(r.stderr.strip().splitlines()) == 1, r.stderr
    r = runner.invoke(app, ["compare", "--impl", "vllm", "--hf-model", "llama", "--vllm-python", str(fake_python)])
    assert r.exit_code == 2 and "needs a local model directory" in r.stderr
    r = runner.invoke(app, ["compare", "--vllm-python", str(fake_python)])
    assert r.exit_code == 2 and "--vllm-python is used by --impl vllm" in r.stderr
    for impl in ("ours", "hf"):  # the prefix schedule is for engines with a prefix cache only
        r = runner.invoke(app, ["compare", "--impl", impl, "--schedules", "prefix"] + ["--hf-model", "llama"] * (impl == "hf"))
        assert r.exit_code == 2 and f"prefix cannot run with --impl {impl}" in r.stderr, r.output
    monkeypatch.setenv(vllm.ENV_PYTHON, str(tmp_path / "from-env"))
    r = runner.invoke(app, base)
    assert r.exit_code == 2 and "from-env: no Python" in r.stderr


def test_chunk_budget_and_prefix_length():
    assert vllm.chunk_budget(64, ScheduleOptions(chunks=4)) == 16
    assert vllm.chunk_budget(10, ScheduleOptions(chunk_sizes=(4, 4, 2))) == 4
    with pytest.raises(Exception, match="4,4,2"):
        vllm.chunk_budget(10, ScheduleOptions(chunks=3))  # 4,3,3 is not a fixed budget
    assert vllm.prefix_len(64) == 32 and vllm.prefix_len(65) == 64 and vllm.prefix_len(33) == 32


@pytest.mark.slow  # a subprocess of its own, seconds each (the fast loop leaves it out)
def test_plot_draws_a_vllm_run(model_dir, fake_python, monkeypatch, tmp_path):
    monkeypatch.setenv("SMEARCLI_STANDIN_MODE", "skew")
    out = tmp_path / "vllm.png"
    r = runner.invoke(app, ["plot", "--impl", "vllm", "--hf-model", str(model_dir), "--vllm-python",
                            str(fake_python), "--seq-len", str(T), "--schedules", "chunked", "--out", str(out)])
    assert r.exit_code == 0, r.output
    assert out.stat().st_size > 10_000 and "schedule chunked" in r.output
