"""The JSON Schema files under docs/schemas/: one per schema smearcli writes, each precise enough to
refuse a document with a field dropped, misspelt or of the wrong type; their verdict words are the
enum's; every committed JSON output (docs/snippets, JSON blocks in the docs) matches its file.
Every document the rest of the suite writes is checked by the autouse fixture in conftest.py
(`json_matches_its_schema`); the last tests here check that fixture itself."""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path

import pytest
from jsonschema import Draft202012Validator
from typer.testing import CliRunner

import schema_check
from smearcli.measure import jsondoc
from smearcli.util import jsonsafe
from smearcli.census import record, records, report
from smearcli.cli.app import app
from smearcli.measure import schedules
from smearcli.judging.judge import CHECKED_NOTHING
from smearcli.measure.steps import CACHE_COPY, PREFIX_HIT
from smearcli.judging.verdicts import BUG, CRASHED, LEFT_UNSUPPORTED, NOT_JUDGED, NOT_RUN, RECORD, ROUNDING, UNCONFIRMED, WORDS
from conftest import ROOT  # noqa: E402 - the clone's root

FILES = sorted(schema_check.SCHEMA_DIR.glob("*.json"))
SHORTENED = re.compile(r"^\.\.\. (\d+) more \.\.\.$")  # docs/gen_snippets.py's cut in a long list


def load(name: str) -> dict:
    return json.loads((schema_check.SCHEMA_DIR / name).read_text())


def compare_json(*args) -> dict:
    r = CliRunner().invoke(app, ["compare", "--json", "--quiet", *args])
    assert r.exit_code in (0, 1), r.output
    return json.loads(r.stdout)


@pytest.fixture(scope="module")
def ours_doc() -> dict:
    return compare_json("--schedules", "chunked,decode", "--seq-len", "16")


# -- the files ------------------------------------------------------------------------------------
def test_every_schema_name_has_its_file_and_every_file_a_name():
    titles = {load(p.name)["title"]: p for p in FILES}
    assert set(titles) == set(jsondoc.SCHEMAS.values())
    for name, path in titles.items():
        assert schema_check.schema_file(name) == path and load(path.name)["$id"] == path.name


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.name)
def test_each_file_is_a_valid_json_schema(path):
    Draft202012Validator.check_schema(load(path.name))


def test_the_docs_describe_and_link_every_file():
    text = (ROOT / "docs" / "json-schema.md").read_text()
    for path in FILES:
        assert f"(schemas/{path.name})" in text, path.name
        assert f"`{load(path.name)['title']}`" in text


# -- words from smearcli/judging/verdicts.py and the code that defines them --------------------------------
def test_words_come_from_the_code():
    line = load("compare-1.json")["$defs"]["verdict_line"]["pattern"]
    assert line == "^(" + "|".join(w.upper() for w in WORDS) + "): "
    scan = load("scan-1.json")
    record = scan["$defs"]["record"]["properties"]
    assert record["verdict"]["enum"] == list(RECORD) and set(RECORD) <= set(WORDS)
    assert scan["$defs"]["variant"]["properties"]["verdict"]["enum"] == list(RECORD)
    assert list(scan["properties"]["counts"]["properties"]) == list(RECORD)
    statuses = [str(BUG), ROUNDING, str(UNCONFIRMED)]
    assert scan["$defs"]["confirmation"]["properties"]["status"]["enum"] == statuses
    # a schedule's status: a confirmation's (the transformers census) or a verdict word (the vLLM engine)
    assert scan["$defs"]["schedule_entry"]["properties"]["status"]["enum"] == sorted(set(WORDS) | set(statuses))
    # a boundary's status: a verdict word or one of the boundary's own (never its provisional `departs`)
    from smearcli.engines.transformers import boundary
    said = scan["$defs"]["boundary_status"]["enum"]
    assert said == sorted(set(WORDS) | {boundary.PASSED, boundary.REFUSED, NOT_JUDGED, LEFT_UNSUPPORTED})
    assert boundary.DEPARTS not in said
    outcome = load("compare-1.json")["$defs"]["comparison"]["properties"]["not_measured"]["items"]
    assert outcome["properties"]["outcome"]["enum"] == [str(CRASHED), CHECKED_NOTHING, str(NOT_RUN)]


def test_the_scan_document_holds_every_field_the_report_writes():
    arch = load("scan-1.json")["$defs"]["architecture"]["allOf"][1]["required"]
    assert sorted(arch) == sorted(report.FIELDS)


