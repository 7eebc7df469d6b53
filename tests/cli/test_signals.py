"""Outputs under a SIGTERM and under a directory that goes away: no `.NAME.XXXX.tmp` is left beside
a `--save` or `plot --out` target (smearcli.util.files.atomic_write, the handler in smearcli.cli.app.run),
one line is printed and then the program dies by the signal itself (a parent sees -15, not an exit
status of 143 it could take for a choice; scan's: tests/census/test_scan_hardening.py), and a SIGTERM
during the user's code is not blamed on it; an output directory removed during the run is exit 2
and one line; a SIGTERM or Ctrl-C while an engine's worker starts (its handshake, vLLM's census
worker) stops that worker and removes its log."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from conftest import ROOT  # noqa: E402 - the clone's root
import pytest

from hardening_util import FAST, invoke, leftovers
import smearcli.util.files as files
from smearcli.util.errors import UserError

STANDIN = Path(__file__).resolve().parents[1] / "standin" / "old"

# the program, with a SIGTERM sent to itself at the moment atomic_write syncs the temporary file
# (the file exists, complete, not yet renamed): the worst moment to be stopped
TERM_WHILE_WRITING = """
import os, signal, sys
real = os.fsync
def fsync(fd):
    os.kill(os.getpid(), signal.SIGTERM)
    return real(fd)
