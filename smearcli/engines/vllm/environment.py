"""vLLM's environment, checked before any model loads: `hello(python)` runs the worker's
handshake (`worker.py hello`) in the interpreter `--vllm-python` names, with its output and
time capped, and refuses, in one line naming `scripts/make_env.sh vllm DIR`, a path that is missing,
a directory, not a Python, a Python that hangs, prints something else, speaks another protocol or
has no vLLM. `worker_env` (with `foreign.runnable`) is how the adapter (`smearcli.engines.vllm`) then
starts it.
What every engine in its own Python shares is `smearcli.impls.foreign`; vLLM's is `ENGINE` and the
check that vLLM is there.
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

from ...util.errors import UserError
from ...impls import foreign

PROTOCOL = 2  # the worker's protocol: its handshake and result.json carry it
RAISED = "raised"  # the worker's outcome for a schedule vLLM raised in: read as schedules.CRASHED
WORKER = Path(__file__).with_name("worker.py")
MAKE_ENV = "make vLLM's environment with scripts/make_env.sh vllm DIR and give DIR/bin/python"
ENGINE = foreign.Foreign("smearcli-vllm", "vLLM", PROTOCOL, MAKE_ENV,
                         directory_hint=" (vLLM's environment is made with scripts/make_env.sh vllm DIR)",
                         env={"VLLM_ENABLE_V1_MULTIPROCESSING": "0"})
HELLO_TIMEOUT_S = foreign.HELLO_TIMEOUT_S  # here, so that a test can shorten vLLM's alone



def worker_env(s_env: Optional[dict] = None) -> dict:
    return foreign.worker_env(ENGINE, s_env)


def hello(python: str, worker: str = str(WORKER), env: Optional[dict] = None,
          timeout: Optional[float] = None) -> dict:
    """The worker's handshake under `python`: {"worker": "smearcli-vllm", "protocol", "python",
    "vllm"}, checked before any model is loaded. A Python that is not one, hangs, prints something
    else, speaks another protocol or has no vLLM is the user's setup: UserError (exit 2), saying
    what to run."""
    answer = foreign.handshake(ENGINE, python, worker, env, HELLO_TIMEOUT_S if timeout is None else timeout)
    if not answer.get("vllm"):
        raise UserError(f"{python}: Python {answer.get('python', '?')} without vLLM (no module named vllm); "
                        f"{MAKE_ENV}")
    return answer

