"""llama.cpp's environment, checked before any model is converted or loaded: `hello(python)`
runs the worker's handshake (`worker.py hello`) in the interpreter `--llamacpp-python` names, with
its output and time capped, and refuses, in one line naming `scripts/make_env.sh llamacpp DIR`, a
path that is missing, a directory, not a Python, a Python that hangs, prints something else,
speaks another protocol, has no llama-cpp-python, another version of it than VERSION, or no
converter beside it. The refusal names what the handshake found. What every engine in its own
Python shares is `smearcli.impls.foreign`; llama.cpp's is `ENGINE` and the checks of what it needs.
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

from ...util.errors import UserError
from ...impls import foreign

PROTOCOL = 1  # the worker's protocol: its handshake and result.json carry it
VERSION = "0.3.36"  # the llama-cpp-python this smearcli's worker is written against (its low-level API)
WORKER = Path(__file__).with_name("worker.py")
MAKE_ENV = "make llama.cpp's environment with scripts/make_env.sh llamacpp DIR and give DIR/bin/python"
# GGML_NO_BACKTRACE: on an abort ggml attaches gdb to print a backtrace, seconds per crash (a census
# crashes it often); the assert's own `file.cpp:LINE` line, which is what a record keeps, comes before it
ENGINE = foreign.Foreign("smearcli-llamacpp", "llama.cpp", PROTOCOL, MAKE_ENV, env={"GGML_NO_BACKTRACE": "1"})
HELLO_TIMEOUT_S = foreign.HELLO_TIMEOUT_S  # here, so that a test can shorten llama.cpp's alone



def worker_env(extra: Optional[dict] = None) -> dict:
    return foreign.worker_env(ENGINE, extra)


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
    answer = foreign.handshake(ENGINE, python, worker, env, HELLO_TIMEOUT_S if timeout is None else timeout)
    if not answer.get("llama_cpp_python"):
        raise UserError(f"{python}: no llama-cpp-python there (found {found(answer)}); {MAKE_ENV}")
    if answer["llama_cpp_python"] != version:
        raise UserError(f"{python}: llama-cpp-python {answer['llama_cpp_python']}, and smearcli's worker is written "
                        f"against {version}'s low-level API (found {found(answer)}); {MAKE_ENV}")
    if not answer.get("converter"):
        raise UserError(f"{python}: llama-cpp-python {version} without llama.cpp's converter beside it "
                        f"(share/llamacpp-convert; found {found(answer)}); {MAKE_ENV}")
    return answer



ARCHS_LIMIT = 1 << 20  # bytes of `worker.py archs`' answer read: a few hundred names


def archs(python: str, worker: str = str(WORKER), env: Optional[dict] = None, timeout: float = 120.0) -> list:
    """The Hugging Face architectures llama.cpp's converter registers, as the worker answers
    `archs` in `python` (the converter's package imported there, no model module); UserError when
    the answer is not a list of names."""
    rc, out, err = foreign.run_capped(ENGINE, [foreign.runnable(python), worker, "archs"], worker_env(env), timeout,
                                      ARCHS_LIMIT)
    answer = foreign.handshake_line(ENGINE, out)
    got = answer.get("archs") if answer else None
    if rc != 0 or not isinstance(got, list) or not all(isinstance(a, str) for a in got):
        said = [ln for ln in (err or "").splitlines() if ln.strip()][-1:]
        why = "no answer in time" if rc is None else f"exit status {rc}" + (f": {foreign.one_line(said[0], 200)}"
                                                                           if said else "")
        raise UserError(f"{python}: llama.cpp's converter did not list its architectures ({why}); {MAKE_ENV}")
    return got

