"""The CLI through Typer's CliRunner: help, table, JSON schema, --save, --check exit codes."""

import json
import subprocess
import sys

import pytest
import torch
from typer.testing import CliRunner

from smearcli.cli.app import app
from smearcli.util.defaults import DEFAULT_SCHEDULES, LOGIC_NAMES

runner = CliRunner()
SMALL = ["--model", "random", "--depth", "2", "--seq-len", "48", "--gen-len", "8"]


def invoke(*args):
    return runner.invoke(app, list(args))


def test_top_level_help_lists_commands():
    r = invoke("--help")
    assert r.exit_code == 0
    assert "compare" in r.output


@pytest.mark.parametrize("command", ["compare"])
def test_command_help(command):
    r = invoke(command, "--help")
    assert r.exit_code == 0
    for opt in ("--chunks", "--chunk-sizes", "--checkpoint", "--logic", "--schedules", "--seq-len"):
        assert opt in r.output


@pytest.mark.parametrize("columns", ["0", "1", "12"])
def test_help_on_a_tiny_or_zero_width_terminal(columns):
    r = runner.invoke(app, ["compare", "--help"], env={"COLUMNS": columns})
    assert r.exit_code == 0
    for opt in ("--chunks", "--seq-len", "--check"):  # rich breaks names at narrow widths: they stay whole
        assert opt in r.output, r.output[:500]


@pytest.mark.parametrize("command", [[], ["compare"], ["plot"], ["bench"], ["scan"], ["fix"]],
                         ids=lambda c: " ".join(c) or "smearcli")
def test_help_on_a_huge_terminal_is_laid_out_at_most_120_wide(command):
    """COLUMNS=100000 made `scan --help` 2.6 MB of padding: rich pads every line to the width."""
    r = runner.invoke(app, [*command, "--help"], env={"COLUMNS": "100000"}, prog_name="smearcli")
    assert r.exit_code == 0 and "--help" in r.output
    assert max(map(len, r.output.splitlines())) <= 120 and len(r.output) < 40_000, len(r.output)


def test_help_does_not_import_torch():
    code = ("import sys; from smearcli.cli.app import app; from typer.testing import CliRunner; "
            "r = CliRunner().invoke(app, ['compare', '--help']); assert r.exit_code == 0; "
            "heavy = [m for m in ('torch', 'matplotlib') if m in sys.modules]; "
            "assert not heavy, heavy")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_a_misused_release_option_is_refused_without_importing_torch():
    """`scan --release`/`--bisect` are driven from a Python that never builds a model: the
    transformers engine's torch-free modules import without the runner (`engines.transformers`
    lends the runner's names on first use), so a misuse is refused at once."""
    code = ("import sys; from smearcli.cli.app import app; from typer.testing import CliRunner; "
            "r = CliRunner().invoke(app, ['scan', '--release', 'five']); assert r.exit_code == 2, r.output; "
            "heavy = [m for m in ('torch', 'transformers', 'smearcli.engines.transformers.implementation') "
            "if m in sys.modules]; assert not heavy, heavy; "
            "assert 'smearcli.engines.transformers.releases' in sys.modules")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert p.returncode == 0, p.stderr


def test_table_shows_bug_and_verdict():
    r = invoke("compare", *SMALL, "--chunks", "3")
    assert r.exit_code == 0, r.output
    lines = r.output.splitlines()
    chunked_old = next(l for l in lines if l.split()[:2] == ["chunked", "old"])
    chunked_fixed = next(l for l in lines if l.split()[:2] == ["chunked", "fixed"])
    assert "BUG" in chunked_old and "ok" in chunked_fixed
    assert "analytic check (chunked" in r.output
    assert r.output.strip().splitlines()[-1].startswith("BUG") or "BUG:" in r.output