def test_every_boundary_kind_is_documented():
    """A run's `boundaries` is open to a registered schedule's marks; the built-in kinds are named
    in the schema file and the docs."""
    said = load("compare-1.json")["$defs"]["run"]["properties"]["boundaries"]["description"]
    page = (ROOT / "docs" / "json-schema.md").read_text()
    for kind in (CACHE_COPY, PREFIX_HIT, *schedules.mark_words()):
        assert kind in said and f"`{kind}`" in page, kind


# -- precise enough: a real document matches, a broken one does not ---------------------------------
def test_a_real_compare_document_matches(ours_doc):
    assert ours_doc["schema"] == "smearcli.compare/1"
    assert schema_check.document_problems(ours_doc) == []


BREAKS = {
    "a run's field dropped": lambda d: d["runs"][0].pop("kl_max"),
    "a field misspelt": lambda d: d.__setitem__("verdit", d.pop("verdict")),
    "an unknown field": lambda d: d.__setitem__("extra", 1),
    "a list of ints as a string": lambda d: d["runs"][0].__setitem__("steps", "4,4,4,4"),
    "a verdict without its word": lambda d: d.__setitem__("verdict", "fine: " + d["verdict"]),
    "a verdict word not in the enum": lambda d: d.__setitem__("verdict", "MAYBE: it ran"),
    "the model's dtype dropped": lambda d: d["model"].pop("dtype"),
    "a transformers-only field on ours": lambda d: d["runs"][0].__setitem__("born_at", None),
    "a not_measured outcome not in the enum": lambda d: d["not_measured"].append(
        {"schedule": "decode", "logic": "old", "outcome": "exploded", "message": "", "steps": [1]}),
    "a number as a string": lambda d: d["noise_floor"]["per_layer"].__setitem__(0, "1e-7"),
    "the wrong schema version": lambda d: d.__setitem__("schema", "smearcli.compare/2"),
}


@pytest.mark.parametrize("name", BREAKS)
def test_a_broken_compare_document_does_not_match(ours_doc, name):
    doc = copy.deepcopy(ours_doc)
    BREAKS[name](doc)
    assert schema_check.document_problems(doc), name


def test_a_transformers_document_is_compare_1_with_its_own_fields():
    pytest.importorskip("transformers")
    doc = compare_json("--impl", "hf", "--hf-model", "llama", "--schedules", "chunked", "--seq-len", "16")
    assert doc["schema"] == "smearcli.compare/1" and doc["model"]["model_class"] == "LlamaForCausalLM"
    assert doc["not_measured"] == [] and doc["analytic_check"] == {}  # the fields every implementation has
    assert schema_check.document_problems(doc) == []
    broken = copy.deepcopy(doc)
    del broken["runs"][0]["born_at"]
    assert schema_check.document_problems(broken)
    broken = copy.deepcopy(doc)
    del broken["what_ran"]
    assert schema_check.document_problems(broken)


def crashed_record(**kw) -> dict:
    return {"model_type": "arch0", "verdict": str(CRASHED), "reason": "ValueError: no", "wall_s": 0.5, **kw}


def test_a_scan_record_and_document_match_and_a_misspelt_field_does_not():
    assert schema_check.record_problems(crashed_record()) == []
    assert schema_check.record_problems(crashed_record(verdict="broken"))
    assert schema_check.record_problems(crashed_record(worst_shedule="decode"))
    assert schema_check.record_problems({"verdict": str(CRASHED)})  # model_type is certain
    doc = json.loads(jsonsafe.dumps(report.document([record.bare(**crashed_record())], {"transformers_version": "5.24.0",
                                    "torch_version": "2.13.0", "python": "3.11.7", "wall_s": 1.0})))
    assert schema_check.document_problems(doc) == []
    del doc["architectures"][0]["reason"]  # the document writes every field, null where none
    assert schema_check.document_problems(doc)


def test_a_real_scan_finding_matches(census_record):
    """Mamba's census check, a bug: its record (confirmation, born_in, both boundaries, rollback's
    two ways) and a document with its group."""
    made = census_record("mamba")
    rec = json.loads(jsonsafe.dumps(made.to_json(), default=str))
    assert rec["verdict"] == str(BUG) and rec["born_in"]["module"] and "rollback" in rec["boundaries"]
    assert schema_check.record_problems(rec) == []
    meta = {"transformers_version": "5.24.0", "torch_version": "2.13.0", "python": "3.11.7", "wall_s": 1.0}
    doc = json.loads(jsonsafe.dumps(report.document([made], meta)))
    assert doc["groups"] and schema_check.document_problems(doc) == []


