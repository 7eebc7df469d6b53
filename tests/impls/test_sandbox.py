"""The user's checkout misbehaving under audit (smearcli.engines.nanochat.guard and sandbox): ways of
ending the run that are not exceptions (os._exit, a BaseException, their own KeyboardInterrupt),
results the comparison cannot use, side effects that would leak into our run (the working
directory, file descriptor 1, import hooks) and a forward that defeats the SIGALRM watchdog.

Each checkout is a copy of the test stand-in (tests/standin/old/) with a few lines added. Cases
that could end the test process if the guard failed (os._exit, the watchdog) run the CLI in a
subprocess."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from hardening_util import invoke
from smearcli.util.errors import UserError
from smearcli.engines.nanochat import sandbox
from conftest import ROOT  # noqa: E402 - the clone's root

STANDIN = Path(__file__).resolve().parents[1] / "standin" / "old"
AUDIT = ["compare", "--impl", "nanochat", "--depth", "1", "--seq-len", "12", "--chunks", "2",
         "--gen-len", "4", "--draft", "2", "--schedules", "chunked"]
FORWARD = "        B, T = idx.shape\n"
IMPORT = "import torch.nn.functional as F\n"
RETURN = "        return logits\n"


def standin(tmp_path: Path, old: str = "", new: str = "", name: str = "mine") -> Path:
    root = tmp_path / name
    shutil.copytree(STANDIN, root, ignore=shutil.ignore_patterns("__pycache__"))
    if old:
        p = root / "nanochat" / "gpt.py"
        text = p.read_text()
        assert text.count(old) == 1, old
        p.write_text(text.replace(old, new))
    return root


def line_of(root: Path, text: str) -> int:
    """The 1-based line of `text` in the checkout's gpt.py: where the failure must be named."""
    lines = (root / "nanochat" / "gpt.py").read_text().splitlines()
    return next(i for i, line in enumerate(lines, 1) if text in line)


def cli(*args, timeout: float = 120, env=None, **kwargs) -> subprocess.CompletedProcess:
    """The real program, in its own process (real file descriptors and signals)."""
    full_env = {**os.environ, "PYTHONPATH": str(ROOT), **(env or {})}
    return subprocess.run([sys.executable, "-m", "smearcli", *map(str, args)], capture_output=True,
                          text=True, timeout=timeout, env=full_env, **kwargs)


def error_lines(stderr: str) -> list:
    return [line for line in stderr.splitlines() if line.startswith("smearcli: error:")]


# -- their failures are theirs: exit 1, their file:line, nothing on stdout --------------------------

@pytest.mark.parametrize("old,new,marker,expect", [
    (FORWARD, FORWARD + "        class Boom(BaseException):\n            pass\n        raise Boom('big')\n",
     "raise Boom", "GPT.forward failed: Boom (a BaseException, not an Exception): big (at nanochat/gpt.py:{})"),
    (FORWARD, FORWARD + "        raise KeyboardInterrupt('mine')\n", "raise KeyboardInterrupt",
     "GPT.forward raised KeyboardInterrupt itself (no Ctrl-C was pressed) at nanochat/gpt.py:{}; nothing was checked"),
    # a wrong return value has no traceback: the line their forward returned at is named
    (RETURN, "        if kv_cache is not None:\n            logits = logits[..., :-1]\n" + RETURN, "return logits",
     "GPT.forward with a KVCache returned logits 255 wide at nanochat/gpt.py:{}, but its config's vocab_size is 256"),
    (FORWARD, FORWARD + "        return (idx, None)\n", "return (idx, None)",
     "GPT.forward returned a tuple at nanochat/gpt.py:{}, not logits of shape (batch, tokens, vocab) = (1, 12) + (vocab,)"),
], ids=["BaseException", "their KeyboardInterrupt", "cached logits too narrow", "a tuple"])
def test_failures_that_are_not_exceptions_are_theirs(tmp_path, old, new, marker, expect):
    root = standin(tmp_path, old, new)
    r = invoke([*AUDIT, "--nanochat-path", root, "--check", "--json"], allowed=(1,))
    where = line_of(root, marker) if marker else None
    assert error_lines(r.stderr) == [f"smearcli: error: your nanochat code: {expect.format(where)}"], r.stderr
    assert r.stdout == ""


