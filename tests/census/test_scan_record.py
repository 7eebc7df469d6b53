"""The census record is declared once (smearcli.census.record): every field reaches the record
files and the JSON document, a field not declared is refused where the record is made, and the
type check of a record read from a file covers every declared field."""

from __future__ import annotations

import json

import pytest

from smearcli.census import record, records, report
from smearcli.util.errors import UserError

WRONG = {"a string": 7, "a number": "x", "an integer": 1.5, "a list": {"a": 1}, "an object": [1]}
RIGHT = {"a string": "s", "a number": 0.5, "an integer": 3, "a list": [1], "an object": {"k": 1}}


def full_record() -> record.Record:
    """A record with a value of its declared type in every field."""
    values = {name: RIGHT[kind[1]] for name, kind in record.JSON_TYPES.items()}
    values.pop("model_type", None)
    values.pop("verdict", None)
    values.update(schedules={"decode": {"max_abs": 0.1, "multiple": 1.0, "passed": True}},
                  boundaries={"padded": record.BoundaryResult("ok", why="w")},  # entries are objects themselves
                  born_in={"module": "model.layers.0", "class": "Mixer", "lines": [3, 9]},
                  variants=[{"order": ["attention"], "verdict": "ok", "born_in": None}],
                  reach={"generate": {"result": "agrees", "max_abs": 0.0}},
                  replication={"ties": 0, "second_seed": {"verdict": "bug"}, "default_counts": {"rerun": None}},
                  upstream=[{"path": "decode", "class": "new", "threads": [{"id": "t", "url": "https://x"}]}])
    return record.new("arch", "ok", **values)


def test_every_declared_field_reaches_the_json_document_and_back():
    rec = full_record()
    assert list(rec.to_json()) == record.FIELDS
    (row,) = report.document([rec])["architectures"]
    assert set(row) == set(record.FIELDS)
    assert row == json.loads(json.dumps(rec.to_json()))  # nothing dropped, nothing renamed
    back = records.check_record("f:1", json.loads(json.dumps(rec.to_json())))  # and it reads back
    assert isinstance(back, record.Record) and back == rec


def test_an_engines_fields_are_held_after_the_declared_ones_in_the_order_engines_registered_them():
    """The core declares no engine's field (`census.record.DECLARED`): vLLM's release and data and
    llama.cpp's data are held fields each engine registers (`Engine.data` -> `record.hold`), written
    after the declared ones in the order the JSON has always had, typed as their parts, and read back."""
    import smearcli.engines  # noqa: F401  (registers the built-in engines, their fields with them)
    from smearcli.engines.llamacpp.data import LlamaCppData
    from smearcli.engines.vllm.data import VllmData

    assert not {"vllm_version", "vllm", "llamacpp"} & set(record.DECLARED)
    assert record.FIELDS[-4:] == ["engine", "vllm_version", "vllm", "llamacpp"] and "vllm_version" in record.VERSIONS
    rec = record.new("a", "ok", engine="vllm", vllm_version="0.32.0", vllm={"answered": True, "stuck": False})
    assert isinstance(rec.vllm, VllmData) and rec.vllm.answered and rec.llamacpp is None
    rec.llamacpp = {"arch": "llama"}  # set later, as an engine's session does: held, typed all the same
    assert isinstance(rec.llamacpp, LlamaCppData) and "llamacpp" not in vars(rec)
    got = rec.to_json()
    assert list(got)[-3:] == ["vllm_version", "vllm", "llamacpp"] and got["vllm"] == {"answered": True, "stuck": False}
    assert records.check_record("f:1", json.loads(json.dumps(got))) == rec
    plain = record.new("b", "ok")  # no engine's field given: it reads back equal, its nulls no entries
    assert records.check_record("f:1", json.loads(json.dumps(plain.to_json()))) == plain and plain.vllm is None
    with pytest.raises(ValueError, match="every record declares"):
        record.hold("verdict", record.STRING)
    with pytest.raises(AttributeError, match="not_held"):
        rec.not_held


def test_a_boundary_result_writes_the_fields_it_was_given_in_one_order_and_reads_back():
    """Padded's entry, rollback's with both ways, and one read from a file with a key of another
    release: each JSON holds exactly the keys given, in the declared order, and reads back equal."""
    padded = record.BoundaryResult("passed", max_abs=None, multiple=None, shape=None, mode=None, why=None)
    padded.pad_id, padded.positions = None, True  # set later, as engines.transformers.boundary does: given all the same
    assert list(padded.to_json()) == ["status", "max_abs", "multiple", "shape", "mode", "why", "pad_id", "positions"]
    assert padded.rows is None and not padded.given("rows")  # never given: None, and not written
    crop = record.BoundaryResult("unsupported", max_abs=1.0, multiple=2.0, why=None, confirmation=None,
                                 api_finding={"at": "x"}, declared="d")
    rollback = padded.but(their_crop=crop, copy=record.BoundaryResult("ok"), generate_refuses=None)
    assert padded.but().to_json() == padded.to_json()  # a copy writes what the original was given
    got = rollback.to_json()
    assert list(got)[-3:] == ["their_crop", "copy", "generate_refuses"]
    assert list(got["their_crop"]) == ["status", "max_abs", "multiple", "why", "confirmation", "declared", "api_finding"]
    assert record.BoundaryResult.from_json(json.loads(json.dumps(got))) == rollback
    assert padded.to_json() == {"status": "passed", "max_abs": None, "multiple": None, "shape": None, "mode": None,
                                "why": None, "pad_id": None, "positions": True}  # `but` left the original alone
    odd = {"status": "ok", "why": None, "from_a_later_release": 1}
    assert record.BoundaryResult.from_json(odd).to_json() == odd  # a key no field declares is kept
    rec = records.check_record("f:1", {"model_type": "a", "verdict": "ok", "boundaries": {"rollback": got}})
    assert isinstance(rec.boundaries["rollback"].their_crop, record.BoundaryResult)
    assert rec.to_json()["boundaries"] == {"rollback": got}