def test_json_schema():
    r = invoke("compare", *SMALL, "--chunk-sizes", "20,1,27", "--json")
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert doc["schema"] == "smearcli.compare/1"
    assert set(doc) >= {"model", "input", "options", "layers", "tolerance", "noise_floor", "runs",
                        "analytic_check", "verdict"}
    assert doc["layers"] == ["emb", "block0", "block1", "logits"]
    pairs = [(r["schedule"], r["logic"]) for r in doc["runs"]]
    assert pairs == [(s, l) for s in DEFAULT_SCHEDULES for l in LOGIC_NAMES]
    runs = {(r["schedule"], r["logic"]): r for r in doc["runs"]}
    old, fixed = runs["chunked", "old"], runs["chunked", "fixed"]
    assert old["steps"] == [20, 1, 27] and old["chunk_starts"] == [21]  # the 1-token chunk is fine
    assert old["first_departure"] == {"layer": "emb", "position": 21}
    assert not old["passed"] and fixed["passed"]
    assert len(old["per_position"]["abs_logits"]) == 48
    assert len(old["rel_error"]) == 4 and len(old["rel_error"][0]) == 48
    assert max(old["per_position"]["abs_logits"][:21]) <= doc["tolerance"] * doc["noise_floor"]["per_layer"][-1]
    check = doc["analytic_check"]["chunked"][0]
    assert check["position"] == 21 and check["residual"] < 1e-5
    assert check["measured"] == pytest.approx(check["predicted"], rel=1e-5)


def test_json_is_deterministic():
    a = invoke("compare", *SMALL, "--schedules", "chunked", "--json").stdout
    b = invoke("compare", *SMALL, "--schedules", "chunked", "--json").stdout
    assert a == b


def test_check_exit_codes():
    ok = invoke("compare", *SMALL, "--schedules", "chunked", "--logic", "fixed", "--check")
    assert ok.exit_code == 0, ok.output
    bad = invoke("compare", *SMALL, "--schedules", "chunked", "--logic", "old", "--check")
    assert bad.exit_code == 1
    assert "check failed" in bad.stderr


def test_save_writes_logits(tmp_path):
    out = tmp_path / "runs.pt"
    r = invoke("compare", *SMALL, "--schedules", "chunked,decode,engine", "--save", str(out))
    assert r.exit_code == 0, r.output
    data = torch.load(out, weights_only=True)
    assert data["logits_full"].shape == (1, 48, 256)
    assert set(data) >= {"meta", "tokens", "logits_chunked_old", "logits_chunked_fixed", "logits_decode_old"}
    # the engine's sample rows are saved as the rows they are (one row expanded where they decode
    # alike): the prompt's logits are one prefill, equal bit for bit; the decoded tail is a batch of
    # two whose matrix kernels may round each row differently on another CPU, so only close there
    engine = data["logits_engine_fixed"]
    prompt = 48 - 8
    assert engine.shape == (2, 48, 256) and engine.is_contiguous()
    assert torch.equal(engine[0, :prompt], engine[1, :prompt])
    torch.testing.assert_close(engine[0], engine[1], rtol=0, atol=1e-5)
    assert data["meta"]["schema"] == "smearcli.compare/1"
    assert not list(tmp_path.glob(".*tmp"))


def test_tokens_file(tmp_path):
    f = tmp_path / "ids.json"
    f.write_text(json.dumps([[1, 2, 3, 4, 5, 6, 7, 8, 9, 10]] * 2))
    r = invoke("compare", "--model", "random", "--depth", "2", "--tokens", str(f), "--schedules",
               "chunked", "--chunks", "2", "--json")
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["input"] == {"batch": 2, "seq_len": 10}


@pytest.mark.parametrize("args, fragment", [
    (["--chunk-sizes", "10,10"], "sum to 20 but the sequence has 48"),
    (["--chunks", "0"], "--chunks"),
    (["--chunks", "49"], "every chunk needs at least one token"),
    (["--schedules", "nope"], "unknown schedule"),
    (["--schedules", "full"], "reference"),
])
def test_bad_input_is_one_line_exit_2(args, fragment):
    r = invoke("compare", *SMALL, *args)
    assert r.exit_code == 2, r.output
    assert fragment in r.stderr
    assert "Traceback" not in r.output
    assert len(r.stderr.strip().splitlines()) == 1


