"""The `smearcli` command line. Thin by design: each command parses options, calls the library
and renders. Nothing heavy (torch, matplotlib) is imported until a command runs, so --help is fast.

Exit status: 0 ok, 1 a --check failure (or an internal error), 2 bad usage or input.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import sys
from typing import Annotated, Optional

import typer
from typer.core import TyperCommand, TyperGroup

from .. import __version__
from .commands.bench import bench
from .commands.compare import compare
from .commands.fix import fix
from .commands.plot import plot
from .commands.scan import scan
from .errors import (DEBUG, INTERRUPTED, PROGRAM, STOPPED_BY, TERMINATED, describe_unexpected, die_by_signal,
                     env_debug, print_error, stopped_by)


MAX_HELP_COLUMNS = 120  # the widest --help is laid out: rich pads every line to the width


def help_width(fixed: Optional[int] = None) -> Optional[int]:
    """The width --help is laid out at when the terminal (COLUMNS, or typer's TERMINAL_WIDTH as
    `fixed`) is wider than MAX_HELP_COLUMNS: COLUMNS=100000 made `scan --help` 2.6 MB of padding.
    None: the width rich picks itself."""
    cols = os.environ.get("COLUMNS", "").strip()
    width = fixed or (int(cols) if cols.isdigit() else shutil.get_terminal_size((80, 24)).columns)
    return MAX_HELP_COLUMNS if width > MAX_HELP_COLUMNS else None


class PlainFlags:
    """--help without a `<bool>` type on plain flags (--json, --check, -h): a flag takes no value;
    laid out at most MAX_HELP_COLUMNS wide (`help_width`), for every command and the group."""

    def get_params(self, ctx):
        params = super().get_params(ctx)
        for p in params:
            if getattr(p, "is_flag", False) and p.metavar is None:
                p.metavar = ""
        return params

    def format_help(self, ctx, formatter):
        from typer import rich_utils

        fixed = rich_utils.MAX_WIDTH  # TERMINAL_WIDTH, when set
        width = help_width(fixed)
        if width is None:
            return super().format_help(ctx, formatter)
        rich_utils.MAX_WIDTH = width
        try:
            return super().format_help(ctx, formatter)
        finally:
            rich_utils.MAX_WIDTH = fixed


class Command(PlainFlags, TyperCommand):
    pass


MIN_COLUMNS = 40


def clamp_columns() -> None:
    """COLUMNS below MIN_COLUMNS (COLUMNS=0 made --help print one blank line) raised to it: rich
    lays out --help and the tables at that width."""
    cols = os.environ.get("COLUMNS", "").strip()
    if cols.isdigit() and int(cols) < MIN_COLUMNS:
        os.environ["COLUMNS"] = str(MIN_COLUMNS)


class OneLineErrors(PlainFlags, TyperGroup):
    """Usage errors (unknown option, bad value) as one line on stderr with exit status 2, like
    every other user error, instead of a multi-line panel."""

    def main(self, args=None, prog_name=None, complete_var=None, standalone_mode=True, **extra):
        clamp_columns()
        if not standalone_mode:
            return super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
        try:
            rv = super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
        except typer.Exit as e:
            sys.exit(e.exit_code)
        except typer.Abort as e:
            if isinstance(e.__cause__, KeyboardInterrupt):  # click's word for a Ctrl-C while it parsed
                sys.exit(stopped_by(signal.SIGINT, "aborted", INTERRUPTED).exit_code)
            print_error("aborted")
            sys.exit(INTERRUPTED)
        except typer.TyperException as e:  # click's UsageError / BadParameter and kin
            if not e.format_message():  # no arguments at all: the help was printed
                sys.exit(0)
            ctx = getattr(e, "ctx", None)
            hint = f" (see '{ctx.command_path} --help')" if ctx is not None else ""
            print_error(f"{e.format_message()}{hint}")
            sys.exit(getattr(e, "exit_code", 2))
        except Exception as e:  # raised outside a command's own guard: still one line
            if DEBUG["on"]:
                raise
            msg, status = describe_unexpected(e)
            print_error(msg)
            sys.exit(status)
        sys.exit(rv if isinstance(rv, int) else 0)


app = typer.Typer(
    name="smearcli",
    cls=OneLineErrors,
    help="Show, measure and check nanochat's chunked-prefill token-smearing bug (issue #756): "
         "run a model under full forward, cached prefill, decode, chunked prefill, engine expansion "
         "and speculative verification, with the old and the fixed smear logic.",
    no_args_is_help=True,
    add_completion=True,  # --install-completion / --show-completion for bash, zsh, fish, PowerShell
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"smearcli {__version__}")
        raise typer.Exit()


@app.callback()
def main(
    debug: Annotated[bool, typer.Option("--debug", help="Show full tracebacks instead of one-line "
                     "errors (for bug reports; also SMEARCLI_DEBUG=1).")] = False,
    version: Annotated[bool, typer.Option("--version", callback=_version, is_eager=True,
                       help="Print the version and exit.")] = False,
) -> None:
    DEBUG["on"] = debug or env_debug()  # per invocation: a test's --debug must not leak into the next
    from .streams import escape_unprintable

    escape_unprintable(sys.stdout)  # LC_ALL=C: an ASCII stdout, and tables that print "Δ"


app.command(cls=Command, short_help="Every schedule, old and fixed smear logic, against the full "
            "forward pass; a one-line verdict.")(compare)
app.command(cls=Command, short_help="A figure of where the smear bug is born and how far it spreads.")(plot)
app.command(cls=Command, short_help="What the fixed smear and each schedule cost on this machine.")(bench)
app.command(cls=Command, short_help="A census of every causal LM in transformers: tiny configs, fuzzed "
            "split points, live state, the error's shape, a reproducer per finding.")(scan)
app.command(cls=Command, short_help="The patch that fixes the smear in your nanochat checkout: print it, or apply it.")(fix)


def run() -> None:
    """The `smearcli` program: a SIGTERM becomes an exception (files.Terminated), so that output
    being written is cleaned up as on Ctrl-C (and scan's workers stopped); then the program dies by
    the signal that stopped it, SIGTERM or SIGINT (a shell reports 143 or 130, Python's subprocess
    -15 or -2), so whoever started it knows it did not choose to exit."""
    from ..util.files import Terminated, on_sigterm

    PROGRAM["own_process"] = True
    STOPPED_BY["signal"] = None
    with contextlib.suppress(ValueError, OSError):  # not the main thread, or no SIGTERM here
        signal.signal(signal.SIGTERM, on_sigterm)
    try:
        app(prog_name="smearcli")
    except Terminated:  # outside a command (its guard reports it there)
        sys.exit(stopped_by(signal.SIGTERM, "terminated (SIGTERM)", TERMINATED).exit_code)
    except KeyboardInterrupt:  # likewise, before click or a command's guard could see it
        sys.exit(stopped_by(signal.SIGINT, "interrupted", INTERRUPTED).exit_code)
    finally:
        die_by_signal()