def test_a_field_that_is_not_declared_is_refused_where_the_record_is_made():
    with pytest.raises(TypeError, match="not_a_field"):
        record.new("arch", "ok", not_a_field=1)


def test_the_config_rides_along_in_the_process_and_never_leaves_it():
    config = object()
    rec = record.new("arch", "ok", built_from=config)
    assert rec.built_from is config  # the reachability runs and the reproducer rebuild it
    assert "built_from" not in record.FIELDS and "built_from" not in record.JSON_TYPES
    assert "built_from" not in rec.to_json()
    assert records.check_record("f:1", json.loads(json.dumps(rec.to_json()))).built_from is None


def test_a_field_a_file_lacks_reads_as_null_as_the_document_shows_it():
    rec = records.check_record("f:1", {"model_type": "arch", "verdict": "timed out", "reason": "r"})
    assert isinstance(rec, record.Record)
    assert rec.reason == "r" and rec.notes is None and rec.vocab is None and rec.boundaries is None
    (row,) = report.document([rec])["architectures"]
    assert row == {name: {"model_type": "arch", "verdict": "timed out", "reason": "r"}.get(name)
                   for name in record.FIELDS}
    assert record.bare("arch", "timed out", reason="r") == rec  # what isolate makes of a process that died


@pytest.mark.parametrize("name", sorted(set(record.JSON_TYPES) - {"model_type", "verdict"}))
def test_a_record_read_from_a_file_is_held_to_every_declared_type(name):
    rec = json.loads(json.dumps(full_record().to_json()))
    rec[name] = WRONG[record.JSON_TYPES[name][1]]
    with pytest.raises(UserError, match=f'"{name}" must be'):
        records.check_record("f:1", rec)


def test_a_schedule_result_is_typed_and_writes_its_fields_in_the_order_its_writer_gave_them():
    """Transformers gives numbers then the judge's status; vLLM and llama.cpp the status first: each
    entry's JSON is as its engine built it (so a record file reads back byte for byte), and an
    entry given as a JSON object is read as a `ScheduleResult`, wherever the record is made."""
    mine = record.ScheduleResult(max_abs=0.5, multiple=9.0, passed=False)
    mine.status, mine.confirmation = "bug", {"float64_lifted": 0.4}
    theirs = record.ScheduleResult("ok", 0.1, 1.0)
    theirs.steps = "3,3"
    assert list(mine.to_json()) == ["max_abs", "multiple", "passed", "status", "confirmation"]
    assert list(theirs.to_json()) == ["status", "max_abs", "multiple", "steps"]
    line = json.dumps({"model_type": "a", "verdict": "bug", "schedules": {"x": mine.to_json(), "y": theirs.to_json()}})
    rec = records.check_record("f:1", json.loads(line))
    assert isinstance(rec.schedules["x"], record.ScheduleResult) and rec.schedules["x"].passed is False
    assert rec.schedules["y"].status == "ok" and rec.schedules["y"].why is None  # never given: None
    assert json.dumps(rec.to_json()["schedules"]) == json.dumps({"x": mine.to_json(), "y": theirs.to_json()})
    made = record.new("a", "ok", schedules={"z": {"why": "w", "status": "not run"}})  # a check's fields, as objects
    assert made.schedules["z"] == record.ScheduleResult("not run", why="w")
    assert list(made.schedules["z"].to_json()) == ["why", "status"]  # in the order given


@pytest.mark.parametrize("name", sorted(record.ScheduleResult.types()))
def test_a_schedules_entry_read_from_a_file_is_held_to_its_declared_type(name):
    kind = record.ScheduleResult.types()[name]
    wrong = "yes" if kind is record.BOOLEAN else WRONG[kind[1]]
    rec = {"model_type": "a", "verdict": "ok", "schedules": {"decode": {name: wrong}}}
    with pytest.raises(UserError, match=f'"schedules"."decode": "{name}" must be'):
        records.check_record("f:1", rec)
    rec["schedules"]["decode"][name] = {record.BOOLEAN: True, record.STRING: "s", record.NUMBER: 0.5,
                                        record.INTEGER: 3, record.OBJECT: {"k": 1}}[kind]
    assert records.check_record("f:1", rec).schedules["decode"].to_json() == rec["schedules"]["decode"]
