"""llama.cpp's environment, checked before any model is converted or loaded: `check_python(python)`
runs the worker's handshake (`worker.py hello`) in the interpreter `--llamacpp-python` names, with
its output and time capped, and refuses, in one line naming `scripts/make_llamacpp_env.sh DIR`, a
path that is missing, a directory, not a Python, a Python that hangs, prints something else,
speaks another protocol, has no llama-cpp-python, another version of it than VERSION, or no
converter beside it. The refusal names what the handshake found.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import tempfile
from pathlib import Path
from typing import Optional

from ...errors import UserError

PROTOCOL = 1  # the worker's protocol: its handshake and result.json carry it
VERSION = "0.3.36"  # the llama-cpp-python this smearcli's worker is written against (its low-level API)
WORKER = Path(__file__).with_name("worker.py")
MAKE_ENV = "make llama.cpp's environment with scripts/make_llamacpp_env.sh DIR and give DIR/bin/python"
HELLO_TIMEOUT_S = 60.0
HELLO_LIMIT = 64 << 10


def _quote(text: str, n: int = 80) -> str:
    text = " ".join(text.split())
    return repr(text if len(text) <= n else text[:n] + "...")


def runnable(python: str) -> str:
    """A relative path is relative to the working directory, as every other path option is."""
    return os.path.abspath(python)


def worker_env(extra: Optional[dict] = None) -> dict:
    env = {**os.environ, "PYTHONNOUSERSITE": "1", **(extra or {})}
    env.pop("PYTHONPATH", None)  # our environment's packages must not shadow llama.cpp's
    return env


def check_path(python: str) -> None:
    p = Path(python)
    if p.is_dir():
        inside = p / "bin" / "python"
        hint = f"give {inside}, its Python" if inside.is_file() else MAKE_ENV
        raise UserError(f"{python}: a directory, not a Python interpreter; {hint}")
    if not p.exists():
        raise UserError(f"{python}: not found; {MAKE_ENV}")
    if not p.is_file() or not os.access(python, os.X_OK):
        raise UserError(f"{python}: not an executable file; {MAKE_ENV}")


def stop(p: subprocess.Popen) -> None:
    """Kill the process and its children (it runs in a session of its own)."""
    try:
        os.killpg(p.pid, signal.SIGKILL)
    except OSError:
        p.kill()
    p.wait()


def _run_capped(argv: list, env: dict, timeout: float) -> tuple[Optional[int], str, str]:
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        try:
            p = subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL, stdout=out, stderr=err,
                                 start_new_session=True)
        except OSError as e:
            raise UserError(f"cannot run it ({e.strerror or e}); {MAKE_ENV}") from None
        try:
            rc: Optional[int] = p.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            stop(p)
            rc = None
        texts = []
        for f in (out, err):
            f.seek(0)
            texts.append(f.read(HELLO_LIMIT).decode(errors="replace"))
    return rc, texts[0], texts[1]


def found(answer: dict) -> str:
    """What the handshake found, in words: "Python 3.11.7, llama-cpp-python 0.3.30, torch 2.13.0"."""
    parts = [f"Python {answer.get('python', '?')}"]
    for key, name in (("llama_cpp_python", "llama-cpp-python"), ("gguf", "gguf"), ("torch", "torch"),
                      ("transformers", "transformers")):
        parts.append(f"{name} {answer.get(key) or 'missing'}")
    return ", ".join(parts)


def hello(python: str, worker: str = str(WORKER), env: Optional[dict] = None,
          timeout: Optional[float] = None, version: str = VERSION) -> dict:
    """The worker's handshake under `python` (`worker.py hello`), checked; UserError (exit 2)
    naming what it found otherwise."""
    check_path(python)
    timeout = HELLO_TIMEOUT_S if timeout is None else timeout
    try:
        rc, out, err = _run_capped([runnable(python), worker, "hello"], worker_env(env), timeout)
    except UserError as e:
        raise UserError(f"{python}: {e}") from None
    if rc is None:
        raise UserError(f"{python}: no answer within {timeout:g} s to smearcli's handshake (it hangs at "
                        f"start-up); {MAKE_ENV}")
    answer = handshake_line(out)
    if answer is None:
        said = [ln for ln in (err or "").splitlines() if ln.strip()][-1:]
        if rc != 0:
            why = f"exited with status {rc}" + (f": {_quote(said[0])}" if said else " without output")
        elif out.strip():
            why = f"answered {_quote(out)}, not smearcli's handshake"
        else:
            why = "exited with status 0 without answering smearcli's handshake"
        raise UserError(f"{python}: not a Python that can run smearcli's llama.cpp worker ({why}); {MAKE_ENV}")
    if answer.get("protocol") != PROTOCOL:
        raise UserError(f"{python}: the worker it ran speaks protocol {answer.get('protocol')!r}, this smearcli "
                        f"{PROTOCOL} (not the worker this smearcli ships); {MAKE_ENV}")
    if not answer.get("llama_cpp_python"):
        raise UserError(f"{python}: no llama-cpp-python there (found {found(answer)}); {MAKE_ENV}")
    if answer["llama_cpp_python"] != version:
        raise UserError(f"{python}: llama-cpp-python {answer['llama_cpp_python']}, and smearcli's worker is written "
                        f"against {version}'s low-level API (found {found(answer)}); {MAKE_ENV}")
    if not answer.get("converter"):
        raise UserError(f"{python}: llama-cpp-python {version} without llama.cpp's converter beside it "
                        f"(share/llamacpp-convert; found {found(answer)}); {MAKE_ENV}")
    return answer


def handshake_line(out: str) -> Optional[dict]:
    for line in out.splitlines():
        try:
            d = json.loads(line, parse_constant=refuse)
        except (ValueError, RecursionError):
            continue
        if isinstance(d, dict) and d.get("worker") == "smearcli-llamacpp":
            return d
    return None


def refuse(token):
    raise ValueError(f"{token} is not JSON")


def check_python(python: str) -> dict:
    return hello(python)
