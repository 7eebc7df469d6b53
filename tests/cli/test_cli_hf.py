"""`compare --impl hf` and `plot --impl hf`: a Hugging Face model from the command line (tiny
configs, 48 tokens), the stand-in with a chunk-boundary bug loaded from a local directory, and the
refusals."""

import json
import subprocess
import sys

import pytest
import torch
from typer.testing import CliRunner

pytest.importorskip("transformers", reason="transformers is not installed: pip install 'smearcli[hf]'")

from smearcli.census import record  # noqa: E402
from smearcli.cli.app import app  # noqa: E402
from smearcli.engines import transformers as hf  # noqa: E402
from smearcli.engines.transformers.cache_runner import CacheRunner  # noqa: E402
from smearcli.util.defaults import DEFAULT_SCHEDULES  # noqa: E402
from smearcli.measure.schedules import runnable  # noqa: E402

# what check_model and compare --impl hf run by default: the default schedules its runner can run
HF_DEFAULT = [s for s in DEFAULT_SCHEDULES if runnable(CacheRunner, s)]

runner = CliRunner()
FAST = ["--seq-len", "48", "--chunks", "3"]


def invoke(*args):
    r = runner.invoke(app, [str(a) for a in args])
    assert "Traceback" not in r.output, r.output
    if r.exit_code == 2:  # a refusal: one line on stderr
        lines = r.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("smearcli: error: "), r.stderr
    return r


def rows(output: str) -> dict:
    """schedule -> the table row's cells."""
    out = {}
    for line in output.splitlines():
        cells = line.split()
        if cells and cells[0] in HF_DEFAULT and cells[-1] in ("ok", "BUG"):
            out[cells[0]] = cells
    return out


@pytest.fixture(scope="module")
def standin_dir(tmp_path_factory):
    """The stand-in, bug in layer 1, saved as a local model directory (safetensors) and
    registered with the Auto classes the way a custom architecture would be."""
    from hf_standin import ShiftConfig, ShiftLM, shift_model
    from transformers import AutoConfig, AutoModelForCausalLM

    AutoConfig.register(ShiftConfig.model_type, ShiftConfig, exist_ok=True)
    AutoModelForCausalLM.register(ShiftConfig, ShiftLM, exist_ok=True)
    path = tmp_path_factory.mktemp("standin") / "shift"
    shift_model(bug_layer=1).save_pretrained(path)
    assert any(path.glob("*.safetensors")) and not any(path.glob("*.bin"))
    return path


def test_llama_compare_is_ok():
    r = invoke("compare", "--impl", "hf", "--hf-model", "llama", *FAST)
    assert r.exit_code == 0, r.output
    table = rows(r.stdout)
    assert set(table) == set(HF_DEFAULT)
    assert all(cells[-1] == "ok" for cells in table.values()), r.stdout
    assert "noise floor (logits)" in r.stdout and "LlamaForCausalLM" in r.stdout
    import transformers
    assert f"transformers {transformers.__version__}" in r.stdout
    assert r.stdout.strip().splitlines()[-1].startswith("OK:")


def test_standin_dir_is_a_bug_born_at_the_chunk_start(standin_dir, tmp_path):
    r = invoke("compare", "--impl", "hf", "--hf-model", standin_dir, *FAST, "--check")
    assert r.exit_code == 1, r.output
    table = rows(r.stdout)
    assert table["chunked"][-1] == "BUG" and table["chunked"][-3] == "layer1@16"
    assert table["prefill"][-1] == table["decode"][-1] == "ok"
    verdict = [line for line in r.stdout.splitlines() if line.startswith("BUG:")]
    assert verdict and "chunked" in verdict[0]
    assert "check failed: BUG:" in r.stderr and "the first chunk start (16)" in r.stderr
    # nothing public covers the stand-in's finding: it is new, so --check fails on it
    assert "upstream: chunks of 16 (bug) is new: no public thread matches" in r.stdout

    save = tmp_path / "standin.pt"
    r = invoke("compare", "--impl", "hf", "--hf-model", standin_dir, *FAST, "--json", "--save", save)
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert doc["schema"] == "smearcli.compare/1" and doc["model"]["model_class"] == "ShiftLM"
    chunked = next(run for run in doc["runs"] if run["schedule"] == "chunked")
    assert chunked["born_at"] == "layer1@16" and not chunked["passed"]
    assert chunked["first_departure"] == {"layer": "layer1", "position": 16}
    assert chunked["chunk_starts"] == [16, 32] and chunked["born_at_chunk_start_share"] > 0.999
    assert doc["layers"] == ["emb", "layer0", "layer1", "logits"]
    assert "born at layer1@16" in doc["verdict"]
    payload = torch.load(save, weights_only=True)
    assert payload["meta"]["runs"] == doc["runs"]
    assert payload["tokens"].shape == (1, 48) and payload["logits_chunked_hf"].shape == (1, 48, 64)
    assert payload["logits_full"].shape == (1, 48, 64)


def test_plot_draws_the_check(standin_dir, tmp_path):
    out = tmp_path / "standin.png"
    r = invoke("plot", "--impl", "hf", "--hf-model", standin_dir, *FAST, "--kind", "error", "-o", out)
    assert r.exit_code == 0, r.output
    assert out.stat().st_size > 1000 and "schedule chunked" in r.stdout
    assert "born at layer1@16" in r.stdout


