"""What a person sees in the console: tables that fit 80 columns without losing a verdict or a
ratio, whole prose lines when piped, --help at 80 columns, shell completion, the input length
from --chunk-sizes, a short --text, the thread rule, and a missing torch."""

import io
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from rich.console import Console
from typer.testing import CliRunner

from smearcli.cli.app import app
from smearcli.measure.compare import starts_phrase

runner = CliRunner()
SMALL = ["--model", "random", "--depth", "1", "--seq-len", "32", "--gen-len", "8", "--threads", "1"]
ANSI = re.compile(r"\x1b\[[0-9;]*m")


def run(*args, columns=None):
    threads = torch.get_num_threads()
    try:
        r = runner.invoke(app, list(args), env={"COLUMNS": str(columns)} if columns else {})
    finally:
        torch.set_num_threads(threads)  # --threads is process-wide
    assert r.exit_code == 0, r.output
    return r.stdout


@pytest.fixture(scope="module")
def compare_runs():
    """The same compare piped at 80 and 120 columns, and its JSON."""
    doc = json.loads(run("compare", *SMALL, "--json"))
    return doc, run("compare", *SMALL, columns=80), run("compare", *SMALL, columns=120)


def _row_cells(out: str, schedule: str, logic: str) -> list[str]:
    rows = [line.split() for line in out.splitlines() if line.split()[:2] == [schedule, logic]]
    assert len(rows) == 1, (schedule, logic, out)
    return rows[0]


@pytest.mark.parametrize("columns", [80, 120])
def test_compare_table_keeps_every_verdict_and_ratio(compare_runs, columns):
    doc, out80, out120 = compare_runs
    out = out80 if columns == 80 else out120
    assert len(doc["runs"]) == 10
    for line in out.splitlines():  # table lines start with a space; prose is one whole line
        assert len(line) <= columns or not line.startswith(" "), line
        assert line == line.rstrip(), repr(line)
    for run_ in doc["runs"]:
        cells = _row_cells(out, run_["schedule"], run_["logic"])
        assert cells[-1] == ("ok" if run_["passed"] else "BUG")
        assert f"{run_['logits_noise_multiple']:.2g}" in cells  # the ×noise ratio, whole
        assert "…" not in " ".join(cells)
    header = next(line for line in out.splitlines() if "max|Δlogit|" in line)
    assert "×noise" in header and "born at" in header
    if columns == 120:  # a wide console keeps the full table
        assert "steps" in header and "KL max" in header and "left out" not in out
    else:
        assert "steps" not in header and "left out to fit 80 columns: steps, KL max" in out


@pytest.mark.parametrize("columns", [80, 200])
def test_the_packed_table_fits_and_says_what_it_left_out(columns):
    """The packed table fits the console: at 80 columns the analytic check's columns go first and
    the table says so, each document row keeps its leak and both parts, and the analytic check
    stays as one line; wide, every column is there and nothing is said to be left out."""
    out = run("compare", *SMALL, "--schedules", "packed", "--documents", "12,10,10", columns=columns)
    table = [ln for ln in out.splitlines() if ln.split()[:1] in (["old"], ["fixed"], ["bosmask"]) and
             ln.split()[1:2] != [] and ln.split()[1].isdigit()]
    assert len(table) == 9, out
    assert all(len(ln.rstrip()) <= columns for ln in table), out
    header = next(ln for ln in out.splitlines() if ln.split()[:2] == ["logic", "doc"])
    assert "smear part" in header and "attention part" in header and "first 8" in header
    assert sum(ln.startswith("analytic check (") for ln in out.splitlines()) == 3
    if columns == 80:
        assert "residual" not in header and "left out to fit 80 columns: residual, gate*x_prev" in out
    else:
        assert "residual" in header and "left out to fit" not in out


def test_piped_prose_is_never_hard_wrapped(compare_runs):
    doc, out80, _ = compare_runs
    lines = out80.splitlines()
    assert doc["verdict"] in lines  # the verdict, whole, on one line
    noise = [line for line in lines if line.startswith("noise floor (logits):")]
    assert len(noise) == 1 and noise[0].endswith("above 10x noise.") and len(noise[0]) > 80
    for schedule, checks in doc["analytic_check"].items():
        assert any(line.startswith(f"analytic check ({schedule},") and line.endswith(")") for line in lines)


def test_a_terminal_at_80_columns_keeps_the_verdict():
    """A real tty (rich with a terminal of 80 columns), through the library's printer."""
    from smearcli.measure import compare
    from smearcli.gpt import weights
    from smearcli.render.table import print_comparison
    from smearcli.measure.schedules import ScheduleOptions

    lm = weights.random_model(weights.random_config(1), seed=0)
    tokens = torch.randint(0, lm.model.config.vocab_size, (1, 32), generator=torch.Generator().manual_seed(0))
    c = compare.compare(lm.model, tokens, ["chunked", "speculative"], ["old", "fixed"],
                        ScheduleOptions(chunks=4, gen_len=8))
    buf = io.StringIO()
    term = Console(file=buf, width=80, force_terminal=True, color_system="standard")
    print_comparison(c, term, "title")
    text = ANSI.sub("", buf.getvalue())
    assert all(len(line) <= 80 for line in text.splitlines())
    for m in c.metrics:
        row = [line.split() for line in text.splitlines() if line.split()[:2] == [m.schedule, m.logic]]
        assert row and row[0][-1] == ("ok" if m.passed else "BUG")


