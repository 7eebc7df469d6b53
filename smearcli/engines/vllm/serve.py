"""One vLLM process for a whole census (`smearcli scan --engine vllm`, `engines.vllm.session`): `Worker`.

Importing vLLM takes 15 to 30 seconds on two cores, longer than checking a tiny model, so the
census starts the worker (`smearcli/engines/vllm/worker.py serve`, in vLLM's environment) once and
sends it one model at a time; it starts that model's engines, runs its schedules and closes them.
Each architecture is still checked in its own forked process (`isolate`): that process writes
the job to the worker's stdin, waits for the answer line on its stdout, and stops the worker
itself when the answer does not come in time or the worker's resident memory passes the limit
(`ask`); a worker that dies, hangs or is stopped is started again before the next architecture
(`kill`, then `start`, by the census's vLLM session), so one model's crash is that model's record
and never the census's end.

A census imports vLLM once: where the worker's handshake offers it (`zygote`), the first start
also starts the worker's zygote (`worker.py zygote`),
a process that imports vLLM and then only forks, and every worker after it is a fork of the
zygote (`Forked`), ready in milliseconds and carrying no state of another model's engines: a
worker started again after a crash, a hang or an engine refused in a process that had served
others costs no import. Where the handshake offers none (an older worker) or the zygote does not
start (a Python whose vLLM cannot fork), each start imports vLLM in a fresh process, as before; the census's results do not
depend on which.

vLLM's own output (its logs, a crash's traceback) goes to a log file, whose last lines name a
worker that died. The time spent importing vLLM is summed in `import_s` (`imports` of them), for
the benchmark.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import select
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Optional

from ...util.errors import UserError
from ...impls import foreign
from ...impls.foreign import runnable
from .environment import MAKE_ENV, WORKER, worker_env

READY_TIMEOUT_S = 600.0  # vLLM's import: 15 to 30 s alone, minutes on a loaded machine
POLL_S = 0.2
LINE_LIMIT = foreign.RESULT_LIMIT  # bytes of one line from the worker; its answers are a few kilobytes


class WorkerGone(Exception):
    """The worker gave no answer: it died, ran past the time, or past the memory limit."""


def rss_bytes(pid: int) -> int:
    """Resident memory of a process (0 once it is gone)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) << 10
    except OSError:
        pass
    return 0


class Forked:
    """A worker the zygote forked, with the part of `subprocess.Popen`'s face the `Worker` uses
    (`pid`, `stdin`, `stdout`, `poll`, `wait`): one socket is its stdin and its stdout, its pid
    comes with its ready line, and the zygote, not this process, reaps it."""

    def __init__(self, sock: socket.socket):
        self.stdin = self.stdout = sock
        self.pid: Optional[int] = None

    def poll(self) -> Optional[int]:
        if self.pid is None:
            return None
        try:
            os.kill(self.pid, 0)
            with open(f"/proc/{self.pid}/stat") as f:  # a zombie is gone (Linux; elsewhere kill's answer)
                return 0 if f.read().rsplit(")", 1)[-1].split()[0] == "Z" else None
        except ProcessLookupError:
            return 0
        except OSError:
            return None

    def wait(self, timeout: Optional[float] = None) -> int:
        deadline = time.monotonic() + (timeout if timeout is not None else float("inf"))
        while self.poll() is None:
            if time.monotonic() > deadline:
                raise subprocess.TimeoutExpired(f"vLLM worker {self.pid}", timeout)
            time.sleep(0.05)
        return 0


