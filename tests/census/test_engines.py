"""An engine is one module and one registration (`smearcli.census.engines`): a toy engine defined
in tests/engines/toy/ gets the whole census through the CLI (the table, --json, --markdown,
--figure, the record file, --check, a reproducer per finding) and --merge of its shards."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from smearcli.census import engines, records
from smearcli.cli.app import app

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from engines import toy as toy_engine  # noqa: E402
from schema_check import document_problems, record_problems  # noqa: E402

runner = CliRunner()


@pytest.fixture
def toy(monkeypatch, tmp_path):
    monkeypatch.setattr(engines, "ENGINES", dict(engines.ENGINES))  # the registration is undone after the test
    toy_engine.register()
    monkeypatch.chdir(tmp_path)
    return tmp_path


def scan(*args):
    r = runner.invoke(app, ["scan", "--engine", "toy", *args])
    assert "Traceback" not in r.output, r.output
    return r


def test_the_registry_lists_the_built_in_engines_and_a_registered_one(toy):
    assert {"transformers", "vllm", "toy"} <= set(engines.names())
    r = runner.invoke(app, ["scan", "--engine", "nope"])
    assert r.exit_code == 2 and "--engine takes transformers or vllm or llamacpp or toy, got 'nope'" in r.stderr
    # what the toy computes, independently of the census: toy_drop restarts its sum at chunk starts
    assert toy_engine.outputs("toy_drop", 4)[4] == toy_engine.TOKENS[4] != toy_engine.outputs("toy_ok", 4)[4]


def test_a_toy_engine_gets_the_whole_census(toy):
    r = scan("--out", "toy.jsonl", "--markdown", "toy.md", "--figure", "toy.png", "--repro-dir", "repro", "-q")
    assert r.exit_code == 0, r.output
    table = r.stdout.splitlines()
    assert table[0].startswith("architecture") and table[-1] == "3 architectures: 1 bug, 1 crashed, 1 ok"
    assert any(line.startswith("toy_drop") and " bug " in line for line in table)
    # the record file: one record per architecture, each a valid scan record of the toy engine
    recs = {x.model_type: x for x in records.read(toy / "toy.jsonl").records}
    assert sorted(recs) == list(toy_engine.TYPES) and all(x.engine == "toy" for x in recs.values())
    assert all(record_problems(x.to_json()) == [] for x in recs.values())
    drop = recs["toy_drop"]
    # each chunk loses the sum before it, the last chunk the most: chunks of 4 the first 8 tokens'
    # (3+1+4+1+5+9+2+6 = 31), chunks of 5 the first 10 (+5+3 = 39), decode the first 11 (+5 = 44)
    got = {k: v.max_abs for k, v in drop.schedules.items()}
    assert got == {"chunks of 4": 31, "chunks of 5": 39, "decode": 44}
    assert drop.worst_schedule == "decode" and drop.max_abs == 44 and drop.multiple == 44 / toy_engine.FLOOR
    assert recs["toy_crash"].reason.startswith("chunks of 4: toy cache")
    # the fields a verdict's record keeps are the census's rule (`census.measured`), not the engine's own
    assert all(x.power.effects == {"sum": 31.0} for x in recs.values())  # the sum dropped as chunks of 4 drop it
    assert drop.confirmation.float64_lifted == 44 and recs["toy_crash"].schedules["chunks of 4"].status == "crashed"
    # the reproducer was written and run once: it exits 1 while the bug is there
    rep = Path(drop.reproducer)
    assert rep == (toy / "repro" / "toy_drop-toy.py").resolve() and drop.reproducer_status == 1
    assert "max abs error 44" in subprocess.run([sys.executable, str(rep)], capture_output=True, text=True).stdout
    # the page: the toy's title, the counts, its own section
    md = (toy / "toy.md").read_text()
    assert md.startswith("# smearcli scan on the toy\n\n3 architectures: 1 bug, 1 crashed, 1 ok.")
    assert "## Toy architectures" in md and "- toy_drop: bug" in md
    assert (toy / "toy.png").read_bytes()[:4] == b"\x89PNG"
    # --json: the scan/1 document with the toy's meta
    r = scan("--out", "toy.jsonl", "--resume", "--json", "-q")
    doc = json.loads(r.stdout)
    assert r.exit_code == 0 and document_problems(doc) == [] and doc["engine"] == "toy"
    assert doc["counts"]["bug"] == 1 and [a["model_type"] for a in doc["architectures"]] == list(toy_engine.TYPES)
    # --check exits 1 on its bug
    r = scan("--out", "toy.jsonl", "--resume", "--check", "-q")
    assert r.exit_code == 1 and "toy_drop" in r.stderr and "toy_crash" not in r.stderr


def test_an_engine_cannot_record_a_bug_without_a_float64_confirmation(toy, monkeypatch):
    """The census loop holds every engine's record to the judge (`judge.recorded`): the toy's bug
    without its float64 rerun is unconfirmed, said in its notes, and --check follows the word."""
    made = toy_engine.Toy.check

    def unconfirmed(self, *args):
        rec = made(self, *args)
        rec.confirmation = None
        return rec

    monkeypatch.setattr(toy_engine.Toy, "check", unconfirmed)
    r = scan("--out", "toy.jsonl", "--repro-dir", "repro", "-q")
    assert r.exit_code == 0 and r.stdout.splitlines()[-1] == "3 architectures: 1 crashed, 1 unconfirmed, 1 ok"
    drop = {x.model_type: x for x in records.read(toy / "toy.jsonl").records}["toy_drop"]
    assert drop.verdict == "unconfirmed" and any("without a float64 confirmation" in n for n in drop.notes)


def test_an_engine_whose_check_has_no_power_is_inconclusive_not_ok(toy, monkeypatch):
    """The toy hands its runs and its power to the judge: with a floor so coarse that zeroing its
    carried sum would not show (power under 1%), its agreeing runs are `inconclusive`, never `ok`;
    its departure is still a bug (a failed run needs no power)."""
    monkeypatch.setattr(toy_engine, "FLOOR", 1e3)
    r = scan("--out", "toy.jsonl", "--repro-dir", "repro", "-q")
    recs = {x.model_type: x for x in records.read(toy / "toy.jsonl").records}
    assert recs["toy_ok"].verdict == "inconclusive" and "(OK needs 1%)" in recs["toy_ok"].reason
    assert all(s.status == "ok" for s in recs["toy_ok"].schedules.values())
    assert recs["toy_drop"].verdict == "bug" and r.stdout.splitlines()[-1].startswith("3 architectures: 1 bug")


def test_only_shard_and_merge_go_through_the_one_path(toy):
    r = scan("--only", "toy_ok,nope", "--out", "a.jsonl")
    assert r.exit_code == 2 and "--only: nope is not a toy model type (3 are)" in r.stderr
    for i in (1, 2):
        r = scan("--shard", f"{i}/2", "--out", f"s{i}.jsonl", "--repro-dir", "repro", "-q")
        assert r.exit_code == 0, r.output
    merged = runner.invoke(app, ["scan", "--merge", "s1.jsonl", "--merge", "s2.jsonl", "--markdown", "m.md", "--json"])
    assert merged.exit_code == 0, merged.output
    doc = json.loads(merged.stdout)
    assert [a["model_type"] for a in doc["architectures"]] == list(toy_engine.TYPES)
    assert (toy / "m.md").read_text().startswith("# smearcli scan on the toy")  # the records' engine's page
    r = scan("--engine-python", sys.executable, "--out", "x.jsonl")
    assert r.exit_code == 2 and "runs in smearcli's own Python" in r.stderr
    # --claims: a scan takes what no other took; the next one with the same folder finds none left
    r = scan("--claims", "c", "--only", "toy_ok", "--out", "c1.jsonl", "--repro-dir", "repro", "-q", "--json")
    assert r.exit_code == 0 and [a["model_type"] for a in json.loads(r.stdout)["architectures"]] == ["toy_ok"]
    r = scan("--claims", "c", "--out", "c2.jsonl", "--repro-dir", "repro", "-q", "--json")
    assert r.exit_code == 0 and "toy_ok" not in [a["model_type"] for a in json.loads(r.stdout)["architectures"]]
    for bad, why in [(["--claims", "c", "--shard", "1/2"], "--shard and --claims both split the census"),
                     (["--claims", "c1.jsonl"], "not a directory"), (["--merge", "s1.jsonl", "--claims", "c"], "--claims")]:
        r = scan(*bad, "--out", "c3.jsonl")
        assert r.exit_code == 2 and why in r.stderr, r.output


def test_every_engine_stamps_a_record_with_the_release_it_reads_back():
    """`stamped` (where a record keeps its engine's release) is the inverse of `release_of`, for
    every registered engine: known.toml's stand-in records and compare's placed findings are made
    with it, so each engine's field is named in one place."""
    from smearcli.census import engines, record

    for name in engines.names():
        rec = record.bare("llama", "ok", **engines.stamped(name, "9.8.7"))
        assert engines.release_of(rec) == "9.8.7" and engines.of_records([rec]).name == name, name


def test_what_the_table_says_under_a_row_and_after_the_rows_is_the_engines(monkeypatch):
    """The console table (`census.report.table`) reads no engine's data: the lines under a row
    (`Engine.under`; transformers: where the finding was born) and after the rows (`Engine.footer`;
    transformers: each boundary's counts, then their API's code) come from the records' engine."""
    from smearcli.census import record, report

    monkeypatch.setattr(engines, "ENGINES", dict(engines.ENGINES))
    engines.register(engines.Engine("said", "an engine that says things", open=lambda python, quiet: None,
                                    under=lambda r: [f"under {r.model_type}"], footer=lambda rs: [f"{len(rs)} said"]))
    rows = report.table([record.bare(m, "ok", engine="said") for m in ("a", "b")]).splitlines()
    at = rows.index(next(x for x in rows if x.startswith("a ")))
    assert rows[at + 1] == " " * 17 + "under a" and rows[-2:] == ["2 said", "2 architectures: 2 ok"]
    import smearcli.engines  # noqa: F401  (transformers: its boundaries' counts are its own lines now)
    rec = record.bare("mamba", "bug", boundaries={"rollback": {"status": "bug", "multiple": 30.0, "mode": "copy"}},
                      born_in={"module": "backbone.layers.0.mixer", "class": "MambaMixer"})
    rows = report.table([rec]).splitlines()
    assert "born in backbone.layers.0.mixer (MambaMixer)" in rows[3] and "rollback: 1 bug (copy)" in rows
