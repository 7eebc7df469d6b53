"""smearcli scan's files and signals: record files that are truncated, concatenated, duplicated,
conflicting or not JSON Lines at all are refused by file and line; options that cannot mean anything
and output paths that are not regular files are refused before anything runs, with one line, exit 2
and nothing on disk changed; two scans never share an --out; an architecture out of memory is
`crashed`, as the guide says; a SIGINT or SIGTERM stops every worker, leaves only whole records, the
program dies by the signal, and --resume finishes the census as an uninterrupted run would. The
census runs on a stand-in check (tests/scan_standin.py)."""

from __future__ import annotations

import fcntl
import json
import os
import signal
import stat
import subprocess
import sys
import time
import types
from pathlib import Path

import pytest

import scan_standin
from hardening_util import invoke
from smearcli.util.errors import UserError
from smearcli.census import isolate, record, records
from smearcli.tiny import derive
from conftest import ROOT, scan_into  # noqa: E402 - the clone's root

REC = {"model_type": "a", "verdict": "ok"}


def line(**kw) -> str:
    return json.dumps({**REC, **kw}) + "\n"


def snapshot(d: Path) -> dict:
    """Every path under `d` with its kind, size and modification time (links not followed; a
    directory by its kind only: the probe that shows it writable touches its time, nothing else)."""
    out = {}
    for p in sorted(d.rglob("*")):
        st = p.lstat()
        out[p] = (stat.S_IFMT(st.st_mode),) + (() if stat.S_ISDIR(st.st_mode) else (st.st_size, st.st_mtime_ns))
    return out


def refused(args, cwd: Path, words: str, status: int = 2):
    """Run `smearcli scan ARGS` in `cwd`: exit `status`, one error line holding `words`, and not a
    file under `cwd` created, changed or removed."""
    before = snapshot(cwd)
    r = invoke(["scan", *args], allowed=(status,))
    err = [x for x in r.stderr.splitlines() if x.startswith("smearcli: error:")]
    assert len(err) == 1 and words in err[0], (args, r.stderr)
    assert snapshot(cwd) == before, (args, set(snapshot(cwd).items()) ^ set(before.items()))
    return err[0]


@pytest.fixture
def standin(tmp_path, monkeypatch):
    """The stand-in census in this process (its workers fork from the test), run in tmp_path."""
    import smearcli.engines.transformers as pkg
    from smearcli.cli.commands import scan as command

    fake = types.ModuleType("smearcli.engines.transformers.check")
    fake.check = scan_standin.check
    monkeypatch.setitem(sys.modules, fake.__name__, fake)
    monkeypatch.setattr(pkg, "check", fake, raising=False)
    monkeypatch.setattr(derive, "causal_lm_types", lambda: list(scan_standin.ARCHS))
    monkeypatch.setattr(command, "meta", lambda: {"transformers_version": "stand-in", "torch_version": "-",
                                                  "python": "-"})  # every field of the scan/1 header
    marks = tmp_path.parent / f"{tmp_path.name}-marks"  # outside the directory whose files are compared
    marks.mkdir()
    monkeypatch.setenv("STANDIN_MARKS", str(marks))
    monkeypatch.chdir(tmp_path)
    return tmp_path


# -- record files: --merge -------------------------------------------------------------------------

NESTED = "[" * 100_000 + "]" * 100_000
BAD_FILES = [  # (what, the file's bytes, the words of the one line)
    ("a truncated last line", line() + '{"model_type": "b", "verd', "s.jsonl:2: not a JSON object (truncated?)"),
    ("a line that is not JSON", line() + "oops\n" + line(model_type="c"),
     "s.jsonl:2: not a JSON object (Expecting value at column 1)"),
    ("two records on one line", line().strip() + line(model_type="b"), "s.jsonl:1: more than one JSON value"),
    ("a JSON array", line() + "[1, 2]\n", "s.jsonl:2: a JSON array, not a scan record"),
    ("no model_type", '{"verdict": "ok"}\n',
     's.jsonl:1: not a scan record ("model_type" must be a non-empty string, got none)'),
    ("an unknown verdict", line(verdict="fine"), 's.jsonl:1: a: "verdict" must be one of bug, crashed'),
    ("a number field holding a string", line(max_abs="big"),
     's.jsonl:1: a: "max_abs" must be a number or null, got "big"'),
    ("a boundary entry that is not an object", line(boundaries={"padded": 3}),
     's.jsonl:1: a: "boundaries"."padded" must be an object, got 3'),
    ("the same record twice", line() + line(wall_s=9), "s.jsonl:2: a second record for a (line 1 has the same one)"),
    ("two records of one model type that conflict", line() + line(verdict="bug"),
     "s.jsonl:2: a second record for a (conflicts with line 1: ok there, bug here)"),
    ("an empty file", "", "s.jsonl: holds no scan record"),
    ("blank lines only", "\n  \n", "s.jsonl: holds no scan record"),
    ("scan --json's document", json.dumps({"schema": "smearcli.scan/1", "architectures": [REC]}, indent=1),
     "s.jsonl: a smearcli.scan/1 document (the scan's JSON document), not the JSON Lines"),
    ("one object over several lines", json.dumps(REC, indent=1), "s.jsonl: one JSON object over several lines"),
    ("binary", b"\x89PNG\r\n\x1a\n\x00\xff", "s.jsonl:1: not UTF-8 text"),
    ("nested 100,000 deep", line() + NESTED + "\n", "s.jsonl:2: nested too deeply"),
]


