"""Running the user's own code (the nanochat checkout they point smearcli at): their failures are
reported as theirs, with the file:line of their frame; their output goes to stderr (stdout carries
only our output, e.g. `--json`); and every call into their code has a time limit.

smearcli trusts that code as the user does (it runs it), but not to behave: an exception (any
BaseException), a `sys.exit()`, an `os._exit()`, a KeyboardInterrupt it raises itself, or an endless
loop in it must end the run with one line that blames the right party. While their code runs
(`user_code`):

* stdout is redirected to stderr twice over: `sys.stdout` (their prints) and file descriptor 1
  (a child process they start, a C extension writing to fd 1);
* `os._exit` raises instead of ending the process, so the failure is reported (a call through
  another name, `posix._exit`, is not caught);
* the working directory is restored afterwards (a checkout that calls os.chdir would otherwise
  move where relative output paths land);
* a KeyboardInterrupt counts as the user's Ctrl-C only when a SIGINT arrived; otherwise their code
  raised it;
* a `files.Terminated` (our SIGTERM) passes through untouched.

The time limit has two parts. A watchdog on SIGALRM (`signal.setitimer`) raises TimeUp in the
main thread's Python code, and again every second if their code swallows it: the run ends with
their file:line and a clean unwinding. It cannot interrupt one long C call, and code that ignores
SIGALRM or cancels the timer defeats it; so a watchdog thread also waits `timeout + GRACE` seconds
and, if the call is still running, writes one line naming the file:line the main thread is at and
ends the process with exit status 1 (the real os._exit: no cleanup is owed, nothing of ours is
being written while their code runs). The thread also covers platforms without SIGALRM and calls
off the main thread.
"""

from __future__ import annotations

import contextlib
import math
import os
import signal
import sys
import threading
import time
import traceback
from pathlib import Path

from ...util import frames
from ...util.errors import UserCodeError, UserError
from ...util.files import Terminated
from ...util.defaults import USER_CODE_TIMEOUT

DEFAULT_TIMEOUT = USER_CODE_TIMEOUT  # seconds per call into the user's code (defaults.py)
MAX_TIMEOUT = 1e6
GRACE = 2.0  # seconds after the time limit before the watchdog thread ends the process
REAL_EXIT = os._exit


class TimeUp(BaseException):
    """Raised by the watchdog inside the user's code (a BaseException: `except Exception` in their
    code does not swallow it)."""


class ExitCalled(BaseException):
    """Raised in place of os._exit(code) while the user's code runs."""

    def __init__(self, code):
        super().__init__(code)
        self.code = code


_depth = [0]  # user_code blocks open (os._exit is replaced while > 0)


def _exit_in_their_code(code=0):
    if _depth[0] > 0:
        raise ExitCalled(code)
    REAL_EXIT(code)


def can_time_out() -> bool:
    """Whether `time_limit` can enforce a limit here (POSIX, main thread)."""
    return hasattr(signal, "setitimer") and threading.current_thread() is threading.main_thread()


@contextlib.contextmanager
def time_limit(seconds: float):
    """Raise TimeUp in the block after `seconds` (and every second after that); a no-op where
    `can_time_out()` is False. A timer that was already set is restored (less the time spent)."""
    if not can_time_out() or not 0 < seconds < math.inf:
        yield
        return

    def ring(signum, frame):
        raise TimeUp()

    old_handler = signal.signal(signal.SIGALRM, ring)
    old_delay, old_interval = signal.setitimer(signal.ITIMER_REAL, seconds, 1.0)
    start = time.monotonic()
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old_handler)
        if old_delay > 0:
            left = max(old_delay - (time.monotonic() - start), 1e-3)
            signal.setitimer(signal.ITIMER_REAL, left, old_interval)


def _innermost(found, root: Path) -> str:
    return frames.innermost(found, frames.under(root)) or ""


@contextlib.contextmanager
def return_line(fn):
    """Note where `fn` returns while the block runs: yields a list that then holds the
    (filename, line) of its last return. A wrong return value has no traceback to point at, so
    this is how its failure names their file:line like every other. A profile function, this
    thread only, and only while the block runs; one that was set already is restored after."""
    import inspect

    code = getattr(inspect.unwrap(fn), "__code__", None)
    seen: list = []
    if code is None:  # not a Python function: nothing to watch
        yield seen
        return
    previous = sys.getprofile()

    def note(frame, event, arg):
        if event == "return" and frame.f_code is code:
            seen[:] = [(code.co_filename, frame.f_lineno)]
    sys.setprofile(note)
    try:
        yield seen
    finally:
        sys.setprofile(previous)


def returned_at(seen: list, root: Path) -> str:
    """The file:line `return_line` noted, relative to the checkout at `root`; "" when none was
    noted or it is outside the checkout."""
    if not seen:
        return ""
    filename, line = seen[-1]
    return _innermost([traceback.FrameSummary(filename, line, "")], Path(root))


def their_frame(e: BaseException, root: Path) -> str:
    """file:line of the innermost frame of the traceback inside the checkout at `root` (relative
    to it), or "" when no frame is theirs."""
    return _innermost(frames.frames(e), Path(root))