def test_bench_ratios_are_never_cut(tmp_path):
    args = ["bench", *SMALL, "--repeats", "2", "--warmup", "0", "--no-peak"]
    doc = json.loads(run(*args, "--json"))
    out = run(*args, columns=80)
    assert "…" not in out
    for line in out.splitlines():  # table lines start with a space; prose is one whole line
        assert (len(line) <= 80 or not line.startswith(" ")) and line == line.rstrip(), repr(line)
    for r in doc["ratios"]:  # a different run: check the shape of each ratio, whole
        row = next(line for line in out.splitlines() if line.split()[:1] == [r["schedule"]]
                   and re.search(r"\d+\.\d{3}\s+(\d+\.\d{3}-\d+\.\d{3}|-)(\s|$)", line))  # "-": IQR under 5 pairs
        assert row
    assert "threads: 1 (--threads" in out


def test_help_reads_cleanly_at_80_columns():
    for cmd in ([], ["compare"], ["plot"], ["bench"]):
        r = runner.invoke(app, [*cmd, "--help"], env={"COLUMNS": "80"}, prog_name="smearcli")
        assert r.exit_code == 0, r.output
        assert "<bool>" not in r.output
        assert all(len(line) <= 80 for line in r.output.splitlines())
        if cmd:
            assert "<dtype>" in r.output and "<auto|float32" not in r.output  # no split choices
            assert "--threads" in r.output


def test_shell_completion_prints_a_script():
    # typer detects the shell from the process tree (shellingham), which a CI runner or a process
    # without a shell parent does not have; its test switch makes --show-completion take the name
    env = {**os.environ, "SHELL": "/bin/bash", "_TYPER_COMPLETE_TEST_DISABLE_SHELL_DETECTION": "1"}
    r = subprocess.run([sys.executable, "-m", "smearcli", "--show-completion", "bash"], env=env,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert "_smearcli_completion" in r.stdout and "complete " in r.stdout
    r = runner.invoke(app, ["--help"], prog_name="smearcli")
    assert "--install-completion" in r.output


def test_chunk_sizes_alone_set_the_input_length():
    sizes = [10, 6, 1, 15]
    doc = json.loads(run("compare", "--model", "random", "--depth", "1", "--chunk-sizes",
                         ",".join(map(str, sizes)), "--schedules", "chunked", "--json"))
    assert doc["input"]["seq_len"] == sum(sizes)


def test_short_text_gets_as_many_chunks_as_it_holds():
    doc = json.loads(run("compare", "--text", "hi", "--schedules", "chunked", "--json"))
    assert doc["input"]["seq_len"] == 2 and doc["options"]["chunks"] == 2
    r = runner.invoke(app, ["compare", "--text", "hi", "--chunks", "3"])
    assert r.exit_code == 2 and "give --chunks 2 or fewer" in r.stderr


def test_verdict_names_the_schedule_whose_starts_it_lists():
    doc = json.loads(run("compare", *SMALL, "--json"))
    bad = [r for r in doc["runs"] if not r["passed"]]
    worst = max(bad, key=lambda r: r["max_abs_logits"])
    n = len(worst["chunk_starts"])
    assert f"at the {n} chunk starts of {worst['schedule']}: " in doc["verdict"]
    shown = worst["chunk_starts"][:4]
    assert ", ".join(map(str, shown)) in doc["verdict"]
    if n > 4:
        assert f"and {n - 4} more" in doc["verdict"]
    assert starts_phrase(list(range(0, 40, 4)), "x") == "the 10 chunk starts of x: 0, 4, 8, 12 and 6 more"
    assert starts_phrase([7], "x") == "the chunk start of x: 7"


def test_thread_rule_is_stated_in_the_footer():
    from smearcli.util.threads import busy_cpu_threads, use_threads

    out = run("compare", *SMALL[:-2], "--schedules", "chunked", columns=120)
    assert re.search(r"^threads: \d+ \(", out, re.M)
    assert busy_cpu_threads(loadavg=2.0, cpu_count=2) == 1 and busy_cpu_threads(loadavg=1.9, cpu_count=2) is None
    threads = torch.get_num_threads()
    try:
        assert use_threads(loadavg=9.0, cpu_count=4) == "threads: 1 (load 9.0 on 4 cores)"
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(threads)


def test_missing_torch_is_an_install_message():
    code = ("import sys; sys.modules['torch'] = None\n"
            "from smearcli.cli.app import run; sys.argv = ['smearcli', 'compare']; run()")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2
    assert r.stderr.startswith("smearcli: error: torch is not installed") and "bug" not in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1


def test_the_suite_needs_nothing_outside_the_clone():
    """A user's clone has no ../shared beside it: the fixtures the tests load live in the
    repository, and no test, conftest or docs script names a path outside it."""
    from conftest import FIXTURE, ROOT

    assert FIXTURE.resolve().is_relative_to(ROOT), FIXTURE
    outside = re.compile(r"\.\./shared|/shared/fixtures|ROOT\.parent\b|parents\[2\]")
    found = [f"{p.relative_to(ROOT)}: {m.group(0)}" for folder in ("tests", "docs", "examples", ".ci")
             for p in (ROOT / folder).rglob("*") if p.is_file() and p.suffix in (".py", ".sh", "")
             and p != Path(__file__) for m in [outside.search(p.read_text(errors="replace"))] if m]
    assert not found, found
