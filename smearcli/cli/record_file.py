"""A census writing into its record file, as both engines' `scan` do: one line per architecture as
it finishes (unless quiet), a record cut short by an earlier stop said and dropped, and on Ctrl-C or
SIGTERM how many whole records the file holds before the interrupt goes on; `resumable`, the
records `--resume` would keep checked first: one made on another engine or by another transformers
release is refused, naming the file and line, before the engine starts."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Callable, Optional

from ..util.errors import UserError


def resumable(out: Path, engine: str, release: Optional[str]) -> None:
    """--resume keeps what `out` holds as this census's results: each record must have been made
    on `engine` by transformers `release` (the one this process imported; a record that names none
    is taken as it is). A UserError names the first that was not; a missing file holds nothing yet."""
    from ..census import records

    if not out.exists() and not out.is_symlink():
        return
    got = records.read(out, torn_ok=True, busy="wait for it to end, or give another output file")
    for rec, line in zip(got.records, got.lines):
        made_on = rec.engine or "transformers"
        if made_on != engine:
            raise UserError(f"--resume: {out}:{line} holds {rec.model_type}'s record made on {made_on}, and this "
                            f"census runs on {engine} (--engine): give another --out, or drop --resume")
        if release is not None and rec.transformers_version not in (None, release):
            raise UserError(f"--resume: {out}:{line} holds {rec.model_type}'s record made by transformers "
                            f"{rec.transformers_version}, and this census runs transformers {release}: one census "
                            "is of one release; give another --out, or drop --resume")


def written(out: Path, resume: bool, quiet: bool, run: Callable) -> list[dict]:
    """`run(sink, said)` with the record file `out` open (`census.records.Sink`); the records it
    holds at the end. `said(record)` prints the architecture's line."""
    from ..census import records
    from ..util.files import Terminated

    def said(rec):
        if not quiet:
            sys.stderr.write(f"smearcli: {rec.model_type}: {rec.verdict}"
                             f"{' (' + str(rec.wall_s) + ' s)' if rec.wall_s else ''}\n")
    with records.Sink(out, resume) as sink:
        if sink.torn:
            sys.stderr.write(f"smearcli: {out}:{sink.torn}: a record cut short (a scan stopped mid-write) "
                             "is dropped; that architecture runs again\n")
        try:
            run(sink, said)
        except (KeyboardInterrupt, Terminated):
            n = len(sink.records())
            sys.stderr.write(f"smearcli: {out} holds {n} whole record{'s' * (n != 1)}; --resume continues "
                             "from there\n")
            raise
        return sink.records()
