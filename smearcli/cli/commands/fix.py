"""`smearcli fix`: the patch for the chunk-boundary smear bug in a user's nanochat checkout.

The unified diff goes to stdout, alone (so `smearcli fix --nanochat-path . > fix.diff` is a patch
file); every message goes to stderr. The work is `smearcli.engines.nanochat.fix.apply_fix`.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer

from ...util.errors import UserError
from ..errors import guarded, print_error

DOCS = "docs/guide/fix.md"


def _run(nanochat_path: Path, write: bool) -> None:
    from ...engines.nanochat import fix as nf

    try:
        result = nf.apply_fix(nanochat_path, write=write)
    except nf.FixError as e:
        raise UserError(str(e)) from e
    if result.diff:
        sys.stdout.write(result.diff)
        sys.stdout.flush()

    def say(text: str) -> None:
        sys.stderr.write(f"smearcli: {text}\n")

    for note in result.notes:
        say(f"note: {note}")
    if result.status == nf.UNRECOGNISED:
        print_error(f"not fixed: {result.message}. See {DOCS} ('When fix changes nothing') for the shapes "
                    "it rewrites and what to change by hand")
        raise typer.Exit(1)
    say(result.message)
    if result.status == nf.FIXABLE:
        if result.written:
            done = ", ".join(f"{p.relative_to(result.root)} (backup {b.relative_to(result.root)})"
                             for p, b in zip(result.written, result.backups))
            say(f"wrote {done}; now audit again: smearcli compare --impl nanochat --nanochat-path "
                f"{nanochat_path} --check")
        else:
            say("nothing written; apply the diff above with git apply or patch -p1 from the checkout "
                "root, or rerun with --write")


@guarded(memory_hint="free some memory, or fix a smaller file by hand")
def fix(
    nanochat_path: Annotated[Path, typer.Option("--nanochat-path", help="A nanochat checkout (the directory "
                             "holding nanochat/gpt.py and nanochat/engine.py). Read, never imported.",
                             show_default=False)],
    write: Annotated[bool, typer.Option("--write", help="Apply the fix: each changed file is first copied "
                     "to <file>.orig (refused, nothing written, if that exists), then replaced atomically.")] = False,
) -> None:
    """Print the unified diff that fixes the chunk-boundary smear bug in your checkout's
    nanochat/gpt.py (found by the structure of the code, not by line numbers); --write applies it.
    The diff alone goes to stdout, messages to stderr.

    Exit status: 0 when the diff was printed (or written), or nothing needs fixing (already fixed,
    or no smear at all); 1 when the smear code is not a shape this tool knows: nothing is changed
    and the message says why; 2 when DIR is not a nanochat checkout, a file cannot be read, or a
    backup is in the way. Then audit again: smearcli compare --impl nanochat --nanochat-path DIR --check."""
    _run(nanochat_path, write)
