"""`smearcli scan --against PREVIOUS`: what changed per architecture between two censuses
(`smearcli.census.diff`): fixed with the fixed path measured, regressed, new, gone, a diagnosis
changed, time named as time; both releases' numbers; the modeling lines that changed where both
releases' sources are given; `--check` fails on regressions only; and the files it refuses."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

pytest.importorskip("transformers", reason="transformers is not installed: pip install 'smearcli[hf]'")

from smearcli.census import diff, record  # noqa: E402
from smearcli.cli.app import app  # noqa: E402


def rec(name, verdict, release="5.24.0", **kw):
    return record.bare(name, verdict, transformers_version=release, **kw)


BUG_ROLLBACK = dict(worst_schedule="rollback", max_abs=0.23, multiple=1.5e5, shape="state not rolled back")
BEFORE = [rec("fixed_one", "bug", **BUG_ROLLBACK), rec("regresses", "ok"), rec("gone_one", "ok"),
          rec("now_crashes", "inconclusive"), rec("bug_to_crash", "bug", **BUG_ROLLBACK),
          rec("rediagnosed", "bug", worst_schedule="decode", max_abs=0.01, shape="decode path differs"),
          rec("slow", "timed out", reason="timed out: no verdict within 240 s, nor within 600 s on a retry (load 9)"),
          rec("same", "bug", worst_schedule="decode", max_abs=0.01, shape="decode path differs"),
          rec("unmeasured", "bug", **BUG_ROLLBACK)]
AFTER = [rec("fixed_one", "ok", "5.25.0", boundaries={"rollback": {"status": "ok", "max_abs": 2e-6, "multiple": 1.2}}),
         rec("regresses", "crashed", "5.25.0", reason="modeling_x.py:1 in f: TypeError: boom"),
         rec("new_one", "ok", "5.25.0"),
         rec("now_crashes", "crashed", "5.25.0", reason="cache_utils.py:1204 in crop: IndexError: x"),
         rec("bug_to_crash", "crashed", "5.25.0", reason="cache_utils.py:1204 in crop: IndexError: x"),
         rec("rediagnosed", "bug", "5.25.0", worst_schedule="chunks of 16", max_abs=0.02,
             shape="state dropped at chunk starts"),
         rec("slow", "bug", "5.25.0", worst_schedule="decode", max_abs=0.5, shape="decode path differs"),
         rec("same", "bug", "5.25.0", worst_schedule="decode", max_abs=0.011, shape="decode path differs"),
         rec("unmeasured", "ok", "5.25.0")]


def test_each_kind_of_change_with_both_releases_numbers():
    by = {c.model_type: c for c in diff.compare(BEFORE, AFTER)}
    assert {k: c.kind for k, c in by.items()} == {
        "fixed_one": diff.FIXED, "regresses": diff.REGRESSED, "gone_one": diff.GONE, "new_one": diff.NEW,
        "rediagnosed": diff.DIAGNOSIS, "slow": diff.VERDICT, "unmeasured": diff.VERDICT,
        "now_crashes": diff.REGRESSED, "bug_to_crash": diff.VERDICT}  # "same" did not move
    fixed = by["fixed_one"]
    assert fixed.path == {"schedule": "rollback", "max_abs": 2e-6, "multiple": 1.2}  # the fixed path, measured
    assert fixed.before["max_abs"] == 0.23 and fixed.before["release"] == "5.24.0"
    assert fixed.after["verdict"] == "ok" and fixed.after["release"] == "5.25.0"
    assert by["unmeasured"].path is None  # an ok that never measured the failing path is no fix
    assert by["slow"].cause.startswith("time:")
    # a new crash where their code ran clean (ok or inconclusive) gates a release; a bug that now
    # crashes, or a time-out that now has a verdict, does not
    assert sorted(c.model_type for c in diff.regressions(by.values())) == ["now_crashes", "regresses"]


def test_the_changed_lines_of_the_modeling_file_and_the_cache_api(tmp_path):
    old, new = tmp_path / "old", tmp_path / "new"
    for root, body in ((old, "a = 1\nb = 2\n"), (new, "a = 1\nb = 3\n")):
        (root / "models" / "fixed_one").mkdir(parents=True)
        (root / "models" / "fixed_one" / "modeling_fixed_one.py").write_text(body)
        (root / "cache_utils.py").write_text(body.replace("b", "crop"))
    (old / "models" / "regresses").mkdir()
    (new / "models" / "regresses").mkdir()
    for root in (old, new):
        (root / "models" / "regresses" / "modeling_regresses.py").write_text("same\n")
    from smearcli.engines.transformers.sources import Sources

    by = {c.model_type: c for c in diff.compare(BEFORE, AFTER, Sources(old, new))}
    c = by["fixed_one"]
    assert c.lines["modeling_fixed_one.py"] == ["-2: b = 2", "+2: b = 3"]
    assert c.lines["cache_utils.py"] == ["-2: crop = 2", "+2: crop = 3"]  # the rollback runs through it
    assert "2 lines differ in modeling_fixed_one.py" in c.cause and "cache_utils.py" in c.cause
    assert by["regresses"].cause == "modeling_regresses.py unchanged"


def test_markdown_lists_every_change_with_its_explanation():
    changes = diff.compare(BEFORE, AFTER)
    md = diff.markdown(changes, "transformers 5.24.0", "transformers 5.25.0", {"regresses": "ours: a test"})
    assert md.startswith("Against transformers 5.24.0: 2 regressed, 1 fixed, 3 verdict changed")
    assert "| regresses | regressed | ok | crashed | ours: a test |" in md
    assert "| fixed_one | fixed | bug 0.23 (rollback) | ok | rollback now 2e-06; -" in md


def files(tmp_path, before=BEFORE, after=AFTER):
    a, b = tmp_path / "before.jsonl", tmp_path / "after.jsonl"
    a.write_text("".join(json.dumps(r.to_json()) + "\n" for r in before))
    b.write_text("".join(json.dumps(r.to_json()) + "\n" for r in after))
    return a, b


def invoke(*args):
    r = CliRunner().invoke(app, ["scan", *map(str, args)])
    assert "Traceback" not in r.output, r.output
    return r


def test_against_prints_the_changes_and_check_fails_on_regressions_only(tmp_path):
    a, b = files(tmp_path)
    r = invoke("--merge", b, "--against", a)
    assert r.exit_code == 0, r.output
    assert "against transformers 5.24.0 (now transformers 5.25.0): 2 regressed, 1 fixed" in r.stdout
    assert "fixed_one" in r.stdout and "rollback now 2e-06" in r.stdout
    r = invoke("--merge", b, "--against", a, "--check")
    assert r.exit_code == 1 and "2 architectures regressed against transformers 5.24.0: now_crashes, regresses" in r.stderr
    no_regression = [x for x in AFTER if x.model_type not in ("regresses", "now_crashes")]
    a, b = files(tmp_path, after=no_regression + [rec("regresses", "ok", "5.25.0"), rec("now_crashes", "inconclusive", "5.25.0")])
    r = invoke("--merge", b, "--against", a, "--check")  # bugs remain, none regressed: the gate passes
    assert r.exit_code == 0, r.output


def test_against_refusals_are_one_line_errors(tmp_path):
    a, b = files(tmp_path)
    vllm = tmp_path / "vllm.jsonl"
    vllm.write_text(json.dumps(rec("x", "ok", engine="vllm", vllm_version="0.32.0").to_json()) + "\n")
    doc = tmp_path / "doc.json"
    doc.write_text(json.dumps({"schema": "smearcli.scan/1", "architectures": []}) + "\n")
    torn = tmp_path / "torn.jsonl"
    torn.write_text(json.dumps(BEFORE[0].to_json()) + "\n" + '{"model_type": "b", "verd')
    cases = [
        (["--merge", b, "--against", vllm], "--against holds a census on vllm, and --merge's on transformers"),
        (["--against", vllm, "--out", tmp_path / "o.jsonl"], "--against holds a census on vllm"),
        (["--merge", b, "--against", doc], "a smearcli.scan/1 document"),
        (["--merge", b, "--against", torn], "torn.jsonl:2: not a JSON object (truncated?)"),
        (["--merge", b, "--against", a, "--against", a], "given twice"),
        (["--merge", b, "--against", b], "a census compared with itself"),
        (["--against", a, "--out", a], "--out"),  # the run would overwrite the census it compares with
        (["--merge", b, "--against-source", tmp_path], "it needs --against"),
        (["--merge", b, "--against", a, "--against-source", tmp_path], "not a transformers package directory"),
    ]
    for args, words in cases:
        r = invoke(*args)
        assert r.exit_code == 2, (args, r.output)
        lines = r.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("smearcli: error: ") and words in lines[0], (args, r.stderr)


def test_each_engine_names_its_own_release():
    """A census is labelled by the release of its own engine, as its registration reads it from the
    record: a llama.cpp census by llama-cpp-python's version, never by the transformers reference's."""
    ll = [record.bare("llama", "ok", engine="llamacpp", transformers_version="5.24.0",
                      llamacpp={"llama_cpp_python": "0.3.36"})]
    vl = [record.bare("llama", "ok", engine="vllm", transformers_version="5.24.0", vllm_version="0.32.0")]
    assert diff.release(ll) == "llama-cpp-python 0.3.36"
    assert diff.release(vl) == "vLLM 0.32.0"
    assert diff.release(BEFORE) == "transformers 5.24.0"
    assert diff.numbers(ll[0])["release"] == "0.3.36"
    with pytest.raises(Exception, match="a diff is between releases of one engine"):
        diff.compare(ll, vl)
    with pytest.raises(Exception, match="a census is of one engine"):
        diff.release(ll + vl)
