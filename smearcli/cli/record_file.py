"""A census writing into its record file, as both engines' `scan` do: one line per architecture as
it finishes (unless quiet), a record cut short by an earlier stop said and dropped, and on Ctrl-C or
SIGTERM how many whole records the file holds before the interrupt goes on."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Callable


def written(out: Path, resume: bool, quiet: bool, run: Callable) -> list[dict]:
    """`run(sink, said)` with the record file `out` open (`census.records.Sink`); the records it
    holds at the end. `said(record)` prints the architecture's line."""
    from ..census import records
    from ..files import Terminated

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
