"""An engine that runs in its own Python (vLLM, llama.cpp): what smearcli does on its side of the
subprocess, the same for every such engine. An engine describes itself once as a `Foreign` (the
name its worker answers the handshake with, its protocol, how messages name it, what to run to
make its environment) and gets from here:

- the interpreter's checks: `check_path` (missing, a directory, not executable) and `handshake`
  (the worker's `hello` run with its output and time capped; a Python that hangs, prints something
  else or speaks another protocol is refused in one line naming how to make the environment);
- how the worker is started: `runnable`, `worker_env` (without our PYTHONPATH), `spawn` (in a
  session of its own, with a time limit past which it and its children are killed, and the tail of
  its stderr kept in an unlinked file);
- its answer: `read_json` (result.json trusted once it is small, JSON and of the protocol),
  `check_entry` and `check_counts` (a schedule's fields), `garbage` (the refusal of an answer
  outside the protocol), `load_array` (an array file it wrote, bounded in size and checked in shape);
- `WholeSchedules`, the runner such an engine is: the worker called once, in a temporary folder,
  for every schedule of a comparison, the first time any of them is asked (`collect`).

The workers themselves (impls/*/worker*.py) run in the foreign Python and import none of this.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from ..util.errors import UserError
from ..measure.runner import Runner

HELLO_TIMEOUT_S = 60.0  # the handshake imports nothing heavy: a Python that takes longer hangs
HELLO_LIMIT = 64 << 10  # bytes of the handshake's output read; the answer is one short line
RESULT_LIMIT = 4 << 20  # bytes of result.json; a real one is a few kilobytes
MESSAGE_LIMIT = 2000  # characters of a schedule's message kept from the worker
STDERR_TAIL = 64 << 10  # bytes of a worker's stderr kept: where it says why it died


@dataclass(frozen=True)
class Foreign:
    worker: str  # the handshake's "worker": "smearcli-vllm"
    words: str  # how messages name the engine: "vLLM"
    protocol: int  # the worker's protocol: its handshake and result.json carry it
    make_env: str  # what to run for an environment: the end of every refusal of one
    directory_hint: str = ""  # added to "give DIR/bin/python, its Python" for a directory given as one
    env: dict = field(default_factory=dict)  # set for the worker before the caller's extra environment

    def garbage(self, python: str, what: str) -> UserError:
        """An answer outside the protocol: the environment's fault, not the model's."""
        return UserError(f"{python}: the {self.words} worker's answer is not smearcli's protocol {self.protocol} "
                         f"({what}); {self.make_env}, and rerun")


def quote(text: str, n: int = 80) -> str:
    text = " ".join(text.split())
    return repr(text if len(text) <= n else text[:n] + "...")


def one_line(text: str, limit: int = 300) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[:limit - 3] + "..."


def refuse(token):
    """`parse_constant` for json.loads: NaN and Infinity are not JSON."""
    raise ValueError(f"{token} is not JSON")


def check_path(engine: Foreign, python: str) -> None:
    """`python` names an executable file (not missing, not a directory): refused with what to run."""
    p = Path(python)
    if p.is_dir():
        inside = p / "bin" / "python"
        hint = f"give {inside}, its Python{engine.directory_hint}" if inside.is_file() else engine.make_env
        raise UserError(f"{python}: a directory, not a Python interpreter; {hint}")
    if not p.exists():
        raise UserError(f"{python}: not found; {engine.make_env}")
    if not p.is_file() or not os.access(python, os.X_OK):
        raise UserError(f"{python}: not an executable file; {engine.make_env}")


def runnable(python: str) -> str:
    """The path to execute: a relative one is relative to the working directory, as every other
    path option is (a bare name given to exec would be looked up on $PATH instead)."""
    return os.path.abspath(python)


def worker_env(engine: Foreign, extra: Optional[dict] = None) -> dict:
    env = {**os.environ, **engine.env, "PYTHONNOUSERSITE": "1", **(extra or {})}
    env.pop("PYTHONPATH", None)  # our environment's packages must not shadow the engine's
    return env


def entries(label: str, offered, schedules, params) -> list:
    """A worker request's schedules: each asked name with what `params(name)` adds for it (its
    sizes, its prefix). A name the engine does not run is a ValueError: the caller's mistake, since
    compare offers a runner only the schedules its capabilities declare."""
    out = []
    for name in schedules:
        if name not in offered:
            raise ValueError(f"{label} cannot run the {name} schedule")
        out.append({"name": name, **params(name)})
    return out


def stop(p: subprocess.Popen) -> None:
    """Kill the process and its children (it runs in a session of its own)."""
    try:
        os.killpg(p.pid, signal.SIGKILL)
    except OSError:
        p.kill()
    p.wait()


def run_capped(engine: Foreign, argv: list, env: dict, timeout: float,
               limit: int = HELLO_LIMIT) -> tuple[Optional[int], str, str]:
    """(exit status or None past `timeout`, the first `limit` bytes of stdout and of stderr). The
    output goes to unlinked temporary files, so a child that floods it costs no memory here and
    leaves nothing on disk."""
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        try:
            p = subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL, stdout=out, stderr=err,
                                 start_new_session=True)  # its children are stopped with it
        except OSError as e:  # an executable the system cannot run (no #! line, wrong format)
            raise UserError(f"cannot run it ({e.strerror or e}); {engine.make_env}") from None
        try:
            rc: Optional[int] = p.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            stop(p)
            rc = None
        except BaseException:  # Ctrl-C, or a SIGTERM turned into Terminated: the child goes with us
            stop(p)
            raise
        texts = []
        for f in (out, err):
            f.seek(0)
            texts.append(f.read(limit).decode(errors="replace"))
    return rc, texts[0], texts[1]


def handshake_line(engine: Foreign, out: str) -> Optional[dict]:
    """The handshake among the output's lines (a sitecustomize may print before it), or None."""
    for line in out.splitlines():
        try:
            d = json.loads(line, parse_constant=refuse)
        except (ValueError, RecursionError):
            continue
        if isinstance(d, dict) and d.get("worker") == engine.worker:
            return d
    return None