os.fsync = fsync
sys.argv = ["smearcli", *sys.argv[1:]]
from smearcli.cli.app import run
run()
"""


def program(code: str, *args, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code, *map(str, args)], capture_output=True, text=True,
                          timeout=300, cwd=cwd, env={**os.environ, "PYTHONPATH": str(ROOT)})


def error_lines(stderr: str) -> list:
    return [line for line in stderr.splitlines() if line.startswith("smearcli: error:")]


@pytest.mark.parametrize("args,target", [
    (["compare", *FAST, "--save", "runs.pt"], "runs.pt"),
    (["plot", *FAST, "--out", "fig.png"], "fig.png"),
], ids=["compare --save", "plot --out"])
@pytest.mark.slow  # a subprocess of its own, seconds each (the fast loop leaves it out)
def test_sigterm_while_writing_leaves_no_temporary_file(tmp_path, args, target):
    if args[0] == "plot":
        pytest.importorskip("matplotlib")
    (tmp_path / target).write_bytes(b"the previous run's")
    r = program(TERM_WHILE_WRITING, *args, cwd=tmp_path)
    assert r.returncode == -signal.SIGTERM, (r.returncode, r.stderr)  # died by it, after cleaning up
    assert error_lines(r.stderr) == ["smearcli: error: terminated (SIGTERM)"], r.stderr
    assert not leftovers(tmp_path), leftovers(tmp_path)
    assert (tmp_path / target).read_bytes() == b"the previous run's"  # never half-replaced


@pytest.mark.slow  # a subprocess of its own, seconds each (the fast loop leaves it out)
def test_sigterm_during_their_code_is_not_their_failure(tmp_path):
    root = tmp_path / "mine"
    shutil.copytree(STANDIN, root)
    gpt = root / "nanochat" / "gpt.py"
    forward = "        B, T = idx.shape\n"
    gpt.write_text(gpt.read_text().replace(forward, forward + "        import sys; sys.stderr.write('IN-FORWARD\\n')\n"
                                           "        sys.stderr.flush()\n        while True:\n            pass\n"))
    p = subprocess.Popen([sys.executable, "-m", "smearcli", "compare", "--impl", "nanochat", "--depth", "1",
                          "--seq-len", "12", "--chunks", "2", "--schedules", "chunked", "--nanochat-path", str(root),
                          "--save", "runs.pt"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(ROOT)})
    try:
        while "IN-FORWARD" not in p.stderr.readline():
            assert p.poll() is None, "ended before the forward ran"
        p.send_signal(signal.SIGTERM)
        _, err = p.communicate(timeout=60)
    finally:
        p.kill()
    assert p.returncode == -signal.SIGTERM and error_lines(err) == ["smearcli: error: terminated (SIGTERM)"], err
    assert not (tmp_path / "runs.pt").exists() and not leftovers(tmp_path)


# -- the output directory goes away during the run -------------------------------------------------

@pytest.mark.parametrize("args", [["compare", *FAST, "--save"], ["plot", *FAST, "--out"]],
                         ids=["compare --save", "plot --out"])
def test_output_directory_removed_during_the_run(tmp_path, monkeypatch, args):
    if args[0] == "plot":
        pytest.importorskip("matplotlib")
    out = tmp_path / "out"
    out.mkdir()
    checked = files.check_output_path

    def check_then_remove(path, suffixes):  # the path was fine when checked, then someone removed it
        result = checked(path, suffixes)
        shutil.rmtree(out)
        return result
    monkeypatch.setattr(files, "check_output_path", check_then_remove)
    name = out / ("runs.pt" if args[0] == "compare" else "fig.png")
    r = invoke([*args, name], allowed=(2,))
    assert "no longer exists" in error_lines(r.stderr)[0], r.stderr


def test_directory_removed_after_the_temporary_file_was_made(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    with pytest.raises(UserError, match="no longer exists"):
        with files.atomic_write(out / "x.json") as f:
            f.write("{}")
            shutil.rmtree(out)
    with pytest.raises(FileNotFoundError):  # one of another file, the directory still there: itself
        with files.atomic_write(tmp_path / "y.json"):
            open(tmp_path / "missing")
    assert not (tmp_path / "y.json").exists() and not leftovers(tmp_path)


def test_in_process_a_sigterm_is_an_exit_status_never_a_kill(monkeypatch):
    """Only the program (app.run) dies by the signal: a caller running the CLI in its own process
    (this test, a notebook) gets the status a shell would report, 143, and lives on."""
    import smearcli.measure.compare as lib
    from smearcli.cli.errors import STOPPED_BY

    def stopped(*a, **k):
        raise files.Terminated()
    monkeypatch.setattr(lib, "compare", stopped)
    r = invoke(["compare", *FAST, "--schedules", "chunked"], allowed=(143,))
    assert error_lines(r.stderr) == ["smearcli: error: terminated (SIGTERM)"]
    assert STOPPED_BY["signal"] == signal.SIGTERM
    STOPPED_BY["signal"] = None


# -- what a stopped run started: an engine's worker, its log --------------------------------------

WAITS = "import os, sys, time\nopen(sys.argv[-1], 'w').write(str(os.getpid()))\ntime.sleep(60)\n"


def signal_when_started(pid_file: Path, sig: int, deadline: float = 20.0) -> threading.Thread:
    """A thread that sends `sig` to this process once the child has written its pid to `pid_file`."""
    def send():
        end = time.monotonic() + deadline
        while not (pid_file.exists() and pid_file.read_text()) and time.monotonic() < end:
            time.sleep(0.02)
        os.kill(os.getpid(), sig)
    t = threading.Thread(target=send, daemon=True)
    t.start()
    return t


def gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


def test_sigterm_while_a_handshake_hangs_stops_the_worker(tmp_path):
    """llama.cpp's (and vLLM's) handshake, `foreign.run_capped`, stopped by a SIGTERM (files.Terminated,
    as app.run turns it): the interpreter it started goes with it."""
    from smearcli.impls import foreign
    from smearcli.engines.llamacpp.environment import ENGINE

    script, pid_file = tmp_path / "hangs.py", tmp_path / "pid"
    script.write_text(WAITS)
    old = signal.signal(signal.SIGTERM, files.on_sigterm)
    try:
        signal_when_started(pid_file, signal.SIGTERM)
        with pytest.raises(files.Terminated):
            foreign.run_capped(ENGINE, [sys.executable, str(script), str(pid_file)], dict(os.environ), timeout=30.0)
    finally:
        signal.signal(signal.SIGTERM, old)
    pid = int(pid_file.read_text())
    try:
        assert gone(pid), "the worker's interpreter runs on"
    finally:
        if not gone(pid):
            os.kill(pid, signal.SIGKILL)


def test_ctrl_c_while_the_vllm_worker_starts_stops_it_and_removes_its_log(tmp_path):
    from smearcli.engines.vllm import serve

    script, pid_file = tmp_path / "starts.py", tmp_path / "pid"
    script.write_text(WAITS.replace("sys.argv[-1]", repr(str(pid_file))))  # never says ready
    w = serve.Worker(sys.executable, worker=str(script))
    old = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        signal_when_started(pid_file, signal.SIGINT)
        with pytest.raises(KeyboardInterrupt):
            w.start()
    finally:
        signal.signal(signal.SIGINT, old)
    pid = int(pid_file.read_text())
    try:
        assert gone(pid), "the vLLM worker runs on"
        assert not w.log.exists(), f"{w.log} left in TMPDIR"
    finally:
        if not gone(pid):
            os.kill(pid, signal.SIGKILL)
        w.log.unlink(missing_ok=True)
