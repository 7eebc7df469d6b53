"""The `smearcli` command line. Thin by design: each command parses options, calls the library
and renders. Nothing heavy (torch, matplotlib) is imported until a command runs, so --help is fast.

Exit status: 0 ok, 1 a --check failure (or an internal error), 2 bad usage or input.
"""

from __future__ import annotations

from typing import Annotated

import typer

from . import __version__
from .commands.compare import compare
from .errors import DEBUG

app = typer.Typer(
    name="smearcli",
    help="Show, measure and check nanochat's chunked-prefill token-smearing bug (issue #756): "
         "run a model under full forward, cached prefill, decode, chunked prefill, engine expansion "
         "and speculative verification, with the old and the fixed smear logic.",
    no_args_is_help=True,
    add_completion=False,
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
    if debug:
        DEBUG["on"] = True


app.command()(compare)


def run() -> None:
    app(prog_name="smearcli")
