"""`--impl vllm`: what vLLM refuses is said as what it is.

- A model directory without safetensors weights is refused up front, saying that safetensors are
  what is missing (and which files it found instead), before vLLM's environment is even started.
- An engine that refuses the model (vLLM 0.32.0's CPU attention lacks head size 16: measured on a
  tiny Llama, it raises at the first forward; other releases refuse at the engine's start; a C++
  exception ends the process) is that model's result: exit 1 under --check, the compare/1
  document on stdout with the refusal, vLLM's words, in `not_measured`, as a crash inside vLLM is.
Run against the stand-in worker (tests/vllm_standin.py), which refuses as vLLM does."""

import json
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

pytest.importorskip("transformers", reason="transformers is not installed: pip install 'smearcli[hf]'")

from smearcli.cli.app import app  # noqa: E402
from smearcli.engines import transformers as hf  # noqa: E402
from conftest import standin_python  # noqa: E402

STANDIN = Path(__file__).resolve().parents[1] / "vllm_standin.py"
cli = CliRunner()


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("llama")
    hf.tiny_model("llama").save_pretrained(d, safe_serialization=True)
    assert json.loads((d / "config.json").read_text())["head_dim"] == 16  # what vLLM's CPU attention refuses
    return d


@pytest.fixture
def fake_python(tmp_path):
    return standin_python(tmp_path, STANDIN)


def without_safetensors(model_dir: Path, tmp_path: Path) -> dict:
    from safetensors.torch import load_file

    dirs = {}
    for kind in ("config only", "loose shard", "pickled"):
        d = tmp_path / kind.replace(" ", "-")
        d.mkdir()
        (d / "config.json").write_text((model_dir / "config.json").read_text())
        if kind == "loose shard":
            (d / "model-00001-of-00001.safetensors").write_bytes((model_dir / "model.safetensors").read_bytes())
        if kind == "pickled":
            torch.save(load_file(model_dir / "model.safetensors"), d / "pytorch_model.bin")
        dirs[kind] = d
    return dirs


def test_a_directory_without_safetensors_says_so_before_vllm_starts(model_dir, tmp_path):
    fix = "; save the model there with save_pretrained, which writes them"
    want = {"config only": "has no safetensors weights (neither model.safetensors nor model.safetensors.index.json)"
                           + fix,
            "loose shard": "has no safetensors weights (model-00001-of-00001.safetensors without the "
                           "model.safetensors.index.json that names the shards)" + fix,
            "pickled": "holds only pickled weights (pytorch_model.bin); smearcli loads safetensors only, since "
                       "unpickling can run code: convert the weights to safetensors (save_pretrained writes them "
                       "by default)"}
    for kind, d in without_safetensors(model_dir, tmp_path).items():
        before = sorted(p.name for p in d.iterdir())
        # vLLM's Python is not even there: the weights are what the user must fix first
        r = cli.invoke(app, ["compare", "--impl", "vllm", "--hf-model", str(d), "--vllm-python",
                             str(tmp_path / "no-such-python"), "--json", "--check"])
        assert r.exit_code == 2, (kind, r.output)
        assert r.stderr.splitlines() == [f"smearcli: error: --hf-model {d} {want[kind]}"], r.stderr
        assert r.stdout == "" and sorted(p.name for p in d.iterdir()) == before


REFUSALS = {
    "refuse": "RuntimeError: Unsupported CPU attention configuration: head_dim=16 isa=2 kv_cache_idx=0 (at "
              "vllm/_custom_ops.py:3865 in cpu_attn_get_scheduler_metadata)",
    "noengine": "ValueError: head size 16 is not supported (at vllm/v1/attention/backends/cpu_attn.py:70 in "
                "validate_head_size)",
    "abort": "the vLLM worker exited with status -6: what():  Unsupported CPU attention configuration: head_dim=16 "
             "isa=2 kv_cache_idx=0",
}


@pytest.mark.parametrize("mode", [
    "refuse",
    pytest.param("noengine", marks=pytest.mark.slow),
    pytest.param("abort", marks=pytest.mark.slow),
])
def test_an_engine_that_refuses_the_model_is_that_models_result(mode, model_dir, fake_python, monkeypatch, tmp_path):
    monkeypatch.setenv("SMEARCLI_STANDIN_MODE", mode)
    monkeypatch.chdir(tmp_path)
    r = cli.invoke(app, ["compare", "--impl", "vllm", "--hf-model", str(model_dir), "--vllm-python", str(fake_python),
                         "--seq-len", "64", "--chunks", "4", "--json", "--check"])
    assert r.exit_code == 1, r.output
    assert "Traceback" not in r.output and "internal error" not in r.output
    doc = json.loads(r.stdout)
    assert doc["schema"] == "smearcli.compare/1" and doc["runs"] == []
    assert [(x["schedule"], x["outcome"], x["message"]) for x in doc["not_measured"]] == [
        (s, "crashed", REFUSALS[mode]) for s in ("prefill", "decode", "chunked", "prefix")]
    assert doc["verdict"].startswith("CRASHED: prefill crashed: " + REFUSALS[mode])
    assert r.stderr.count("\n") == 1 and r.stderr.startswith("smearcli: error: check failed: CRASHED")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["python"]  # no file beside the stand-in's launcher


