"""smearcli scan's isolation: a hang, a crash and a runaway allocation stay that architecture's
result; records stream to JSON Lines; resume, shards and merge give the same list."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from smearcli.judging import evidence
from smearcli.util.errors import UserError
from smearcli.census import budget, isolate, record, records
from conftest import scan_into


def stand_in(name: str) -> record.Record:
    """A stand-in check: the name says what the 'model' does."""
    if name == "hangs":
        while True:
            time.sleep(0.05)
    if name == "raises":
        raise ZeroDivisionError("their code divided by zero")
    if name == "dies":
        os.kill(os.getpid(), 9)
    if name == "allocates":
        blocks = []
        while True:
            blocks.append(bytearray(64 << 20))  # refused once the address space limit is reached
    return record.new(name, "ok", notes=[ran_in(os.getpid())])


def ran_in(pid: int) -> str:
    return f"ran in process {pid}"


@pytest.mark.slow  # waits out a hang: 11 s
def test_hang_crash_and_allocation_are_results(tmp_path):
    out = tmp_path / "scan.jsonl"
    t0 = time.monotonic()
    recs = scan_into(["fine", "hangs", "raises", "dies", "allocates", "fine2"], stand_in, out,
                        jobs=2, timeout=3, memory=1 << 30)
    assert time.monotonic() - t0 < 40  # the hang is tried twice: 3 s, then 7.5 s
    by = {r.model_type: r for r in records.read(out).records}
    assert set(by) == {"fine", "hangs", "raises", "dies", "allocates", "fine2"}
    assert by["fine"].verdict == by["fine2"].verdict == "ok"
    assert by["fine"].notes != [ran_in(os.getpid())]  # it ran in a child
    assert by["hangs"].verdict == "timed out"  # time is not a verdict on their code
    assert by["hangs"].reason.startswith("timed out: no verdict within 3 s, nor within 7.5 s on a retry (load ")
    assert by["raises"].verdict == "crashed" and "ZeroDivisionError" in by["raises"].reason
    assert by["dies"].verdict == "crashed" and "SIGKILL" in by["dies"].reason
    assert by["allocates"].verdict == "crashed" and "memory" in by["allocates"].reason
    assert len(recs) == 6


SLOW_ONCE = "slow-once"


def slow_then_quick(name: str) -> record.Record:
    """Slow on its first try (a busy machine), quick on the second: a marker file says which."""
    mark = Path(os.environ["SMEARCLI_TEST_MARK"]) / name
    if name == SLOW_ONCE and not mark.exists():
        mark.write_text("tried")
        time.sleep(60)
    return record.new(name, "ok")


def test_an_architecture_out_of_time_is_retried_once_with_more(tmp_path, monkeypatch):
    monkeypatch.setenv("SMEARCLI_TEST_MARK", str(tmp_path))
    recs = scan_into([SLOW_ONCE, "quick"], slow_then_quick, tmp_path / "scan.jsonl", jobs=1, timeout=2)
    by = {r.model_type: r for r in recs}
    assert by[SLOW_ONCE].verdict == by["quick"].verdict == "ok"
    assert [r.model_type for r in recs] == ["quick", SLOW_ONCE]  # the retry waits for the others


def finds_then_stalls(name: str) -> record.Record:
    """A check that makes its finding, sends it (`stage`), then stalls in what comes after (a
    reproducer on a busy machine)."""
    kept = evidence.Confirmation(0.5, "float32", 0.5, 0.0, "bug", "keeps its size in float64").to_json()
    rec = record.new(name, "bug", worst_schedule="decode", confirmation=kept)  # a bug needs its float64 rerun
    budget.stage(rec)
    if name == "stalls-after-file":
        rec.reproducer = "/tmp/x.py"
        budget.stage(rec)
    while True:
        time.sleep(0.05)


def test_a_finding_made_is_kept_when_what_follows_runs_out_of_time(tmp_path, monkeypatch):
    monkeypatch.setattr(budget, "later_limit", lambda check_s: 1.0)
    t0 = time.monotonic()
    recs = scan_into(["stalls", "stalls-after-file"], finds_then_stalls, tmp_path / "scan.jsonl", jobs=2,
                        timeout=60)  # the architecture's limit is not what ends it
    assert time.monotonic() - t0 < 20
    by = {r.model_type: r for r in recs}
    for name in by:
        assert by[name].verdict == "bug" and by[name].worst_schedule == "decode"
        assert "the verdict stands" in by[name].notes[-1] and "within 1 s" in by[name].notes[-1]
    assert "writing its reproducer did not finish" in by["stalls"].notes[-1]
    assert by["stalls-after-file"].reproducer == "/tmp/x.py"  # the file has its record
    assert "its reproducer did not finish" in by["stalls-after-file"].notes[-1]


def test_the_time_after_a_verdict_is_scaled_to_the_checks_pace():
    assert budget.later_limit(10) == budget.LATER_FLOOR and budget.later_limit(200) == 600.0


def test_stage_outside_a_worker_does_nothing():
    budget.stage(record.new("x", "ok"))  # no parent to send it to: no error, no output


def test_resume_skips_what_is_there_and_a_torn_line(tmp_path):
    out = tmp_path / "scan.jsonl"
    out.write_text(json.dumps({"model_type": "a", "verdict": "bug"}) + "\n" + '{"model_type": "b", "verd')
    recs = scan_into(["a", "b", "c"], stand_in, out, resume=True)
    assert [r.model_type for r in recs] == ["b", "c"]
    by = {r.model_type: r for r in records.read(out).records}
    assert by["a"].verdict == "bug"  # kept, not rerun
    assert by["b"].verdict == by["c"].verdict == "ok"
    recs = scan_into(["a", "b"], stand_in, out)  # without resume the file starts over
    assert {r.model_type for r in records.read(out).records} == {"a", "b"}
    assert records.read(out).records[0].verdict == "ok"


def sleepy(name: str) -> record.Record:
    """A check whose time varies by name, as architectures' do (m0 is the slowest)."""
    time.sleep(2.0 if name == "m0" else 0.05)
    return record.new(name, "ok", notes=[ran_in(os.getpid())])


