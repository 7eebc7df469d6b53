"""vLLM's environment, checked before any model loads: `check_python(python)` runs the worker's
handshake (`worker.py hello`) in the interpreter `--vllm-python` names, with its output and
time capped, and refuses, in one line naming `scripts/make_vllm_env.sh DIR`, a path that is missing,
a directory, not a Python, a Python that hangs, prints something else, speaks another protocol or
has no vLLM. `runnable` and `worker_env` are how the adapter (`smearcli.impls.vllm`) then starts it.
"""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
from pathlib import Path
from typing import Optional

from ...errors import UserError

PROTOCOL = 2  # the worker's protocol: its handshake and result.json carry it
RAISED = "raised"  # the worker's outcome for a schedule vLLM raised in: read as schedules.CRASHED
WORKER = Path(__file__).with_name("worker.py")
MAKE_ENV = "make vLLM's environment with scripts/make_vllm_env.sh DIR and give DIR/bin/python"
HELLO_TIMEOUT_S = 60.0  # the handshake imports nothing heavy: a Python that takes longer hangs
HELLO_LIMIT = 64 << 10  # bytes of the handshake's output read; the answer is one short line


def _quote(text: str, n: int = 80) -> str:
    text = " ".join(text.split())
    return repr(text if len(text) <= n else text[:n] + "...")


def check_path(python: str) -> None:
    """`python` names an executable file (not missing, not a directory): refused with what to run."""
    p = Path(python)
    if p.is_dir():
        inside = p / "bin" / "python"
        hint = (f"give {inside}, its Python (vLLM's environment is made with scripts/make_vllm_env.sh DIR)"
                if inside.is_file() else MAKE_ENV)
        raise UserError(f"{python}: a directory, not a Python interpreter; {hint}")
    if not p.exists():
        raise UserError(f"{python}: not found; {MAKE_ENV}")
    if not p.is_file() or not os.access(python, os.X_OK):
        raise UserError(f"{python}: not an executable file; {MAKE_ENV}")


def runnable(python: str) -> str:
    """The path to execute: a relative one is relative to the working directory, as every other
    path option is (a bare name given to exec would be looked up on $PATH instead)."""
    return os.path.abspath(python)


def worker_env(s_env: Optional[dict] = None) -> dict:
    env = {**os.environ, "VLLM_ENABLE_V1_MULTIPROCESSING": "0", "PYTHONNOUSERSITE": "1", **(s_env or {})}
    env.pop("PYTHONPATH", None)  # our environment's packages must not shadow vLLM's
    return env


def _run_capped(argv: list, env: dict, timeout: float, limit: int) -> tuple[Optional[int], str, str]:
    """(exit status or None past `timeout`, the first `limit` bytes of stdout and of stderr). The
    output goes to unlinked temporary files, so a child that floods it costs no memory here and
    leaves nothing on disk."""
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        try:
            p = subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL, stdout=out, stderr=err,
                                 start_new_session=True)  # its children are stopped with it
        except OSError as e:  # an executable the system cannot run (no #! line, wrong format)
            raise UserError(f"cannot run it ({e.strerror or e}); {MAKE_ENV}") from None
        try:
            rc: Optional[int] = p.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            _stop(p)
            rc = None
        texts = []
        for f in (out, err):
            f.seek(0)
            texts.append(f.read(limit).decode(errors="replace"))
    return rc, texts[0], texts[1]


def _stop(p: subprocess.Popen) -> None:
    import signal

    try:
        os.killpg(p.pid, signal.SIGKILL)  # its own session: the group is its and its children's
    except OSError:
        p.kill()
    p.wait()


def hello(python: str, worker: str = str(WORKER), env: Optional[dict] = None,
          timeout: Optional[float] = None) -> dict:
    """The worker's handshake under `python`: {"worker": "smearcli-vllm", "protocol", "python",
    "vllm"}, checked before any model is loaded. A Python that is not one, hangs, prints something
    else, speaks another protocol or has no vLLM is the user's setup: UserError (exit 2), saying
    what to run."""
    check_path(python)
    timeout = HELLO_TIMEOUT_S if timeout is None else timeout
    try:
        rc, out, err = _run_capped([runnable(python), worker, "hello"], worker_env(env), timeout, HELLO_LIMIT)
    except UserError as e:
        raise UserError(f"{python}: {e}") from None
    if rc is None:
        raise UserError(f"{python}: no answer within {timeout:g} s to smearcli's handshake (it hangs at "
                        f"start-up); {MAKE_ENV}")
    answer = _handshake_line(out)
    if answer is None:
        said = [ln for ln in (err or "").splitlines() if ln.strip()][-1:]
        if rc != 0:
            why = f"exited with status {rc}" + (f": {_quote(said[0])}" if said else " without output")
        elif out.strip():
            why = f"answered {_quote(out)}, not smearcli's handshake"
        else:
            why = "exited with status 0 without answering smearcli's handshake"
        raise UserError(f"{python}: not a Python that can run smearcli's vLLM worker ({why}); {MAKE_ENV}")
    if answer.get("protocol") != PROTOCOL:
        raise UserError(f"{python}: the worker it ran speaks protocol {answer.get('protocol')!r}, this smearcli "
                        f"{PROTOCOL} (not the worker this smearcli ships); {MAKE_ENV}")
    if not answer.get("vllm"):
        raise UserError(f"{python}: Python {answer.get('python', '?')} without vLLM (no module named vllm); "
                        f"{MAKE_ENV}")
    return answer


def _handshake_line(out: str) -> Optional[dict]:
    """The handshake among the output's lines (a sitecustomize may print before it), or None."""
    for line in out.splitlines():
        try:
            d = json.loads(line, parse_constant=refuse)
        except (ValueError, RecursionError):
            continue
        if isinstance(d, dict) and d.get("worker") == "smearcli-vllm":
            return d
    return None


def refuse(token):
    raise ValueError(f"{token} is not JSON")


def check_python(python: str) -> dict:
    """`python` is an interpreter whose worker answers the handshake; its answer."""
    return hello(python)


