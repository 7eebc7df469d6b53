"""`smearcli scan` from the command line: merging shard files, the table's width, --json's
schema, --check, and one-line refusals (the scanning itself: tests/test_scan*.py)."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

pytest.importorskip("transformers", reason="transformers is not installed: pip install 'smearcli[hf]'")

from smearcli.census import record  # noqa: E402
from smearcli.cli.app import app  # noqa: E402

RECS = [{"model_type": "a", "verdict": "bug", "worst_schedule": "chunks of 16", "max_abs": 0.5,
         "shape": "state dropped at chunk starts", "reproducer": "r/a.py", "reproducer_status": 1},
        {"model_type": "b", "verdict": "ok"}, {"model_type": "c", "verdict": "crashed", "reason": "x.py:1 in f: E"}]


def invoke(*args):
    r = CliRunner().invoke(app, ["scan", *map(str, args)])
    assert "Traceback" not in r.output, r.output
    return r


def shards(tmp_path):
    one, two = tmp_path / "1.jsonl", tmp_path / "2.jsonl"
    one.write_text("\n".join(json.dumps(r) for r in RECS[:2]) + "\n")
    two.write_text(json.dumps(RECS[2]) + "\n")
    return one, two


def test_merge_prints_one_table_and_check_fails_on_a_bug(tmp_path):
    one, two = shards(tmp_path)
    r = invoke("--merge", one, "--merge", two)
    assert r.exit_code == 0, r.output
    assert all(len(line) <= 80 for line in r.stdout.splitlines())
    assert "3 architectures: 1 bug, 1 crashed, 1 ok" in r.stdout
    r = invoke("--merge", one, "--merge", two, "--check")
    assert r.exit_code == 1 and "check failed" in r.stderr and ": a" in r.stderr


def test_json_and_markdown(tmp_path):
    one, two = shards(tmp_path)
    md = tmp_path / "census.md"
    r = invoke("--merge", one, "--merge", two, "--json", "--markdown", md)
    doc = json.loads(r.stdout)
    assert doc["schema"] == "smearcli.scan/1" and [a["model_type"] for a in doc["architectures"]] == ["a", "b", "c"]
    assert doc["transformers_version"] and "## Findings" in md.read_text()


@pytest.mark.parametrize("args, words", [
    (["--shard", "3/2"], "--shard 3/2"), (["--shard", "x"], "--shard takes i/n"),
    (["--jobs", "0"], "--jobs must be at least 1"), (["--only", "no_such_model"], "--only: no_such_model"),
    (["--merge", "missing.jsonl"], "missing.jsonl: no such scan file")])
def test_refusals_are_one_line(args, words, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    r = invoke(*args)
    assert r.exit_code == 2, r.output
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and words in lines[0], r.stderr


@pytest.mark.slow
def test_one_architecture_then_resume_skips_it(tmp_path):
    out = tmp_path / "scan.jsonl"
    r = invoke("--only", "llama", "--out", out, "--repro-dir", tmp_path / "repro", "--json")
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    (rec,) = doc["architectures"]
    assert rec["model_type"] == "llama" and rec["verdict"] == "ok" and rec["power"]["effects"]["kv"] > 0 and rec["power"]["sufficient"]
    assert "float64" in rec["floor_source"]
    before = out.read_text()
    r = invoke("--only", "llama", "--out", out, "--resume", "-q")
    assert r.exit_code == 0 and out.read_text() == before and "1 architectures: 1 ok" in r.stdout


def test_figure_of_architectures_by_schedules(tmp_path):
    from smearcli.render import scan_figure

    recs = [{"model_type": "a", "verdict": "bug", "schedules": {"decode": {"multiple": 1.0}, "chunks": {"multiple": 1e4}}},
            {"model_type": "b", "verdict": "ok", "schedules": {"decode": {"multiple": 0.5}}},
            {"model_type": "c", "verdict": "not built"}]
    rows, cols, cells = scan_figure.grid([record.bare(**r) for r in recs])
    assert rows == ["a (bug)", "b (ok)"] and cols == ["decode", "chunks"]
    assert cells[0][1] == pytest.approx(4.0) and cells[1][1] != cells[1][1]  # nan: not run
    p = tmp_path / "s.jsonl"
    p.write_text("\n".join(json.dumps(r) for r in recs) + "\n")
    r = invoke("--merge", p, "--figure", tmp_path / "scan.png")
    assert r.exit_code == 0, r.output
    assert (tmp_path / "scan.png").read_bytes()[:4] == b"\x89PNG"