def test_only_the_program_freezes_the_garbage_collector_and_keeps_freed_memory(monkeypatch):
    """The smearcli process moves what it imported and built out of the collector's way (a full
    collection after importing torch scans ~170k objects); a caller's process (this test's
    CliRunner, a notebook) keeps its collector as it was, and its allocator
    (`allocator.keep_freed`, which tests/core/test_allocator.py shows at work, is not asked for)."""
    import gc

    from smearcli.cli import build

    asked: list = []
    monkeypatch.setattr(build, "keep_freed", lambda: asked.append(1) or True)
    before = gc.get_freeze_count()
    r = CliRunner().invoke(app, ["compare", "--schedules", "chunked", "--seq-len", "16", "--quiet"])
    assert r.exit_code == 0, r.output
    assert gc.get_freeze_count() == before
    assert asked == []
    code = ("import atexit, gc, sys\n"
            "atexit.register(lambda: sys.stderr.write(f'FROZEN {gc.get_freeze_count()}\\n'))\n"
            "from smearcli.cli.app import run\n"
            "sys.argv = ['smearcli', 'compare', '--schedules', 'chunked', '--seq-len', '16', '--quiet']\n"
            "run()\n")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    frozen = int(p.stderr.split("FROZEN ")[1].split()[0])
    assert frozen > 100_000  # torch's modules, the model, the inputs


def test_bench_keeps_glibcs_defaults_so_its_peak_memory_is_the_schedules(monkeypatch):
    """In the smearcli program, compare asks to keep freed memory and bench does not: bench's peak-memory
    column is the process's growth during a run, which kept blocks would turn into a reading of
    the heap's fragmentation."""
    import gc

    from smearcli.cli import build
    from smearcli.cli.errors import PROGRAM

    asked: list = []
    monkeypatch.setattr(build, "keep_freed", lambda: asked.append(1) or True)
    monkeypatch.setitem(PROGRAM, "own_process", True)
    monkeypatch.setattr(gc, "freeze", lambda: None)  # the program's; this test's process keeps its own
    r = CliRunner().invoke(app, ["bench", "--depth", "1", "--seq-len", "12", "--warmup", "0", "--repeats", "1",
                                 "--no-micro"])
    assert r.exit_code == 0, r.output
    assert asked == []
    r = CliRunner().invoke(app, ["compare", "--schedules", "chunked", "--seq-len", "16", "--quiet"])
    assert r.exit_code == 0, r.output
    assert asked == [1]


def test_each_option_is_parsed_and_checked_once_and_the_json_built_only_when_asked(monkeypatch):
    """--schedules is parsed once (for the implementation, then handed on), the plan and boundary
    checks and the implementation's option checks run once, and without --json no document is built."""
    from smearcli.cli import build, options, reports

    calls: dict = {}

    def counting(owner, name):
        real = getattr(owner, name)

        def wrapper(*a, **k):
            calls[name] = calls.get(name, 0) + 1
            return real(*a, **k)
        monkeypatch.setattr(owner, name, wrapper)
    for owner, name in ((options.RunSpec, "schedule_list"), (options.RunSpec, "check_impl"),
                        (build, "_check_plan"), (build, "check_boundaries"), (reports.ComparisonReport, "document")):
        counting(owner, name)
    r = invoke("compare", *SMALL, "--schedules", "chunked,rollback", "--seed", "1")
    assert r.exit_code == 0, r.output
    assert calls == {"schedule_list": 1, "check_impl": 1, "_check_plan": 1, "check_boundaries": 1}, calls
    calls.clear()
    r = invoke("compare", *SMALL, "--schedules", "chunked", "--json")
    doc = json.loads(r.stdout)
    assert r.exit_code == 0 and doc["verdict"].startswith(doc["word"].upper() + ": "), r.output
    assert calls["document"] == 1 and calls["schedule_list"] == 1, calls