def test_bin_only_dir_is_refused(tmp_path):
    d = tmp_path / "pickled"
    d.mkdir()
    (d / "config.json").write_text('{"model_type": "llama"}')
    (d / "pytorch_model.bin").write_bytes(b"not loaded")
    r = invoke("compare", "--impl", "hf", "--hf-model", d)
    assert r.exit_code == 2
    assert "--hf-model" in r.stderr and "safetensors" in r.stderr and "pytorch_model.bin" in r.stderr


def test_unknown_name_lists_the_names():
    r = invoke("compare", "--impl", "hf", "--hf-model", "no-such-model")
    assert r.exit_code == 2
    assert all(name in r.stderr for name in hf.TINY_CONFIGS), r.stderr
    help_text = invoke("compare", "--help").stdout
    assert all(name in help_text for name in hf.TINY_CONFIGS)  # the help names the same set


@pytest.mark.parametrize("args, flag", [
    (["--hf-model", "llama"], "--hf-model"),
    (["--impl", "hf"], "--hf-model"),
    (["--impl", "hf", "--hf-model", "llama", "--checkpoint", "."], "--checkpoint"),
    (["--impl", "hf", "--hf-model", "llama", "--model", "tiny"], "--model"),
    (["--impl", "hf", "--hf-model", "llama", "--depth", "2"], "--depth"),
    (["--impl", "hf", "--hf-model", "llama", "--text", "hi"], "--text"),
    (["--impl", "hf", "--hf-model", "llama", "--source", "sft"], "--source"),
    (["--impl", "hf", "--hf-model", "llama", "--preset", "d12"], "--preset"),
    (["--impl", "hf", "--hf-model", "llama", "--chat"], "--chat"),
    (["--impl", "hf", "--hf-model", "llama", "--schedules", "chunked,engine"], "engine"),
    (["--impl", "hf", "--hf-model", "llama", "--seq-len", "8", "--chunk-sizes", "4,5"], "--chunk-sizes"),
])
def test_combinations_are_refused_in_one_line(args, flag):
    r = invoke("compare", *args)
    assert r.exit_code == 2 and flag in r.stderr, r.stderr


def test_nanochat_runs_never_import_transformers():
    code = ("import sys; from smearcli.cli.app import app; from typer.testing import CliRunner; "
            "r = CliRunner().invoke(app, ['compare', '--model', 'random', '--depth', '1', '--seq-len', '8', "
            "'--schedules', 'chunked', '--chunks', '2']); assert r.exit_code == 0, r.output; "
            "assert 'transformers' not in sys.modules; "
            # the transformers engine's registration is imported with every engine's: none of its code
            "assert {m for m in sys.modules if m.startswith('smearcli.engines.transformers')} <= "
            "{'smearcli.engines.transformers', 'smearcli.engines.transformers.registration'}")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert p.returncode == 0, p.stderr


def test_a_finding_upstream_tracks_as_open_is_listed_and_does_not_fail_the_check():
    """The tiny Mamba's chunked prefill is transformers #31909 (open): `compare --impl hf --check`
    lists it under the verdict and exits 0; its JSON places the run as the census would."""
    from schema_check import document_problems

    r = invoke("compare", "--impl", "hf", "--hf-model", "mamba", *FAST, "--schedules", "chunked", "--check", "--json")
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert doc["word"] == "bug" and not document_problems(doc)
    (u,) = doc["upstream"]
    assert (u["path"], u["verdict"], u["class"]) == ("chunks of 16", "bug", "open")
    assert [t["url"] for t in u["threads"]] == ["https://github.com/huggingface/transformers/issues/31909"]
    assert "every finding is known upstream" in r.stderr and "check failed" not in r.stderr


def test_check_all_fails_on_known_findings_and_a_new_one_fails_either_way():
    from smearcli.cli.reports import Report

    known = record.Upstream("chunks of 16", "*", "bug", "open", [], None)
    new = known.but(path="decode", class_name="new")
    rep = Report()
    rep.failed, rep.upstream = True, [known]
    assert not rep.failing() and rep.failing(every=True)
    rep.upstream = [known, new]
    assert rep.failing() and rep.failing(every=True)
    rep.upstream = None  # not placed (an inconclusive run has no finding): fails as it always did
    assert rep.failing()
    rep.failed = False
    assert not rep.failing(every=True)
    r = invoke("compare", "--impl", "hf", "--hf-model", "llama", "--check", "some")
    assert r.exit_code == 2 and "compare takes no argument: got 'some'" in r.stderr


@pytest.mark.parametrize("schedule,steps,name", [
    ("chunked", [16, 16, 16], "chunks of 16"), ("chunked", [16, 16, 1], "chunks of 16"),
    ("chunked", [100, 60, 1, 159], "widths 100,60,1,159"), ("speculative", [40, 4, 4], "widths 40,4,4"),
    ("chunked", [43, 1, 1, 1, 1, 1], "prefill, then single tokens"), ("decode", [1] * 8, "decode"),
    ("padded", [48], "padded")])
def test_a_compare_run_is_named_as_the_census_names_its_steps(schedule, steps, name):
    from smearcli.census.known import load
    from smearcli.engines.transformers.check import path_name, split_points

    assert path_name(schedule, steps) == name
    census = split_points(type("C", (), {})(), 49)  # the census's own names for its step plans
    assert path_name("chunked", census["chunks of 16"]) == "chunks of 16"
    assert path_name("chunked", census["prefill, then single tokens"]) == "prefill, then single tokens"
    import fnmatch
    globs = {g for e in load() for g in e.paths}
    assert any(fnmatch.fnmatchcase(name, g) for g in globs)  # a name the table's paths can cover
