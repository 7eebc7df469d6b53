"""Errors a user can act on, and the one place the CLI turns them into exit statuses.

Exit status: 0 ok, 1 a `--check` failure or an internal error, 2 bad usage or input."""

from __future__ import annotations

import functools
import os
import sys


class UserError(Exception):
    """Bad input or usage: the message names the problem and what to do about it."""


class CheckFailed(Exception):
    """`--check` found a run outside tolerance (exit status 1)."""


DEBUG = {"on": os.environ.get("SMEARCLI_DEBUG", "") not in ("", "0")}


def print_error(msg: str) -> None:
    sys.stderr.write(f"smearcli: error: {msg}\n")


def guarded(fn):
    """Wrap a command: user errors become one line on stderr and an exit status, never a
    traceback (unless --debug or SMEARCLI_DEBUG=1)."""
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        import typer

        try:
            return fn(*args, **kwargs)
        except typer.Exit:
            raise
        except UserError as e:
            if DEBUG["on"]:
                raise
            print_error(str(e))
            raise typer.Exit(2) from None
        except CheckFailed as e:
            print_error(f"check failed: {e}")
            raise typer.Exit(1) from None
        except KeyboardInterrupt:
            print_error("interrupted")
            raise typer.Exit(130) from None
        except Exception as e:  # noqa: BLE001 - last line of defence: no raw tracebacks
            if DEBUG["on"]:
                raise
            print_error(f"internal error ({type(e).__name__}: {e}); this is a bug in smearcli: "
                        "rerun with --debug and report the traceback")
            raise typer.Exit(1) from None
    return wrapper