@contextlib.contextmanager
def _watchdog(seconds: float, root: Path, what: str):
    """End the process (status 1, one line on stderr) if the block outlives `seconds` + GRACE."""
    if not 0 < seconds < math.inf:
        yield
        return
    done, target = threading.Event(), threading.get_ident()

    def watch():
        if done.wait(seconds + GRACE):
            return
        frame = sys._current_frames().get(target)
        where = _innermost(traceback.extract_stack(frame), root) if frame is not None else ""
        line = (f"smearcli: error: your nanochat code: {what} did not finish within {seconds:g} s and did "
                f"not stop when interrupted{f' (it was at {where})' if where else ''}: the process was ended "
                f"(code that ignores SIGALRM, or one C call longer than the time limit)\n")
        with contextlib.suppress(Exception):
            sys.stderr.flush()
        with contextlib.suppress(OSError):
            os.write(2, line.encode("utf-8", "replace"))
        REAL_EXIT(1)

    threading.Thread(target=watch, name="smearcli-user-code-watchdog", daemon=True).start()
    try:
        yield
    finally:
        done.set()


@contextlib.contextmanager
def _fd1_to_stderr():
    """File descriptor 1 pointed at stderr's (what a child process or C code writes to stdout)."""
    with contextlib.suppress(Exception):
        sys.stdout.flush()  # ours, written before their code runs, stays on stdout
    try:
        saved = os.dup(1)
    except OSError:  # fd 1 closed: nothing to protect
        yield
        return
    try:
        os.dup2(2, 1)
    except OSError:
        os.close(saved)
        yield
        return
    try:
        yield
    finally:
        os.dup2(saved, 1)
        os.close(saved)


@contextlib.contextmanager
def _cwd_kept():
    """The working directory restored afterwards (by descriptor where possible: a renamed
    directory is still found)."""
    fd = None
    if hasattr(os, "fchdir"):
        with contextlib.suppress(OSError):
            fd = os.open(".", os.O_RDONLY)
    cwd = None
    if fd is None:
        with contextlib.suppress(OSError):
            cwd = os.getcwd()
    try:
        yield
    finally:
        with contextlib.suppress(OSError):
            if fd is not None:
                os.fchdir(fd)
            elif cwd is not None:
                os.chdir(cwd)
        if fd is not None:
            os.close(fd)


@contextlib.contextmanager
def _exit_caught():
    if _depth[0] == 0:
        os._exit = _exit_in_their_code
    _depth[0] += 1
    try:
        yield
    finally:
        _depth[0] -= 1
        if _depth[0] == 0:
            os._exit = REAL_EXIT


@contextlib.contextmanager
def _sigint_watched(sent: list):
    """Note in `sent` a SIGINT that arrives (the user's Ctrl-C), then handle it as before."""
    prev = None
    if threading.current_thread() is threading.main_thread():
        prev = signal.getsignal(signal.SIGINT)
    if not callable(prev):  # SIG_IGN, SIG_DFL: no KeyboardInterrupt comes from a signal
        sent.append(threading.current_thread() is not threading.main_thread())
        yield
        return

    def noted(signum, frame):
        sent.append(True)
        prev(signum, frame)

    signal.signal(signal.SIGINT, noted)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, prev)


@contextlib.contextmanager
def user_code(root: Path, what: str, timeout: float = DEFAULT_TIMEOUT):
    """Run the block as the user's code `what` ("importing nanochat", "GPT.forward"): stdout (and
    fd 1) redirected to stderr, the working directory restored afterwards, a time limit, and any
    failure (an exception, SystemExit, os._exit, the time limit) raised as a UserCodeError (exit
    status 1) that says it was their code and where (file:line relative to the checkout `root`,
    which the user named). A Ctrl-C stays a KeyboardInterrupt; a SIGTERM stays Terminated."""
    root = Path(root)
    sent: list = []
    try:
        with (_cwd_kept(), _fd1_to_stderr(), contextlib.redirect_stdout(sys.stderr), _exit_caught(),
              _sigint_watched(sent), _watchdog(timeout, root, what), time_limit(timeout)):
            yield
    except (UserError, Terminated):
        raise
    except TimeUp as e:
        where = their_frame(e, root)
        err = UserCodeError(f"your nanochat code: {what} did not finish within {timeout:g} s and was "
                            f"stopped{f' at {where}' if where else ''} (an endless loop, or slower than the time "
                            "limit for user code)")
        err.timed_out = True
        raise err from None
    except ExitCalled as e:
        where = their_frame(e, root)
        raise UserCodeError(f"your nanochat code: {what} called os._exit({e.code!r})"
                            f"{f' at {where}' if where else ''}; nothing was checked") from None
    except SystemExit as e:
        where = their_frame(e, root)
        raise UserCodeError(f"your nanochat code: {what} called sys.exit({e.code!r})"
                            f"{f' at {where}' if where else ''}; nothing was checked") from None
    except KeyboardInterrupt as e:
        if any(sent):  # the user's Ctrl-C
            raise
        where = their_frame(e, root)
        raise UserCodeError(f"your nanochat code: {what} raised KeyboardInterrupt itself (no Ctrl-C was "
                            f"pressed){f' at {where}' if where else ''}; nothing was checked") from None
    except BaseException as e:  # noqa: BLE001 - any failure inside their code is theirs
        where = their_frame(e, root)
        msg = " ".join(str(e).split())[:300]
        kind = "" if isinstance(e, Exception) else " (a BaseException, not an Exception)"
        raise UserCodeError(f"your nanochat code: {what} failed: {type(e).__name__}{kind}"
                            f"{f': {msg}' if msg else ''}{f' (at {where})' if where else ''}") from e