def test_scans_sharing_claims_split_the_names_between_them_and_merge_into_the_single_scan(tmp_path):
    """Two scans at once with one claims folder: each name checked by exactly one, the slow name's
    scan taking fewer (they take the next free name, not every other one), the merged files the
    single scan's list; a name claimed already is left to whoever holds it."""
    names = [f"m{i}" for i in range(8)]
    folder = tmp_path / "claims"
    pids = []
    for lane in (1, 2):
        pid = os.fork()
        if pid == 0:  # a scan of its own, as gen_census.py --engine vllm starts them
            code = 1
            try:
                scan_into(names, sleepy, tmp_path / f"lane{lane}.jsonl", claim=isolate.claims(folder))
                code = 0
            finally:
                os._exit(code)
        pids.append(pid)
    assert all(os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) == 0 for pid in pids)
    lanes = [[r.model_type for r in records.read(tmp_path / f"lane{i}.jsonl").records] for i in (1, 2)]
    assert sorted(lanes[0] + lanes[1]) == names and not set(lanes[0]) & set(lanes[1])
    slow = next(lane for lane in lanes if "m0" in lane)
    assert len(slow) < len(names) / 2  # the other scan took the names it would have had at its turn
    assert [r.model_type for r in records.merge([tmp_path / "lane1.jsonl", tmp_path / "lane2.jsonl"])] == names
    assert sorted(x.name for x in folder.iterdir()) == names
    assert scan_into(names, sleepy, tmp_path / "late.jsonl", claim=isolate.claims(folder)) == []


def test_shards_merge_into_the_single_scan(tmp_path):
    names = [f"m{i}" for i in range(7)]
    scan_into(names, stand_in, tmp_path / "all.jsonl", jobs=2)
    parts = []
    for i in (1, 2, 3):
        p = tmp_path / f"shard{i}.jsonl"
        scan_into(isolate.shard(names, i, 3), stand_in, p)
        parts.append(p)
    assert sorted(sum((isolate.shard(names, i, 3) for i in (1, 2, 3)), [])) == names
    strip = lambda recs: [{k: v for k, v in r.to_json().items() if k not in ("notes", "wall_s")} for r in recs]
    assert strip(records.merge(parts)) == strip(records.merge([tmp_path / "all.jsonl"]))
    with pytest.raises(UserError):
        isolate.shard(names, 4, 3)
    with pytest.raises(UserError):
        records.merge([tmp_path / "missing.jsonl"])


def full_record(name: str) -> record.Record:
    """A check returning a whole record (census.record: every field present, null until set)."""
    return record.new(name, "ok")


def test_the_time_and_the_release_stamp_a_whole_record(tmp_path):
    """A record from census.record.new has wall_s and transformers_version as null: the isolation fills
    them in (a setdefault would have left them null), the release from the session's stamp, and never
    over a release the check set itself."""
    def check(name):
        return record.new(name, "ok", transformers_version="own") if name == "own" else full_record(name)

    recs = scan_into(["whole", "own"], check, tmp_path / "scan.jsonl", stamp={"transformers_version": "9.9.9"})
    by = {r.model_type: r for r in recs}
    assert isinstance(by["whole"].wall_s, float) and by["whole"].wall_s >= 0
    assert by["whole"].transformers_version == "9.9.9" and by["own"].transformers_version == "own"


def test_every_engine_stamps_the_transformers_release_of_its_reference():
    """Each built-in engine's records say which transformers release made their reference (the
    session's stamp, read in the census's own process, so a worker that died before its check has it too)."""
    tf = pytest.importorskip("transformers")
    from smearcli.engines.llamacpp.session import Session as Llama
    from smearcli.engines.transformers.session import InProcess
    from smearcli.engines.vllm.session import Session as VLLM

    assert InProcess().stamp() == {"transformers_version": tf.__version__}
    assert VLLM.stamp(None) == Llama.stamp(None) == {"transformers_version": tf.__version__}