def handshake(engine: Foreign, python: str, worker: str, env: Optional[dict], timeout: float) -> dict:
    """The worker's `hello` under `python`, its answer checked as far as every engine's is: a
    Python that is not one, hangs, prints something else or speaks another protocol is the user's
    setup (UserError, exit 2, saying what to run). What the engine itself needs is the caller's."""
    check_path(engine, python)
    try:
        rc, out, err = run_capped(engine, [runnable(python), worker, "hello"], worker_env(engine, env), timeout)
    except UserError as e:
        raise UserError(f"{python}: {e}") from None
    if rc is None:
        raise UserError(f"{python}: no answer within {timeout:g} s to smearcli's handshake (it hangs at "
                        f"start-up); {engine.make_env}")
    answer = handshake_line(engine, out)
    if answer is None:
        said = [ln for ln in (err or "").splitlines() if ln.strip()][-1:]
        if rc != 0:
            why = f"exited with status {rc}" + (f": {quote(said[0])}" if said else " without output")
        elif out.strip():
            why = f"answered {quote(out)}, not smearcli's handshake"
        else:
            why = "exited with status 0 without answering smearcli's handshake"
        raise UserError(f"{python}: not a Python that can run smearcli's {engine.words} worker ({why}); "
                        f"{engine.make_env}")
    if answer.get("protocol") != engine.protocol:
        raise UserError(f"{python}: the worker it ran speaks protocol {answer.get('protocol')!r}, this smearcli "
                        f"{engine.protocol} (not the worker this smearcli ships); {engine.make_env}")
    return answer


def spawn(argv: list, env: dict, timeout: float, stdout=subprocess.DEVNULL) -> tuple[Optional[int], str]:
    """Run a worker to its end: (its exit status, None past `timeout`; the tail of its stderr). It
    runs in a session of its own, so a timeout, or Ctrl-C here, ends it and its children. Its
    stdout goes to `stdout` (nowhere by default); its stderr to an unlinked file, of which the last
    STDERR_TAIL bytes are read: a worker that floods either costs no memory here."""
    with tempfile.TemporaryFile() as err:
        p = subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL, stdout=stdout, stderr=err,
                             start_new_session=True)
        try:
            rc: Optional[int] = p.wait(timeout=max(timeout, 1.0))
        except subprocess.TimeoutExpired:
            stop(p)
            rc = None
        except BaseException:  # Ctrl-C: the worker goes with us
            stop(p)
            raise
        size = err.seek(0, 2)
        err.seek(max(0, size - STDERR_TAIL))
        return rc, err.read().decode(errors="replace")