# -- the census's worker (`serve.Worker`) after its ready line -------------------------------------

READY = '{"ready": true, "protocol": 2, "vllm": "stand-in", "import_s": 0.0}'
WORKERS = {  # a worker that passes its handshake and its ready line, then misbehaves on the first job
    "floods": "import sys\nprint(%r, flush=True)\nsys.stdin.readline()\n"
              "sys.stdout.write('x' * (5 << 20)); sys.stdout.flush()\nimport time; time.sleep(60)\n" % READY,
    "dies": "import sys\nprint(%r, flush=True)\nsys.stdin.readline()\n"
            "sys.stderr.write('Fatal Python error: Segmentation fault (stand-in)\\n'); sys.exit(139)\n" % READY,
}
HELLO = '{"worker": "smearcli-vllm", "protocol": 2, "python": "3.11", "vllm": "stand-in"}'


def worker_script(tmp_path: Path, kind: str) -> Path:
    """A stand-in for worker.py: `hello` answers the handshake, `serve` is WORKERS[kind]."""
    p = tmp_path / f"{kind}.py"
    p.write_text(f"import sys\nif sys.argv[1:] == ['hello']:\n    print({HELLO!r})\n    raise SystemExit\n"
                 + WORKERS[kind])
    return p


def test_a_worker_that_writes_without_a_newline_is_stopped_at_the_line_limit(tmp_path):
    """5 MiB without a newline after the ready line: read up to the 4 MiB cap, not until the time
    runs out (the flood is finite here so that the old code, which read it all, ends too)."""
    import sys
    import time

    from smearcli.engines.vllm import serve

    w = serve.Worker(sys.executable, worker=str(worker_script(tmp_path, "floods")))
    try:
        w.start()
        t0 = time.monotonic()
        with pytest.raises(serve.WorkerGone, match="wrote more than 4 MiB without a newline"):
            w.ask({"op": "archs"}, timeout=5.0)
        assert time.monotonic() - t0 < 5.0
    finally:
        w.close()
    assert not w.alive() and not w.log.exists()


def test_a_worker_that_dies_after_its_ready_line_is_the_environment_not_a_bug(tmp_path):
    import stat

    python = tmp_path / "python"
    python.write_text(f'#!/bin/sh\nshift\nexec "{__import__("sys").executable}" '
                      f'"{worker_script(tmp_path, "dies")}" "$@"\n')
    python.chmod(python.stat().st_mode | stat.S_IXUSR)
    r = cli.invoke(app, ["scan", "--engine", "vllm", "--engine-python", str(python), "--out",
                         str(tmp_path / "v.jsonl"), "--repro-dir", str(tmp_path / "repro"), "-q"])
    assert r.exit_code == 2, r.output  # the environment's failure, as docs/errors.md says, not 1 (a bug)
    assert r.stderr.splitlines() == [
        f"smearcli: error: {python}: vLLM's worker stopped before it listed the architectures it supports (vLLM's "
        "worker died; its last output: Fatal Python error: Segmentation fault (stand-in)): its environment failed, "
        "not a model; make vLLM's environment with scripts/make_env.sh vllm DIR and give DIR/bin/python"], r.stderr
    assert r.stdout == "" and not (tmp_path / "v.jsonl").exists()


def test_compare_reads_a_flooding_worker_capped(tmp_path):
    """`compare --impl vllm`'s worker writing 32 MiB to stdout and to stderr before it dies: only
    the tail of its stderr is read (it was all kept in memory, both streams)."""
    import sys
    import tracemalloc

    from smearcli.engines import vllm

    script = tmp_path / "floods.py"
    script.write_text(f"import sys\nif sys.argv[1:] == ['hello']:\n    print({HELLO!r})\n    raise SystemExit\n"
                      "for f in (sys.stdout, sys.stderr):\n    f.write('x' * (32 << 20))\n"
                      "sys.stderr.write('\\nFatal Python error: Aborted (stand-in)\\n'); sys.exit(1)\n")
    s = vllm.Settings(python=sys.executable, model=str(tmp_path), vocab=8, worker=str(script), timeout_s=60.0)
    tracemalloc.start()
    try:
        res = vllm.call_worker(s, {"schedules": [{"name": "prefill"}]}, tmp_path)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert res["died"] and res["schedules"][0]["message"] == ("the vLLM worker exited with status 1: Fatal Python "
                                                             "error: Aborted (stand-in)")
    assert peak < 8 << 20, f"{peak >> 20} MiB held while the worker ran"