# -- committed outputs -------------------------------------------------------------------------------
def lengthened(value):
    """A snippet's JSON with each "... N more ..." cut (docs/gen_snippets.py) filled with N copies of
    the number before it: the document's shape as the command wrote it."""
    if isinstance(value, dict):
        return {k: lengthened(v) for k, v in value.items()}
    if isinstance(value, list):
        out = []
        for v in value:
            m = SHORTENED.match(v) if isinstance(v, str) else None
            out.extend([out[-1]] * int(m.group(1)) if m else [lengthened(v)])
        return out
    return value


def json_snippets() -> list[Path]:
    return [p for p in sorted((ROOT / "docs" / "snippets").glob("*.txt"))
            if " --json" in p.read_text().splitlines()[0]]


def test_every_json_snippet_matches_its_schema():
    snippets = json_snippets()
    assert snippets, "no snippet of a --json command in docs/snippets"
    for path in snippets:
        text = path.read_text()
        doc, _ = json.JSONDecoder().raw_decode(text[text.index("\n{") + 1:])
        assert schema_check.document_problems(lengthened(doc)) == [], path.name


def json_blocks() -> list[tuple[str, str]]:
    """(file, block) for each ```json block of the docs that is a whole object (a block that is
    not, like docs/json-schema.md's `non_finite` example, shows a few fields alone)."""
    out = []
    for md in sorted([ROOT / "README.md", *(ROOT / "docs").rglob("*.md")]):
        for block in re.findall(r"^```json\n(.*?)^```", md.read_text(), flags=re.S | re.M):
            if block.lstrip().startswith("{"):
                out.append((str(md.relative_to(ROOT)), block))
    return out


def test_every_json_document_in_the_docs_matches_its_schema():
    blocks = json_blocks()
    assert any(f == "docs/audit.md" for f, _ in blocks)
    for where, block in blocks:
        doc = json.loads(block)
        assert str(doc.get("schema", "")).startswith("smearcli."), f"{where}: a JSON block that names no schema"
        assert schema_check.document_problems(doc, excerpt=schema_check.ELIDED in block) == [], where


def test_an_excerpt_may_leave_fields_out_but_not_misspell_one():
    _, block = next(b for b in json_blocks() if b[0] == "docs/audit.md")
    doc = json.loads(block)
    doc["passd"] = doc.pop("passed")
    assert schema_check.document_problems(doc, excerpt=True)


# -- the fixture that checks every document the suite writes -----------------------------------------
def test_the_fixture_catches_a_document_that_does_not_match(json_matches_its_schema):
    jsonsafe.dumps({"schema": "smearcli.compare/1", "runs": []})
    jsonsafe.dumps({"schema": "smearcli.nosuch/1"})
    jsonsafe.dumps({"not": "a document"})  # not one of smearcli's documents: nothing to check
    assert len(json_matches_its_schema) >= 2 and any("no schema file" in p for p in json_matches_its_schema)
    json_matches_its_schema.clear()


def test_the_fixture_catches_a_scan_record_that_does_not_match(json_matches_its_schema, tmp_path):
    with records.Sink(tmp_path / "scan.jsonl") as sink:
        sink.write(record.bare(**crashed_record()))
        assert json_matches_its_schema == []
        sink.write(record.bare(**crashed_record(model_type="arch1", verdict="exploded")))
    assert json_matches_its_schema and "verdict" in json_matches_its_schema[0]
    json_matches_its_schema.clear()


@pytest.mark.parametrize("where", ["padded", "rollback/their_crop"])
def test_a_record_holding_a_boundarys_provisional_status_is_refused(where):
    """A departure's status before its float64 rerun (`boundary.DEPARTS`) must never reach a record:
    the check gives every one the judge's status, and the schema holds the record to it."""
    from smearcli.engines.transformers import boundary
    doc = crashed_record(boundaries={"padded": {"status": "ok"},
                                     "rollback": {"status": "ok", "their_crop": {"status": "passed", "confirmation": None}}})
    assert schema_check.record_problems(doc) == []
    part = doc["boundaries"]
    for key in where.split("/"):
        part = part[key]
    part["status"] = boundary.DEPARTS
    assert any("status" in p and "departs" in p for p in schema_check.record_problems(doc))