def read_json(engine: Foreign, python: str, path: Path) -> dict:
    """result.json, trusted as far as being small, JSON and of the engine's protocol (its
    schedules are the caller's to check)."""
    size = path.stat().st_size
    if size > RESULT_LIMIT:
        raise engine.garbage(python, f"result.json is {size:,} bytes, over the {RESULT_LIMIT >> 20} MiB limit")
    try:
        res = json.loads(path.read_bytes().decode(), parse_constant=refuse)
    except (ValueError, UnicodeDecodeError, RecursionError) as e:
        raise engine.garbage(python, f"result.json is not JSON: {one_line(str(e))}") from None
    if not isinstance(res, dict) or res.get("protocol") != engine.protocol:
        got = res.get("protocol") if isinstance(res, dict) else type(res).__name__
        raise engine.garbage(python, f"result.json speaks protocol {got!r}")
    return res


def check_entry(engine: Foreign, python: str, e: dict, outcomes: tuple) -> None:
    """A schedule's entry: an outcome of `outcomes` (or none), a message of text (cut to one line of
    MESSAGE_LIMIT characters here), arrays that are .npy files beside result.json."""
    name = e["name"]
    if e.get("outcome") not in (None, *outcomes):
        raise engine.garbage(python, f"{name}: outcome {one_line(repr(e.get('outcome')))}")
    if not isinstance(e.get("message", ""), str):
        raise engine.garbage(python, f"{name}: a message that is not text")
    e["message"] = one_line(e.get("message", ""), MESSAGE_LIMIT)
    arrays = e.get("arrays") or {}
    if not isinstance(arrays, dict) or not all(
            isinstance(f, str) and f.endswith(".npy") and Path(f).name == f for f in arrays.values()):
        raise engine.garbage(python, f"{name}: arrays that are not .npy files beside result.json")


def check_counts(engine: Foreign, python: str, e: dict, keys: tuple) -> None:
    """Each of the entry's `keys`, where given, is a list of counts (ints >= 0)."""
    for key in keys:
        v = e.get(key)
        if v is not None and not (isinstance(v, list) and all(type(n) is int and n >= 0 for n in v)):
            raise engine.garbage(python, f"{e['name']}: {key} is not a list of counts")


def load_array(workdir: Path, name: str, shape: tuple, item_bytes: int = 4, why: str = ""):
    """The array a worker wrote to `workdir/name` as a float32 tensor: refused (ValueError) when
    the file holds more than `shape` items of `item_bytes` each (and a header) before it is read,
    or when its shape is not `shape` (`why`: what a wrong shape would mean, added to the message)."""
    import numpy as np
    import torch

    size, most = (workdir / name).stat().st_size, item_bytes * int(np.prod(shape)) + (1 << 16)
    if size > most:
        raise ValueError(f"{name}: {size:,} bytes, more than a {shape} array of {item_bytes}-byte items takes")
    a = np.load(workdir / name, allow_pickle=False)
    if a.shape != shape:
        raise ValueError(f"{name}: shape {a.shape}, expected {shape}" + (f" ({why})" if why else ""))
    return torch.from_numpy(a.astype(np.float32, copy=False))


class WholeSchedules(Runner):
    """A runner whose engine runs whole schedules in its worker: no forward of its own (the
    reference is another runner: `compare(..., reference=...)`). The first `run()` calls
    `collect(tokens, options, workdir)` once, in a temporary folder named `smearcli-{label}-...`, for every
    schedule of the comparison; it returns {schedule: RunResult or None}, and the folder is gone
    after it (what must outlive it, `collect` copies out). `words`: how messages name the engine."""

    words: str = "this engine"
    _runs: Optional[dict] = None  # {schedule: RunResult or None}, once the worker has run

    def collect(self, tokens, options, workdir: Path) -> dict:
        raise NotImplementedError

    def forward(self, tokens, capture):
        raise NotImplementedError(f"{self.words} runs whole schedules (run()); the reference is another runner")

    def run(self, schedule, tokens, options):
        if self._runs is None:
            with tempfile.TemporaryDirectory(prefix=f"smearcli-{self.label}-") as d:
                self._runs = self.collect(tokens, options, Path(d))
        if self._runs.get(schedule) is None:
            raise ValueError(f"{self.label} was not asked for the {schedule} schedule")
        return self._runs[schedule]