@pytest.mark.parametrize("old,new,marker,what", [
    (FORWARD, FORWARD + "        import os; os._exit(0)\n", "os._exit", "GPT.forward"),
    (IMPORT, IMPORT + "import os\nos._exit(0)\n", "os._exit", "importing nanochat"),
], ids=["in forward", "at import"])
@pytest.mark.slow  # a subprocess of its own, seconds each (the fast loop leaves it out)
def test_os_exit_does_not_pass_a_check(tmp_path, old, new, marker, what):
    root = standin(tmp_path, old, new)
    r = cli(*AUDIT, "--nanochat-path", root, "--check", "--json")
    assert r.returncode == 1 and r.stdout == "", (r.returncode, r.stdout, r.stderr)
    assert error_lines(r.stderr) == [f"smearcli: error: your nanochat code: {what} called os._exit(0) at "
                                     f"nanochat/gpt.py:{line_of(root, marker)}; nothing was checked"]


@pytest.mark.slow  # a subprocess of its own, seconds each (the fast loop leaves it out)
def test_the_users_ctrl_c_stays_an_interruption(tmp_path):
    root = standin(tmp_path, FORWARD, FORWARD + "        import sys; sys.stderr.write('IN-FORWARD\\n')\n"
                   "        sys.stderr.flush()\n        while True:\n            pass\n")
    # SIGINT back to its default in the child: a suite started in the background by a shell
    # inherits it ignored, and Python then installs no KeyboardInterrupt handler at all
    p = subprocess.Popen([sys.executable, "-m", "smearcli", *AUDIT, "--nanochat-path", str(root)],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         env={**os.environ, "PYTHONPATH": str(ROOT)},
                         preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        while "IN-FORWARD" not in p.stderr.readline():
            assert p.poll() is None, "ended before the forward ran"
        p.send_signal(signal.SIGINT)
        out, err = p.communicate(timeout=60)
    finally:
        p.kill()
    # one line, then death by the SIGINT itself (a shell reports 130), as Python does on its own
    assert p.returncode == -signal.SIGINT and error_lines(err) == ["smearcli: error: interrupted"], err


def test_a_file_given_as_the_checkout_is_named_as_such(tmp_path):
    root = standin(tmp_path)
    with pytest.raises(UserError, match="gpt.py: not a directory; give the checkout"):
        sandbox.import_nanochat(root / "nanochat" / "gpt.py")


# -- nothing of theirs leaks into our run -----------------------------------------------------------

@pytest.mark.slow  # a subprocess of its own, seconds each (the fast loop leaves it out)
def test_a_chdir_at_import_does_not_move_the_output(tmp_path):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "runs.pt").write_bytes(b"someone else's file")
    root = standin(tmp_path, IMPORT, IMPORT + f"import os\nos.chdir({str(elsewhere)!r})\n")
    work = tmp_path / "work"
    work.mkdir()
    r = cli(*AUDIT, "--nanochat-path", root, "--save", "runs.pt", cwd=work)
    assert r.returncode == 0, r.stderr
    assert (elsewhere / "runs.pt").read_bytes() == b"someone else's file"
    assert (work / "runs.pt").stat().st_size > 0


