"""The census's llama.cpp fork server, from smearcli's side.

A census on llama.cpp runs a worker per architecture, and more for its reruns. Each fresh worker is
a Python that imports torch, llama.cpp's converter and its bindings before it converts a tiny model
in a fraction of a second: the imports were nearly all of the census's time. `Server` starts one
`worker.py serve SOCKET` in llama.cpp's environment for the whole census; `spawn(socket, ...)`
asks it for a worker, which it forks already past the imports (see `serve` in worker.py).

What a fresh process gave is kept: each worker is its own process in its own session (an abort
inside llama.cpp takes only it, and the watchdog and `spawn`'s timeout end it and whatever it
started), its stderr goes to a file of the caller's (only its tail is read), and a caller that is
stopped (Ctrl-C, its own timeout) kills the worker, as does the server's monitor when the caller's
connection drops. `spawn` answers as `foreign.spawn` does: (exit status or None past the timeout,
the tail of stderr), a negative status being the signal that ended the worker. A server that stops
answering as it should (gone, a worker it lost, words outside its protocol) raises `Gone`: the
caller forgets it (`forget`) and starts a fresh worker instead, as it does where none started.

The server is the census's: `Session` starts it and `close()` ends it (it also ends by itself when
the census that started it is gone: its stdin closes). A server that does not start in time is
no error: the census then starts a fresh worker each time, as `compare --impl llamacpp` does.
"""

from __future__ import annotations

import json
import os
import select
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from typing import Optional

from ...impls import foreign

RUNNING: dict = {}  # (python, worker) -> the server's socket: this process's and its forks'
READY_S = 120.0  # the server's imports (torch, the converter's model modules, llama.cpp): seconds, not minutes
SUN_PATH = 100  # bytes of a Unix socket's path that every system takes (Linux: 107, macOS: 103)
LINE_LIMIT = 4096  # bytes of one answer of the server: a short JSON line


class Gone(Exception):
    """The server no longer answers as it should: the census's own machinery, never the model's
    result nor the user's setup. Its text says what was seen."""


class Server:
    """`worker.py serve` in llama.cpp's environment; `path` is its socket (None: it did not start)."""

    def __init__(self, python: str, worker: str, env: dict):
        self.dir = tempfile.mkdtemp(prefix="smearcli-llamacpp-")
        if len(os.path.join(self.dir, "server").encode()) > SUN_PATH:  # a deep TMPDIR: a socket cannot live there
            os.rmdir(self.dir)
            self.dir = tempfile.mkdtemp(prefix="smearcli-llamacpp-", dir="/tmp")
        self.path: Optional[str] = os.path.join(self.dir, "server")
        self.why = ""
        self.err = tempfile.TemporaryFile()
        self.p = subprocess.Popen([foreign.runnable(python), worker, "serve", self.path], env=env,
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.err,
                                  start_new_session=True)
        got = read_line(self.p.stdout.fileno(), time.monotonic() + READY_S)
        try:
            ok = json.loads(got or b"").get("serving") == self.path
        except (ValueError, AttributeError):
            ok = False
        if not ok:
            self.why = "no answer in time" if got is None else f"it answered {foreign.one_line(repr(got), 120)}"
            self.close()
        else:
            self.key = (python, worker)
            RUNNING[self.key] = self.path

    def close(self) -> None:
        """End the server and whatever it has forked that still runs; remove its socket."""
        if RUNNING.get(getattr(self, "key", None)) == self.path:
            del RUNNING[self.key]
        if self.p.poll() is None:
            try:
                os.killpg(self.p.pid, signal.SIGKILL)
            except OSError:
                self.p.kill()
        self.p.wait()
        for f in (self.p.stdin, self.p.stdout, self.err):
            f.close()
        shutil.rmtree(self.dir, ignore_errors=True)
        self.path = None


def serving(python: str, worker: str, extra: Optional[dict]) -> Optional[str]:
    """The socket of the server started in this census for `python`'s `worker`, or None (a fresh
    worker then). A caller asking for variables of its own in the worker's environment (`extra`)
    gets a fresh worker: the server's was set when it started. A socket that is no longer there
    was forgotten by an architecture that found the server gone (`forget`)."""
    path = None if extra else RUNNING.get((python, worker))
    return path if path and os.path.exists(path) else None


def forget(path: str) -> None:
    """This process (and what it forks from now on) no longer asks the server at `path`, and nor
    does any other process of the census: its socket goes, so the census's later architectures
    start fresh workers without a word (the one that found it gone said so)."""
    for key in [k for k, v in RUNNING.items() if v == path]:
        del RUNNING[key]
    try:
        os.unlink(path)
    except OSError:
        pass


def read_line(fd: int, deadline: float, buf: Optional[bytearray] = None) -> Optional[bytes]:
    """One line from `fd` (without its newline), None at the deadline or at the end of the stream;
    at most LINE_LIMIT bytes are read. `buf` keeps what came after the line for the next call."""
    buf = bytearray() if buf is None else buf
    while b"\n" not in buf:
        left = deadline - time.monotonic()
        if left <= 0 or len(buf) > LINE_LIMIT:
            return None
        ready, _, _ = select.select([fd], [], [], left)
        if not ready:
            return None
        chunk = os.read(fd, LINE_LIMIT)
        if not chunk:
            return None
        buf += chunk
    line, _, rest = bytes(buf).partition(b"\n")
    buf[:] = rest
    return line


def spawn(path: str, request: str, outdir: str, timeout: float) -> tuple[Optional[int], str]:
    """The worker on `request` and `outdir`, forked by the server at `path`, run to its end:
    (its exit status, None past `timeout`; the tail of its stderr). `Gone` when the server
    does not answer as it should (`Gone`: it died, or lost the worker)."""
    with tempfile.TemporaryFile() as err, socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        try:
            s.connect(path)
            socket.send_fds(s, [json.dumps({"argv": [request, outdir], "cwd": os.getcwd()}).encode()],
                            [err.fileno()])
        except OSError as e:
            raise Gone(f"it is gone ({e.strerror or e})") from None
        deadline, buf, pid = time.monotonic() + max(timeout, 1.0), bytearray(), None
        try:
            first = read_line(s.fileno(), deadline, buf)
            pid = json.loads(first)["pid"] if first else None
            if not isinstance(pid, int):
                raise Gone("it did not start a worker")
            last = read_line(s.fileno(), deadline, buf)
            if last is None and time.monotonic() < deadline:
                raise Gone("it lost the worker it started")
            rc: Optional[int] = json.loads(last)["rc"] if last is not None else None
            if rc is None:  # past the timeout: the worker and its session go
                kill(pid)
        except (ValueError, KeyError, TypeError):
            kill(pid)
            raise Gone("it answered something else than its protocol") from None
        except BaseException:  # Ctrl-C, or the above: the worker goes with us
            kill(pid)
            raise
        size = err.seek(0, 2)
        err.seek(max(0, size - foreign.STDERR_TAIL))
        return rc, err.read().decode(errors="replace")


def kill(pid: Optional[int]) -> None:
    """The worker and its session (the worker itself too, should it not lead one yet)."""
    if pid is None:
        return
    for end in (os.killpg, os.kill):
        try:
            end(pid, signal.SIGKILL)
        except OSError:
            pass