class Worker:
    """vLLM's interpreter running `worker.py serve`: one process, started again when it is gone;
    after the first, a fork of the zygote where there is one."""

    def __init__(self, python: str, env: Optional[dict] = None, worker: str = str(WORKER), zygote: bool = False):
        """`zygote`: whether the worker offers its zygote mode (its handshake's `zygote`)."""
        self.python, self.env, self.worker = python, dict(env or {}), worker
        self.proc = None  # subprocess.Popen, or Forked
        self.log = Path(tempfile.mkstemp(prefix="smearcli-vllm-worker-", suffix=".log")[1])
        self.ready: dict = {}
        self.import_s = 0.0  # every import of vLLM (the zygote's, each fresh worker's), summed
        self.imports = 0
        self.starts = 0  # workers started, forks included
        self.served = 0  # models sent to the running worker (the census counts them)
        self.zygote: Optional[subprocess.Popen] = None
        self.ctrl: Optional[socket.socket] = None  # the zygote's control socket
        # why this census starts fresh workers instead (empty: the zygote is tried at the first start)
        self.no_zygote = "" if zygote else "its handshake offers no zygote"
        self._ids = itertools.count(1)
        self._buf = bytearray()

    def start(self, timeout: float = READY_TIMEOUT_S) -> dict:
        """Start the worker (a fork of the zygote, or a fresh process importing vLLM) and wait
        `timeout` seconds at most for its ready line; UserError when it exits first: the
        environment, not a model. However the wait ends short of ready (that UserError, Ctrl-C, a
        SIGTERM), the worker is stopped and its log removed."""
        t0 = time.monotonic()
        if self.zygote is None and not self.no_zygote:
            try:
                self._start_zygote(timeout)
            except BaseException:  # Ctrl-C, a SIGTERM: nothing of ours left behind, the log included
                self.close()
                raise
        self.proc = self._fork() if self.zygote is not None else None
        if self.proc is None:
            with open(self.log, "ab") as log:
                self.proc = subprocess.Popen([runnable(self.python), self.worker, "serve"], stdin=subprocess.PIPE,
                                             stdout=subprocess.PIPE, stderr=log, env=worker_env(self.env),
                                             start_new_session=True)
        self._buf = bytearray()
        try:
            self.ready = self._line(time.monotonic() + timeout, None, lambda d: d.get("ready"), timeout)
        except WorkerGone as e:
            self.close()
            raise UserError(f"{self.python}: vLLM's worker did not start ({e})") from None
        except BaseException:
            self.close()
            raise
        if isinstance(self.proc, Forked):
            self.proc.pid = int(self.ready.get("pid") or 0) or None
        else:
            self.imports += 1
            self.import_s += float(self.ready.get("import_s") or time.monotonic() - t0)
        self.starts += 1
        self.served = 0
        return self.ready

    def _start_zygote(self, timeout: float) -> None:
        """Start `worker.py zygote` and wait for its ready line (vLLM imported, counted as an
        import); where it does not come, `no_zygote` says why and each start is a fresh process."""
        mine, theirs = socket.socketpair()
        t0 = time.monotonic()
        try:
            with open(self.log, "ab") as log:
                self.zygote = subprocess.Popen([runnable(self.python), self.worker, "zygote", str(theirs.fileno())],
                                               stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=log,
                                               env=worker_env(self.env), start_new_session=True,
                                               pass_fds=[theirs.fileno()])
        finally:
            theirs.close()
        self.ctrl, buf = mine, b""
        deadline = time.monotonic() + timeout
        try:
            while b"\n" not in buf:
                left = deadline - time.monotonic()
                if left <= 0 or self.zygote.poll() is not None:
                    break
                if select.select([mine], [], [], min(POLL_S, left))[0]:
                    chunk = mine.recv(4096)
                    if not chunk:
                        break
                    buf += chunk
            ready = json.loads(buf.partition(b"\n")[0].decode() or "{}") if b"\n" in buf else {}
        except (OSError, ValueError):
            ready = {}
        except BaseException:
            self._stop_zygote()
            raise
        if not (isinstance(ready, dict) and ready.get("ready")):
            self._stop_zygote()
            self.no_zygote = "its zygote did not start"
            return
        self.imports += 1
        self.import_s += float(ready.get("import_s") or time.monotonic() - t0)

    def _fork(self) -> Optional[Forked]:
        """A worker forked by the zygote, serving on a new socket (None, and no zygote from now
        on, where the zygote is gone)."""
        mine, theirs = socket.socketpair()
        try:
            socket.send_fds(self.ctrl, [json.dumps({"log": str(self.log)}).encode()], [theirs.fileno()])
        except OSError:
            mine.close()
            self._stop_zygote()
            self.no_zygote = "its zygote is gone"
            return None
        finally:
            theirs.close()
        return Forked(mine)

    def _stop_zygote(self) -> None:
        if self.ctrl is not None:
            with contextlib.suppress(OSError):
                self.ctrl.close()
            self.ctrl = None
        if self.zygote is not None:
            foreign.stop(self.zygote)
            self.zygote = None

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill(self) -> None:
        """Stop the worker and all it started (its session), and reap it."""
        if self.proc is None:
            return
        with contextlib.suppress(OSError, TypeError):  # TypeError: a fork that never said its pid
            os.killpg(self.proc.pid, signal.SIGKILL)
        with contextlib.suppress(Exception):
            self.proc.wait(timeout=30)
        for f in (self.proc.stdin, self.proc.stdout):
            with contextlib.suppress(Exception):
                f.close()
        self.proc = None

    def close(self) -> None:
        """End of the census: stdin closed (the worker's loop ends), killed if it lingers (a
        model still running when the census was stopped)."""
        if self.proc is not None:
            with contextlib.suppress(Exception):
                self.proc.stdin.close()
                self.proc.wait(timeout=5)
        self.kill()
        self._stop_zygote()
        self.log.unlink(missing_ok=True)  # vLLM's output was read where a record needed it

    def tail(self, n: int = 1) -> list[str]:
        """The last `n` non-empty lines vLLM wrote to its log."""
        try:
            with open(self.log, "rb") as f:
                f.seek(max(0, os.fstat(f.fileno()).st_size - (64 << 10)))
                lines = f.read().decode(errors="replace").splitlines()
        except OSError:
            return []
        return [ln.strip() for ln in lines if ln.strip()][-n:]

    def ask(self, job: dict, timeout: float, memory: Optional[int] = None) -> dict:
        """Send one job and return its answer; WorkerGone (the worker stopped) when it dies, takes
        longer than `timeout` or its resident memory passes `memory` bytes."""
        job = {**job, "id": next(self._ids) + os.getpid() * 1000}  # unique across forked askers
        data = (json.dumps(job) + "\n").encode()
        try:
            os.write(self.proc.stdin.fileno(), data)
        except (OSError, AttributeError):
            raise WorkerGone(self.death()) from None
        return self._line(time.monotonic() + timeout, memory, lambda d: d.get("id") == job["id"], timeout)

    def death(self) -> str:
        last = self.tail(1)
        return "vLLM's worker died" + (f"; its last output: {last[0][:300]}" if last else " without output")

    def _line(self, deadline: float, memory: Optional[int], wanted, timeout: float = READY_TIMEOUT_S) -> dict:
        fd = self.proc.stdout.fileno()
        while True:
            while b"\n" in self._buf:
                raw, _, rest = bytes(self._buf).partition(b"\n")
                self._buf = bytearray(rest)
                with contextlib.suppress(ValueError):
                    d = json.loads(raw.decode(errors="replace"))
                    if isinstance(d, dict) and wanted(d):
                        return d
            if len(self._buf) > LINE_LIMIT:  # no newline in it: what is read stays capped
                self._stop()
                raise WorkerGone(f"vLLM's worker wrote more than {LINE_LIMIT >> 20} MiB without a newline, "
                                 "not an answer of smearcli's protocol")
            if time.monotonic() > deadline:
                self._stop()
                raise WorkerGone(f"timed out: vLLM gave no answer within {timeout:g} s (a hang, or too slow)")
            if memory and rss_bytes(self.proc.pid) > memory:
                self._stop()
                raise WorkerGone(f"out of memory: vLLM's worker passed the {memory >> 20} MiB limit")
            ready, _, _ = select.select([fd], [], [], POLL_S)
            if ready:
                chunk = os.read(fd, 1 << 16)
                if not chunk:
                    raise WorkerGone(self.death())
                self._buf.extend(chunk)

    def _stop(self) -> None:
        """Kill the worker from whichever process asked (a forked check may not reap it)."""
        with contextlib.suppress(OSError, TypeError):
            os.killpg(self.proc.pid, signal.SIGKILL)


def archs(worker: Worker, timeout: float = 120.0) -> list[str]:
    """The architectures vLLM's ModelRegistry supports, as the worker answers. A worker that stops
    before it answers (it died, hung or flooded its output) is the environment's failure: a UserError."""
    try:
        got = worker.ask({"op": "archs"}, timeout).get("archs")
    except WorkerGone as e:
        raise UserError(f"{worker.python}: vLLM's worker stopped before it listed the architectures it "
                        f"supports ({e}): its environment failed, not a model; {MAKE_ENV}") from None
    if not isinstance(got, list) or not all(isinstance(a, str) for a in got):
        raise UserError(f"{worker.python}: the vLLM worker's list of architectures is not a list of names")
    return got