def test_import_and_calls_restore_the_working_directory(tmp_path, monkeypatch):
    root = standin(tmp_path, FORWARD, FORWARD + f"        import os; os.chdir({str(tmp_path)!r})\n")
    (root / "nanochat" / "gpt.py").write_text((root / "nanochat" / "gpt.py").read_text().replace(
        IMPORT, IMPORT + f"import os\nos.chdir({str(root / 'nanochat')!r})\n"))
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    code = sandbox.import_nanochat(root)
    assert Path.cwd() == work
    from smearcli.gpt import weights
    from smearcli.engines.nanochat import adapter
    import torch
    theirs = adapter.nanochat_from_model(code, weights.random_model(weights.random_config(1), seed=0).model)
    theirs(torch.zeros(1, 3, dtype=torch.long))
    assert Path.cwd() == work
    time.sleep(0.05)  # each call's watchdog thread is woken and gone
    assert not [t for t in threading.enumerate() if t.name.startswith("smearcli-user-code-watchdog")]


@pytest.mark.slow  # a subprocess of its own, seconds each (the fast loop leaves it out)
def test_a_child_process_writing_to_fd_1_stays_off_the_json(tmp_path):
    root = standin(tmp_path, FORWARD, FORWARD + "        import subprocess; subprocess.run(['echo', 'CHILD-SAYS-HI'])\n")
    (root / "nanochat" / "gpt.py").write_text((root / "nanochat" / "gpt.py").read_text().replace(
        IMPORT, IMPORT + "import os\nos.system('echo IMPORT-SAYS-HI')\n"))
    r = cli(*AUDIT, "--nanochat-path", root, "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["schema"] == "smearcli.audit/1"  # stdout is the document alone
    assert "CHILD-SAYS-HI" in r.stderr and "IMPORT-SAYS-HI" in r.stderr


def test_an_import_hook_they_add_does_not_outlive_the_import(tmp_path):
    root = standin(tmp_path, IMPORT, IMPORT + "import sys\nclass Spy:\n    seen = []\n"
                   "    def find_spec(self, name, path=None, target=None):\n        Spy.seen.append(name)\n"
                   "        return None\nsys.meta_path.insert(0, Spy())\nsys.path_hooks.insert(0, lambda p: Spy())\n")
    meta, hooks, cache = list(sys.meta_path), list(sys.path_hooks), dict(sys.path_importer_cache)
    try:
        code = sandbox.import_nanochat(root)
        assert sys.meta_path == meta and sys.path_hooks == hooks
        spy = code.modules["nanochat.gpt"].Spy
        seen = len(spy.seen)
        import email.mime.text  # noqa: F401 - any import not yet done
        assert len(spy.seen) == seen
    finally:  # without the fix, the hooks would break every later import of this test process
        sys.meta_path[:], sys.path_hooks[:] = meta, hooks
        sys.path_importer_cache.clear()
        sys.path_importer_cache.update(cache)


# -- the time limit holds when SIGALRM does not ----------------------------------------------------

@pytest.mark.slow  # a subprocess of its own, seconds each (the fast loop leaves it out)
def test_a_forward_that_ignores_sigalrm_is_still_stopped(tmp_path):
    root = standin(tmp_path, FORWARD, FORWARD + "        import signal; signal.signal(signal.SIGALRM, signal.SIG_IGN)\n"
                   "        while True:\n            pass\n")
    t0 = time.monotonic()
    # 5 s, not 1: under load, building their GPT alone can take over a second (then the limit
    # stops the build, not the loop this test is about)
    r = cli(*AUDIT, "--nanochat-path", root, "--check", "--json", "--user-code-timeout", "5", timeout=90)
    took = time.monotonic() - t0
    assert r.returncode == 1 and r.stdout == "", (r.returncode, r.stderr)
    lines = error_lines(r.stderr)
    assert len(lines) == 1 and lines[0].startswith("smearcli: error: your nanochat code: GPT.forward did not "
                                                   "finish within 5 s"), r.stderr
    loop = line_of(root, "while True")
    assert any(f"(it was at nanochat/gpt.py:{n})" in lines[0] for n in (loop, loop + 1)), lines[0]
    assert took < 60

