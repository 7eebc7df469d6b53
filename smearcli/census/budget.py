"""Time is not a verdict: the limits an architecture runs under in the census, and what is kept
when one runs out (`census.isolate` runs the workers).

- an architecture out of its limit is retried once, after the others, with `RETRY_FACTOR` times
  the time; out of time again, it is `timed out` (`timed_out`: both limits and the load), never
  `crashed`: nothing of their code was seen to fail;
- a check sends the record it has so far at each stage (`stage`): its verdict, then the
  reproducer files it wrote, before it runs them. Once the verdict is in, the architecture's own
  limit no longer applies; the rest gets `later_limit`, scaled to the check's pace, and when that
  runs out the last record sent is kept (`kept`), with what did not finish in its notes.
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Optional

from ..util import jsonsafe
from ..util.errors import UserError
from ..judging.verdicts import TIMED_OUT
from . import records
from .record import Record, bare

RETRY_FACTOR = 2.5  # an architecture out of time is tried once more with this many times the time
STAGE = "stage"  # a worker's line with the record so far (`stage`), before its final record


_stage_fd: Optional[int] = None  # in a worker: where `stage` sends the record so far


def send_stages_to(fd: int) -> None:
    """In a worker: `stage` writes to `fd` (the pipe its record goes back over) from now on."""
    global _stage_fd
    _stage_fd = fd


def stage(rec: Record) -> None:
    """In a census worker, send the record so far to the parent (kept if a later step runs out of
    time; after the first, the architecture's own limit no longer applies: `later_limit`); a no-op
    anywhere else."""
    if _stage_fd is None:
        return
    write_all(_stage_fd, (jsonsafe.dumps({STAGE: rec.to_json()}, default=str) + "\n").encode())


# the least a worker gets after its verdict: each reproducer is a fresh Python importing torch and
# transformers (about 10 s idle, a minute or more at load 10 on 2 cores), a cost the check's own
# time never paid (its process was forked with both imported); at 60 s, two censuses at once left
# 14 of 16 reproducers unfinished
LATER_FLOOR = 300.0


def later_limit(check_s: float) -> float:
    """Seconds a worker may take after its verdict (reachability, writing and running reproducers),
    scaled to the pace of its check: three times the check's own time, and at least `LATER_FLOOR`."""
    return max(LATER_FLOOR, 3.0 * check_s)


def write_all(fd: int, data: bytes) -> None:
    while data:
        n = os.write(fd, data)
        data = data[n:]


def load_words() -> str:
    """"load 9.3 on 2 cores": the machine's 1-minute load average beside its core count."""
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    return f"load {load:.1f} on {os.cpu_count()} cores"


def timed_out(name: str, first: float, second: float, wall: float) -> Record:
    """The record of an architecture out of time twice: `timed out`, never a crash (nothing of
    their code was seen to fail), with both limits and the load."""
    return bare(name, TIMED_OUT, wall_s=round(wall, 2),
                reason=f"timed out: no verdict within {first:g} s, nor within {second:g} s on a retry ({load_words()})")


def kept(name: str, buf: bytearray, wall: float, limit: float) -> Record:
    """The last record a worker sent (`stage`) when what came after its verdict ran out of its
    own limit: kept, with what did not finish in its notes."""
    rec = staged(name, bytes(buf))
    if rec is None:  # cannot happen once a verdict was staged; said as what it is all the same
        return bare(name, TIMED_OUT, wall_s=round(wall, 2),
                    reason=f"timed out after its verdict: nothing readable was kept ({load_words()})")
    left = "its reproducer did not finish" if rec.reproducer else "writing its reproducer did not finish"
    return dataclasses.replace(rec, notes=[*(rec.notes or []), (
        f"{left} within {limit:g} s (the time after a verdict, scaled to the check's pace; "
        f"{load_words()}): the verdict stands")], wall_s=round(wall, 2) if rec.wall_s is None else rec.wall_s)


def staged(name: str, buf: bytes) -> Optional[Record]:
    """The last record so far in a worker's lines (`stage`), checked; None when there is none."""
    last = None
    for line in buf.split(b"\n"):
        try:
            said = json.loads(line.decode())
        except ValueError:
            continue
        if isinstance(said, dict) and isinstance(said.get(STAGE), dict):
            last = said[STAGE]
    if last is None:
        return None
    try:
        rec = records.check_record(name, last)
    except (ValueError, UserError):
        return None
    return rec if rec.model_type == name else None
