"""Running the user's own code (the nanochat checkout they point smearcli at): their failures are
reported as theirs, with the file:line of their frame; their prints go to stderr (stdout carries
only our output, e.g. `--json`); and every call into their code has a time limit.

smearcli trusts that code as the user does (it runs it), but not to behave: an exception, a
`sys.exit()` or an endless loop in it must end the run with one line that blames the right party.

The time limit is a watchdog on SIGALRM (`signal.setitimer`): it interrupts Python code in the
main thread, and fires again every second if their code swallows the first interruption. It
cannot interrupt one long-running C call (a single huge matmul) until that call returns. Where
there is no SIGALRM (Windows) or the call is not on the main thread, no limit is enforced and
Ctrl-C is the way out.
"""

from __future__ import annotations

import contextlib
import math
import signal
import sys
import threading
import time
import traceback
from pathlib import Path

from ...errors import UserCodeError, UserError
from ...names import USER_CODE_TIMEOUT

DEFAULT_TIMEOUT = USER_CODE_TIMEOUT  # seconds per call into the user's code (names.py)
MAX_TIMEOUT = 1e6


class TimeUp(BaseException):
    """Raised by the watchdog inside the user's code (a BaseException: `except Exception` in their
    code does not swallow it)."""


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


def their_frame(e: BaseException, root: Path) -> str:
    """file:line of the innermost frame of the traceback inside the checkout at `root` (relative
    to it), or "" when no frame is theirs."""
    root = Path(root)
    found = ""
    for fr in traceback.extract_tb(e.__traceback__):
        try:
            rel = Path(fr.filename).resolve().relative_to(root)
        except (ValueError, OSError):
            continue
        found = f"{rel}:{fr.lineno}"
    return found


@contextlib.contextmanager
def user_code(root: Path, what: str, timeout: float = DEFAULT_TIMEOUT):
    """Run the block as the user's code `what` ("importing nanochat", "GPT.forward"): stdout
    redirected to stderr, a time limit, and any failure (an exception, SystemExit, the time limit)
    raised as a UserCodeError (exit status 1) that says it was their code and where (file:line
    relative to the checkout `root`, which the user named)."""
    try:
        with contextlib.redirect_stdout(sys.stderr), time_limit(timeout):
            yield
    except UserError:
        raise
    except TimeUp as e:
        where = their_frame(e, root)
        err = UserCodeError(f"your nanochat code: {what} did not finish within {timeout:g} s and was "
                            f"stopped{f' at {where}' if where else ''} (an endless loop, or slower than the time "
                            "limit for user code)")
        err.timed_out = True
        raise err from None
    except SystemExit as e:
        where = their_frame(e, root)
        raise UserCodeError(f"your nanochat code: {what} called sys.exit({e.code!r})"
                            f"{f' at {where}' if where else ''}; nothing was checked") from None
    except Exception as e:  # noqa: BLE001 - any failure inside their code is theirs
        where = their_frame(e, root)
        msg = " ".join(str(e).split())[:300]
        raise UserCodeError(f"your nanochat code: {what} failed: {type(e).__name__}: {msg}"
                            f"{f' (at {where})' if where else ''}") from e