@pytest.mark.parametrize("data,words", [c[1:] for c in BAD_FILES], ids=[c[0] for c in BAD_FILES])
def test_merge_refuses_a_bad_record_file_by_file_and_line(tmp_path, monkeypatch, data, words):
    monkeypatch.chdir(tmp_path)
    Path("s.jsonl").write_bytes(data if isinstance(data, bytes) else data.encode())
    refused(["--merge", "s.jsonl", "--markdown", "census.md"], tmp_path, words)


def test_merge_refuses_an_architecture_in_two_files_and_a_file_twice(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    Path("s.jsonl").write_text(line() + line(model_type="b"))
    Path("t.jsonl").write_text(line(model_type="c") + line(verdict="bug"))
    refused(["--merge", "s.jsonl", "--merge", "t.jsonl"], tmp_path,
            "t.jsonl:2: a second record for a (conflicts with s.jsonl:1: ok there, bug here); shards never share")
    refused(["--merge", "s.jsonl", "--merge", tmp_path / "s.jsonl"], tmp_path,
            f"{tmp_path / 's.jsonl'}: given twice (also as s.jsonl)")


@pytest.mark.parametrize("kind", ["directory", "fifo", "dangling symlink"])
def test_merge_refuses_what_is_not_a_regular_file(tmp_path, monkeypatch, kind):
    monkeypatch.chdir(tmp_path)
    {"directory": lambda: os.mkdir("s.jsonl"), "fifo": lambda: os.mkfifo("s.jsonl"),
     "dangling symlink": lambda: os.symlink("gone.jsonl", "s.jsonl")}[kind]()
    words = {"directory": "s.jsonl: is a directory", "fifo": "s.jsonl: a FIFO (named pipe), not a regular file",
             "dangling symlink": "s.jsonl: a symlink to 'gone.jsonl', which does not exist"}[kind]
    refused(["--merge", "s.jsonl"], tmp_path, words)


def test_merge_refuses_a_file_over_64_mib_before_reading_it(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    Path("s.jsonl").write_text(line())
    os.truncate("s.jsonl", (64 << 20) + 1)  # sparse: no disk, no time
    refused(["--merge", "s.jsonl"], tmp_path, "s.jsonl: 67108865 bytes, more than the 64 MiB a scan file may hold")


def test_merge_of_good_shards_still_works(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    Path("s.jsonl").write_text(line() + "\n" + line(model_type="b", verdict="bug", max_abs=0.5).rstrip("\n"))
    Path("t.jsonl").write_text(line(model_type="c", verdict="crashed", reason="x.py:1 in f: E"))
    assert [r.model_type for r in records.merge([Path("t.jsonl"), Path("s.jsonl")])] == ["a", "b", "c"]


# -- record files: --resume ------------------------------------------------------------------------

@pytest.mark.parametrize("data,words", [
    (line(model_type="arch0") + "oops\n" + line(model_type="arch1"), "scan.jsonl:2: not a JSON object"),
    (line(model_type="arch0") * 2, "scan.jsonl:2: a second record for arch0 (line 1 has the same one)"),
    (line(model_type="arch0", verdict="maybe"), '"verdict" must be one of'),
], ids=["a bad line in the middle", "a duplicate", "an unknown verdict"])
def test_resume_refuses_a_damaged_out_before_anything_runs(standin, data, words):
    Path("scan.jsonl").write_text(data)
    refused(["--resume", "--only", "arch0,arch1"], standin, words)
    assert not os.listdir(os.environ["STANDIN_MARKS"])  # nothing ran


def test_resume_drops_a_torn_last_record_and_says_so(standin):
    Path("scan.jsonl").write_text(line(model_type="arch0") + '{"model_type": "arch1", "verd')
    r = invoke(["scan", "--resume", "--only", "arch0,arch1", "--json"])
    assert "smearcli: scan.jsonl:2: a record cut short" in r.stderr, r.stderr
    assert [a["model_type"] for a in json.loads(r.stdout)["architectures"]] == ["arch0", "arch1"]
    ran = " ".join(os.listdir(os.environ["STANDIN_MARKS"]))
    assert "started-arch1" in ran and "started-arch0" not in ran  # only the torn one again
    assert [json.loads(x)["model_type"] for x in Path("scan.jsonl").read_text().splitlines()] == ["arch0", "arch1"]


def test_resume_after_a_last_record_without_its_newline_keeps_lines_apart(standin):
    Path("scan.jsonl").write_text(line(model_type="arch0").rstrip("\n"))  # an edited file
    invoke(["scan", "--resume", "--only", "arch0,arch1", "-q"])
    assert [r.model_type for r in records.read(Path("scan.jsonl")).records] == ["arch0", "arch1"]


@pytest.mark.parametrize("held,words", [
    ({"engine": "vllm", "vllm_version": "0.32.0"},
     "--resume: scan.jsonl:2 holds arch1's record made on vllm, and this census runs on transformers (--engine)"),
    ({"transformers_version": "4.0.0"},
     "--resume: scan.jsonl:2 holds arch1's record made by transformers 4.0.0, and this census runs transformers "
     "stand-in"),
], ids=["another engine", "another transformers release"])
def test_resume_refuses_another_engines_or_releases_records_before_anything_runs(standin, held, words):
    """Kept silently, such a record would be this census's result, and a later --merge refuses it."""
    Path("scan.jsonl").write_text(line(model_type="arch0", transformers_version="stand-in")
                                  + line(model_type="arch1", **held))
    refused(["--resume", "--only", "arch0,arch1,arch2"], standin, words)
    assert not os.listdir(os.environ["STANDIN_MARKS"])  # nothing ran


def test_a_full_disk_leaves_only_whole_records_and_names_the_file(tmp_path, monkeypatch):
    """ENOSPC half way through a record's write (simulated): the part written is cut off again."""
    import errno

    out = tmp_path / "scan.jsonl"
    real = os.write
    with records.Sink(out) as sink:
        sink.write(record.bare("a", "ok"))

        def full(fd, data):
            if fd != sink.fd:
                return real(fd, data)
            real(fd, bytes(data[:len(data) // 2]))  # what fitted
            raise OSError(errno.ENOSPC, "No space left on device")
        monkeypatch.setattr(os, "write", full)
        with pytest.raises(UserError) as e:
            sink.write(record.bare("b", "bug"))
        monkeypatch.setattr(os, "write", real)
    assert str(e.value).startswith(f"{out}: cannot write b's record (No space left on device)"), e.value
    assert out.read_bytes().endswith(b"\n")
    assert [r.model_type for r in records.read(out).records] == ["a"]  # whole records only, nothing torn


def test_merge_against_another_engines_census_is_refused_before_any_output(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    Path("a.jsonl").write_text(line())
    Path("b.jsonl").write_text(line(engine="vllm", vllm_version="0.32.0"))
    Path("census.md").write_text("the previous census")
    before = snapshot(tmp_path)
    r = invoke(["scan", "--merge", "a.jsonl", "--against", "b.jsonl", "--markdown", "census.md"], allowed=(2,))
    assert r.stderr.strip() == ("smearcli: error: --against holds a census on vllm, and --merge's on transformers: "
                                "a diff is between releases of one engine"), r.stderr
    assert r.stdout == "" and snapshot(tmp_path) == before  # no table printed, census.md as it was


# -- options that cannot mean anything -------------------------------------------------------------

@pytest.mark.parametrize("args,words", [
    (["--shard", "0/2"], "--shard 0/2: i must be between 1 and n"),
    (["--shard", "3/2"], "--shard 3/2: i must be between 1 and n"),
    (["--shard", "1/0"], "--shard 1/0: i must be between 1 and n"),
    (["--shard", "-1/2"], "--shard takes i/n (like 2/4), got '-1/2'"),
    (["--shard", "1/2/3"], "--shard takes i/n"),
    (["--shard", ""], "--shard takes i/n"),
    (["--shard", "7/8"], "--shard 7/8: 6 architectures make fewer than 7 shares, so this one would check none"),
    (["--jobs", "0"], "--jobs must be at least 1, got 0"),
    (["--jobs", "-3"], "--jobs must be at least 1, got -3"),
    (["--timeout", "0"], "--timeout must be a number of seconds in (0, 1e+06], got 0.0"),
    (["--timeout", "nan"], "--timeout must be a number of seconds in (0, 1e+06], got nan"),
    (["--timeout", "inf"], "--timeout must be a number of seconds in (0, 1e+06], got inf"),
    (["--memory-mb", "10"], "--memory-mb must be between 64 and 134217728 (128 TiB), got 10"),
    (["--memory-mb", str(1 << 60)], "--memory-mb must be between 64 and 134217728"),
    (["--only", ""], "--only '' names no model type; give some, like --only llama,bamba"),
    (["--only", " , ,"], "--only ' , ,' names no model type"),
    (["--only", "arch1,arch2,arch1"], "--only names arch1 more than once"),
    (["--only", "arch1,nope"], "--only: nope is not a causal LM of this transformers"),
    (["--merge", "s.jsonl", "--jobs", "2", "--resume"],
     "--merge checks nothing, it reports the files given: --jobs, --resume have no meaning with it"),
], ids=lambda a: " ".join(a) if isinstance(a, list) else None)
def test_options_that_cannot_mean_anything_are_refused(standin, args, words):
    Path("s.jsonl").write_text(line())
    refused(args, standin, words)
    assert not os.listdir(os.environ["STANDIN_MARKS"])


# -- output paths ----------------------------------------------------------------------------------

def _make(kind: str, path: str) -> None:
    {"dir": lambda: os.mkdir(path), "fifo": lambda: os.mkfifo(path), "file": lambda: Path(path).write_text("x"),
     "none": lambda: None}[kind]()


@pytest.mark.parametrize("args,kind,words", [
    (["--out", "o.jsonl"], ("dir", "o.jsonl"), "--out o.jsonl: is a directory"),
    (["--out", "o.jsonl"], ("fifo", "o.jsonl"), "--out o.jsonl: a FIFO (named pipe), not a regular file"),
    (["--out", "nodir/o.jsonl"], ("none", ""), "--out nodir/o.jsonl: directory nodir does not exist"),
    (["--markdown", "c.md"], ("dir", "c.md"), "--markdown c.md: is a directory"),
    (["--markdown", "c.md"], ("fifo", "c.md"), "--markdown c.md: a FIFO (named pipe), not a regular file"),
    (["--markdown", "nodir/c.md"], ("none", ""), "--markdown nodir/c.md: directory nodir does not exist"),
    (["--repro-dir", "r"], ("file", "r"), "--repro-dir r: not a directory"),
    (["--repro-dir", "r"], ("fifo", "r"), "--repro-dir r: not a directory"),
    (["--repro-dir", "nodir/r"], ("none", ""), "--repro-dir nodir/r: directory nodir does not exist"),
    (["--repro-dir", "r"], ("fifo", "r/arch1.py"), "--repro-dir r/arch1.py: a FIFO (named pipe) where arch1's"),
    (["--out", "x.jsonl", "--markdown", "x.jsonl"], ("none", ""), "--markdown x.jsonl is also --out x.jsonl"),
], ids=lambda a: " ".join(a) if isinstance(a, list) else None)
def test_output_paths_are_refused_before_anything_runs(standin, args, kind, words):
    if kind[1].startswith("r/"):
        os.mkdir("r")
    _make(*kind)
    refused(["--only", "arch1", *args], standin, words)
    assert not os.listdir(os.environ["STANDIN_MARKS"])  # checked before the first architecture
    if kind[0] == "fifo":
        assert stat.S_ISFIFO(os.lstat(kind[1]).st_mode)  # never unlinked, never replaced


def test_markdown_over_a_merge_input_is_refused(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    Path("s.jsonl").write_text(line())
    refused(["--merge", "s.jsonl", "--markdown", "s.jsonl"], tmp_path, "--markdown s.jsonl is also --merge s.jsonl")


def test_out_on_a_character_device_is_refused_and_left_a_device(standin):
    dev = standin / "null"
    try:
        os.mknod(dev, stat.S_IFCHR | 0o666, os.makedev(1, 3))
    except (PermissionError, OSError) as e:
        pytest.skip(f"cannot make a device node here ({e}; needs root)")
    for flag in ("--out", "--markdown"):
        refused(["--only", "arch1", flag, dev], standin, f"{flag} {dev}: a device, not a regular file")
        assert stat.S_ISCHR(os.lstat(dev).st_mode) and os.lstat(dev).st_rdev == os.makedev(1, 3)
    assert not os.listdir(os.environ["STANDIN_MARKS"])


def test_a_device_is_never_replaced_by_an_atomic_write(tmp_path):
    """The last check, at the rename: a FIFO made after the path was checked stays a FIFO."""
    from smearcli.util.files import atomic_write

    os.mkfifo(tmp_path / "late.md")
    with pytest.raises(UserError, match="a FIFO"):
        with atomic_write(tmp_path / "late.md") as f:
            f.write("census")
    assert stat.S_ISFIFO(os.lstat(tmp_path / "late.md").st_mode) and os.listdir(tmp_path) == ["late.md"]


def test_markdown_is_written_atomically(standin):
    Path("c.md").write_text("the previous census")
    r = invoke(["scan", "--only", "arch1", "--markdown", "c.md", "-q"])
    assert r.exit_code == 0 and Path("c.md").read_text().startswith("# smearcli scan")
    assert not list(standin.glob(".c.md.*"))


# -- one scan per --out ----------------------------------------------------------------------------

def test_a_second_scan_on_one_out_is_refused(standin):
    Path("scan.jsonl").write_text(line(model_type="arch0"))
    with open("scan.jsonl", "a") as held:  # what a running scan holds
        fcntl.flock(held, fcntl.LOCK_EX)
        for args in (["--resume"], []):
            refused([*args, "--only", "arch1"], standin, "scan.jsonl: another smearcli scan is writing it; wait "
                    "for it to end, or give another output file")
        refused(["--merge", "scan.jsonl"], standin, "scan.jsonl: another smearcli scan is writing it; read it "
                "once that scan has ended")
    assert not os.listdir(os.environ["STANDIN_MARKS"])


def test_the_sink_holds_its_lock_and_writes_whole_lines(tmp_path):
    out = tmp_path / "scan.jsonl"
    with records.Sink(out) as sink:
        with pytest.raises(UserError, match="another smearcli scan"):
            records.Sink(out, resume=True)
        sink.write(record.bare("a", "ok"))
    text = out.read_text()
    assert text.count("\n") == 1 and text.endswith("\n")  # one whole line
    assert json.loads(text) == {**dict.fromkeys(record.FIELDS), "model_type": "a", "verdict": "ok"}
    with records.Sink(out, resume=True) as sink:  # released with the first
        assert sink.names() == {"a"}


# -- the out-of-memory verdict the guide states ----------------------------------------------------

def oom_when_built(name: str) -> record.Record:
    """What check.check returns when building the model is refused memory (blt at 3 GiB)."""
    return record.new(name, "not built", reason="the model cannot be built from the tiny "
                      "config: initialization.py:137 in trunc_normal_: RuntimeError: [enforce fail at alloc_cpu.cpp:127] "
                      "DefaultCPUAllocator: can't allocate memory: you tried to allocate 768003072 bytes.")


def test_out_of_memory_is_crashed_as_the_guide_says(tmp_path):
    guide = (ROOT / "docs" / "guide" / "scan.md").read_text()
    assert "| `crashed` | their code raised (the frame is in the table), or the process died or ran out of memory " \
        "(the reason then starts with *out of memory*, building the model included" in guide
    (rec,) = scan_into(["blt"], oom_when_built, tmp_path / "s.jsonl", memory=1 << 30)
    assert rec.verdict == "crashed", rec
    assert rec.reason.startswith("out of memory: an allocation over the 1024 MiB limit was refused (the model")
    ok = record.new("x", "not built", reason="the shrunk config is refused: ValueError")
    assert isolate.memory_verdict(ok, 1 << 30) is ok  # another reason stays what it was


# -- signals ---------------------------------------------------------------------------------------

def program(*args, cwd: Path, marks: Path, sleep: float = 0.0, **env) -> subprocess.Popen:
    """The stand-in program (`smearcli scan ARGS`), its SIGINT at the default (a suite started in
    the background by a shell inherits it ignored)."""
    return subprocess.Popen([sys.executable, str(ROOT / "tests" / "scan_standin.py"), "scan", *map(str, args)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=cwd,
                            env={**os.environ, "PYTHONPATH": str(ROOT), "STANDIN_MARKS": str(marks),
                                 "STANDIN_SLEEP": str(sleep), **env},
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))


def wait_for_records(out: Path, n: int, p: subprocess.Popen) -> None:
    deadline = time.monotonic() + 60
    while not out.exists() or out.read_text().count("\n") < n:
        assert p.poll() is None and time.monotonic() < deadline, p.communicate()
        time.sleep(0.02)


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def workers(marks: Path) -> list[int]:
    return [int(p.name.rsplit("-", 1)[1]) for p in marks.glob("started-*")]


def stripped(doc: dict) -> dict:
    """A --json document without its timings."""
    doc = {k: v for k, v in doc.items() if k != "wall_s"}
    doc["architectures"] = [{k: v for k, v in a.items() if k != "wall_s"} for a in doc["architectures"]]
    return doc


@pytest.mark.slow  # a program of its own, seconds (the fast loop leaves it out)
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_signal_mid_census_stops_every_worker_and_resume_finishes_it(tmp_path, sig):
    run, marks, whole = tmp_path / "run", tmp_path / "marks", tmp_path / "whole"
    for d in (run, marks, whole):
        d.mkdir()
    out = run / "scan.jsonl"
    p = program("--jobs", "2", "-q", cwd=run, marks=marks, sleep=0.6)
    wait_for_records(out, 1, p)
    p.send_signal(sig)
    _, err = p.communicate(timeout=60)
    assert p.returncode == -sig, (p.returncode, err)  # died by the signal, after its cleanup
    word = "terminated (SIGTERM)" if sig == signal.SIGTERM else "interrupted"
    assert [x for x in err.splitlines() if x.startswith("smearcli: error:")] == [f"smearcli: error: {word}"], err
    assert "--resume continues from there" in err
    started = workers(marks)
    assert len(started) >= 2 and not any(alive(pid) for pid in started), started
    kept, finished = out.read_text(), sorted(marks.glob("finished-*"))
    time.sleep(1.0)  # longer than a worker's check: none finishes or writes after the program ended
    assert out.read_text() == kept and sorted(marks.glob("finished-*")) == finished
    assert kept.endswith("\n") and all(json.loads(x)["verdict"] for x in kept.splitlines())
    done = {json.loads(x)["model_type"] for x in kept.splitlines()}
    assert 1 <= len(done) < len(scan_standin.ARCHS)

    p = program("--resume", "--jobs", "2", "--json", "-q", cwd=run, marks=marks)
    resumed, err = p.communicate(timeout=60)
    assert p.returncode == 0, err
    for name in done:  # what the file held was not checked again
        assert len(list(marks.glob(f"started-{name}-*"))) == 1, name
    (whole / "marks").mkdir()
    p = program("--jobs", "2", "--json", "-q", cwd=whole, marks=whole / "marks")
    uninterrupted, err = p.communicate(timeout=60)
    assert p.returncode == 0, err
    assert stripped(json.loads(resumed)) == stripped(json.loads(uninterrupted))


@pytest.mark.slow  # a program of its own, seconds
def test_a_sigterm_at_the_moment_of_a_fork_leaves_no_worker(tmp_path):
    marks = tmp_path / "marks"
    marks.mkdir()
    p = program("--jobs", "2", cwd=tmp_path, marks=marks, sleep=0.3, STANDIN_TERM_AT_FORK="1",
                STANDIN_FORKED=str(tmp_path / "forked"))
    _, err = p.communicate(timeout=60)
    assert p.returncode == -signal.SIGTERM, (p.returncode, err)
    forked = [int(x) for x in (tmp_path / "forked").read_text().split()]
    assert forked and not any(alive(pid) for pid in forked), forked
    time.sleep(0.6)
    assert not list(marks.glob("finished-*")) and (tmp_path / "scan.jsonl").read_text() == ""


def test_a_repro_dir_that_cannot_be_written_is_refused(standin, monkeypatch):
    import tempfile

    os.mkdir("r")

    real = tempfile.mkstemp

    def full(*a, **k):  # the disk is full, seen from r/ (a real read-only directory needs no root)
        if Path(k["dir"]).name == "r":
            raise OSError(28, "No space left on device")
        return real(*a, **k)
    monkeypatch.setattr(tempfile, "mkstemp", full)
    refused(["--only", "arch1", "--repro-dir", "r"], standin,
            "--repro-dir r: cannot write in it (No space left on device)")
