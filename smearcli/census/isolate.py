"""Each architecture in its own process, with a time and a memory limit.

`run(names, check, sink)` (and `census(session, names, sink)`, which makes `check` of an engine's
session) forks one child per architecture (the parent has imported torch and
transformers once, so a child starts in milliseconds), at most `jobs` at a time. In the child:
`resource.setrlimit(RLIMIT_AS)` caps the memory, one thread, then `check(name)`; its record comes
back over a pipe as one JSON line (`Record.to_json`; a `Record` again in the parent). The parent kills a child that outlives its wall-clock limit.
A child that dies (a signal, an allocation refused) or raises is that architecture's result
(`crashed` with the reason; running out of memory says so first), never the scan's end.

Time is not a verdict. A child past its wall-clock limit is killed and the architecture is tried
once more, after the others, with `RETRY_FACTOR` times the time; what is still out of time then is
`timed out` (with both limits and the load), never `crashed`. A check sends the record it has so
far at each stage (`budget.stage`: its verdict, then the reproducer files it wrote); once the
verdict is in, the architecture's own limit no longer applies: the rest (writing and running
reproducers) gets its own limit, scaled to the check's pace (`budget.later_limit`), and when that
runs out the last record sent is kept, with what did not finish in its notes (a reproducer file on
disk always has a record pointing at it: `check` sends its path before running it).
Every record carries the fields its session stamps (`census.engines.Session.stamp`: the releases
that made it) where its check left them null. What an engine
gathers in a child (`census.engines.Session.gathering`: transformers' warnings that a fast SSM
kernel is not installed, kept out of the progress lines) is sent back after its record, and the
run says it once at the end, as one line (`on_note`).

Records are appended to a JSON Lines file as they finish, one whole record per write, under an
exclusive lock (`records.Sink`), so `resume` skips what a stopped scan already wrote; `shard(names,
i, n)` picks every n-th name for one machine of a CI matrix; `claims(folder)` shares the names
among scans run at once on one machine instead, each taking the next name none has taken (a file
created in `folder` only if absent), so that scans whose architectures take very different times
end together; and `records.merge(paths)` reads shard
files back into one list sorted by name, the same list a single scan writes (a line that is not a
record, or a name twice, is refused). A SIGINT or SIGTERM in the parent, even at a
fork, kills every worker (with what it started) before the parent goes on to exit; a worker also
dies with its parent.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import resource
import select
import signal
import sys
import time
from pathlib import Path
from typing import Callable, Optional, Sequence

from ..util import jsonsafe
from ..judging import judge
from ..util.errors import UserError
from ..judging.verdicts import CRASHED, NOT_BUILT
from . import budget, records
from .record import Record, bare

DEFAULT_TIMEOUT = 240.0  # seconds per architecture
RETRY_FACTOR = budget.RETRY_FACTOR
STAGE = budget.STAGE
DEFAULT_MEMORY = 3 << 30  # bytes of address space per architecture
SAID = "said"  # a child's second line: the words its engine gathered (`census.engines.Session.gathering`)


def shard(names: Sequence[str], index: int, count: int) -> list[str]:
    """The `index`-th (1-based) of `count` near-equal shares of `names`, round robin."""
    if count < 1 or not 1 <= index <= count:
        raise UserError(f"a shard is i/n with 1 <= i <= n, got {index}/{count}")
    return list(names)[index - 1::count]


def claims(folder: Path) -> Callable[[str], bool]:
    """`claim(name)`: True for the one process that claims `name` in `folder` first, False for every
    other (creating folder/name only where absent is atomic, across processes). `run` claims a
    name just before it starts it, so scans sharing a folder each take the next free name."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)

    def claim(name: str) -> bool:
        try:
            os.close(os.open(folder / name, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644))
        except FileExistsError:
            return False
        return True
    return claim


# what an allocation refused under RLIMIT_AS looks like once their code has caught and re-raised
# it, or check.py has turned it into a reason (not built when the model's weights did not fit)
ALLOCATION_FAILED = ("MemoryError", "can't allocate memory", "Cannot allocate memory")


def memory_verdict(rec: Record, memory: Optional[int]) -> Record:
    """An architecture that ran out of memory is `crashed`, with "out of memory" first in its
    reason, whichever step ran out (building the model included): the limit is --memory-mb's, not
    the tiny config's fault, and that is what the verdicts' table promises."""
    reason = str(rec.reason or "")
    if rec.verdict not in (CRASHED, NOT_BUILT) or reason.startswith("out of memory") or \
            not any(w in reason for w in ALLOCATION_FAILED):
        return rec
    limit = f"an allocation over the {memory >> 20} MiB limit was refused" if memory else "an allocation was refused"
    return dataclasses.replace(rec, verdict=str(judge.stopped(judge.MEMORY)),
                               reason=f"out of memory: {limit} ({reason})")


def _as_worker(parent: int, inherited: Sequence[int]) -> None:
    """A forked worker's first steps: its own process group (a Ctrl-C at the terminal reaches
    only the parent, which stops every worker, its reproducer's process included, with one
    killpg), default signal handling (the parent's handlers raise exceptions meant for the
    parent), death with the parent, even by SIGKILL (Linux), and none of the parent's descriptors
    (the --out file and its lock among them)."""
    os.setpgid(0, 0)
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, signal.SIG_DFL)
    if sys.platform.startswith("linux"):
        try:
            import ctypes

            ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGKILL), 0, 0, 0)  # PR_SET_PDEATHSIG
        except (OSError, AttributeError):
            pass
    if os.getppid() != parent:  # the parent died before the line above: nobody reads our record
        os._exit(3)
    for fd in inherited:
        with contextlib.suppress(OSError):
            os.close(fd)


def _child(check: Callable[[str], Record], name: str, fd: int, memory: Optional[int], parent: int,
           inherited: Sequence[int], gathering: Optional[Callable]) -> None:
    code = 0
    try:
        _as_worker(parent, inherited)
        budget.send_stages_to(fd)
        if memory:
            resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
        torch = sys.modules.get("torch")  # imported by the parent with the check, never here
        if torch is not None:
            with contextlib.suppress(Exception):
                torch.set_num_threads(1)
        with (gathering() if gathering is not None else contextlib.nullcontext(set())) as words:
            try:
                rec = memory_verdict(check(name), memory)
            except MemoryError:
                rec = memory_verdict(bare(name, judge.stopped(judge.MEMORY), reason="MemoryError"), memory)
            except BaseException as e:  # the check's own guard missed it: still this name's result
                rec = bare(name, judge.stopped(judge.WORKER), reason=f"{type(e).__name__}: {e}"[:300])
        data = (jsonsafe.dumps(rec.to_json(), default=str) + "\n").encode()  # JSON only over the pipe
        if words:  # a second line, after the record: what the parent says once at the end
            data += (json.dumps({SAID: sorted(words)}) + "\n").encode()
        budget.write_all(fd, data)
    except BaseException:
        code = 3
    finally:
        os._exit(code)


def say(text: str) -> None:
    """A run's note, as one line of smearcli's on stderr (`run`'s default `on_note`)."""
    sys.stderr.write(f"smearcli: {text}\n")


def _died(name: str, status: int, memory: Optional[int], wall: float) -> Record:
    if os.WIFSIGNALED(status):
        sig = signal.Signals(os.WTERMSIG(status)).name
        why = f"the process died of {sig}"
        if os.WTERMSIG(status) in (signal.SIGKILL, signal.SIGSEGV, signal.SIGABRT) and memory:
            why += f" (memory limit {memory >> 20} MiB)"
    else:
        why = f"the process exited with status {os.WEXITSTATUS(status)} and no result"
    return bare(name, judge.stopped(judge.WORKER), reason=why, wall_s=round(wall, 2))


def census(session, names: Sequence[str], sink: "records.Sink", jobs: int = 1, timeout: float = DEFAULT_TIMEOUT,
           memory: Optional[int] = DEFAULT_MEMORY, repro_dir: Path = Path("scan-repro"),
           on_record: Optional[Callable[[Record], None]] = None,
           claim: Optional[Callable[[str], bool]] = None) -> list[Record]:
    """The one census loop, on any engine: `names` (those `sink` does not hold yet, and that
    `claim` grants where given) checked by `session` (`census.engines.Session`), each in its own
    process (`run`: its limits, its retry of a time-out), at most `jobs` at once; the records of
    this run."""
    where = Path(repro_dir).resolve()
    return run(names, lambda name: session.check(name, where, timeout, memory), sink, jobs=jobs, timeout=timeout,
               memory=memory, on_record=on_record, checked=session.checked, claim=claim,
               gathering=getattr(session, "gathering", None), gathered=getattr(session, "gathered", None),
               stamp=getattr(session, "stamp", dict)())


def run(names: Sequence[str], check: Callable[[str], Record], sink: "records.Sink", jobs: int = 1,
        timeout: float = DEFAULT_TIMEOUT, memory: Optional[int] = DEFAULT_MEMORY,
        on_record: Optional[Callable[[Record], None]] = None,
        on_note: Callable[[str], None] = say,
        checked: Optional[Callable[[Record, bool], bool]] = None,
        claim: Optional[Callable[[str], bool]] = None, gathering: Optional[Callable] = None,
        gathered: Optional[Callable[[set], str]] = None, stamp: Optional[dict] = None) -> list[Record]:
    """Check every name in its own process, appending each record to an open `records.Sink`: the
    names it does not hold yet, at most `jobs` at once; the records of this run, in the order they
    finished.
    However this ends (a SIGINT, a SIGTERM, an error), every worker is killed and reaped first: none
    runs on, and only whole records are in the file. `gathering()`, entered in each child around its
    check, yields a set the engine adds words to (transformers: the fast kernels it fell back
    without); the run says `gathered(every child's words)` once at its end (`on_note`). `checked(record, more)`, in this process before a
    record is written, may ask for that name to be checked once more instead
    (`census.engines.Session.checked`). With `claim` (`claims`), a name is checked only if
    `claim(name)` grants it when its turn comes: another scan sharing the claims has it otherwise.
    `stamp`: fields set on every record that left them null (`census.engines.Session.stamp`)."""
    if jobs < 1:
        raise UserError(f"jobs must be at least 1, got {jobs}")
    done = sink.names()
    todo = [(n, timeout) for n in dict.fromkeys(names) if n not in done]  # (name, its limit)
    tried: dict[str, float] = {}  # name -> the limit it ran out of the first time
    running: dict[int, list] = {}  # pid -> [name, read fd, start, buffer, limit, verdict at (or None)]
    results: list[Record] = []
    said: set[str] = set()  # the words the children's engine gathered

    again: set[str] = set()  # the names checked once more at `checked`'s asking
    mine: set[str] = set()  # the names `claim` granted this run (a retry or a recheck keeps its claim)

    def finish(rec: Record) -> None:
        for field, value in (stamp or {}).items():
            if value is not None and getattr(rec, field) is None:
                setattr(rec, field, value)
        # no engine writes a bug the judge does not keep
        word = judge.recorded(rec.verdict, rec.confirmation.status if rec.confirmation is not None else None)
        if word != rec.verdict:
            rec.verdict, rec.notes = str(word), [*(rec.notes or []), judge.UNCONFIRMED_BUG]
        name = rec.model_type
        if checked is not None and checked(rec, bool(todo or running)) and name not in again:
            again.add(name)
            todo.insert(0, (name, timeout))
            return
        sink.write(rec)
        results.append(rec)
        if on_record is not None:
            on_record(rec)

    try:
        while todo or running:
            while todo and len(running) < jobs:
                name, limit = todo.pop(0)
                if claim is not None and name not in mine:
                    if not claim(name):
                        continue
                    mine.add(name)
                _spawn(check, name, limit, running, memory, sink.fd, gathering)
            for rec in _collect(running, memory, said):
                finish(rec)
            now = time.monotonic()
            for pid, (name, fd, start, buf, limit, verdict_at) in list(running.items()):
                if verdict_at is not None:  # the verdict is in: the rest has its own limit
                    if now - verdict_at > budget.later_limit(verdict_at - start):
                        _kill(pid, running)
                        finish(budget.kept(name, buf, now - start, budget.later_limit(verdict_at - start)))
                elif now - start > limit:
                    _kill(pid, running)
                    if name not in tried:  # once more, after the others, with more time
                        tried[name] = limit
                        todo.append((name, limit * RETRY_FACTOR))
                    else:
                        finish(budget.timed_out(name, tried[name], limit, now - start))
    finally:
        with records.signals_held():  # a second Ctrl-C must not leave a worker behind
            for pid in list(running):
                _kill(pid, running)
    if said and gathered is not None:
        on_note(gathered(said))
    return results


def _spawn(check, name: str, limit: float, running: dict, memory: Optional[int], sink_fd: int,
           gathering: Optional[Callable] = None) -> None:
    """Fork `name`'s worker and list it in `running`, SIGINT and SIGTERM held back in between: a
    signal at the moment of the fork is handled once the worker is listed, so it is stopped too."""
    r, w = os.pipe()
    parent = os.getpid()
    with records.signals_held():
        try:
            pid = os.fork()
        except BaseException:
            os.close(r)
            os.close(w)
            raise
        if pid == 0:
            os.close(r)
            _child(check, name, w, memory, parent, [sink_fd, *(v[1] for v in running.values())], gathering)
        with contextlib.suppress(OSError):  # the child does it too; whichever runs first
            os.setpgid(pid, pid)
        os.close(w)
        running[pid] = [name, r, time.monotonic(), bytearray(), limit, None]


def _collect(running: dict, memory: Optional[int], said: set) -> list[Record]:
    """The records of the workers that finished within 0.2 s (read from their pipes); the words
    their engine gathered are added to `said`."""
    poller = select.poll()
    fds = {v[1]: pid for pid, v in running.items()}
    for fd in fds:
        poller.register(fd, select.POLLIN)
    out = []
    for fd, _ in poller.poll(200):
        chunk = os.read(fd, 1 << 16)
        worker = running[fds[fd]]
        name, _, start, buf = worker[:4]
        if chunk:
            buf.extend(chunk)
            if worker[5] is None and b'{"' + STAGE.encode() + b'"' in buf:  # the verdict is in
                worker[5] = time.monotonic()  # its own limit stops; `budget.later_limit` starts
            continue
        pid = fds[fd]  # end of file: the child is done
        with records.signals_held():  # reaped and dropped together: the cleanup sees one or the other
            _, status = os.waitpid(pid, 0)
            os.close(fd)
            del running[pid]
        lines = [x for x in bytes(buf).split(b"\n") if x.strip() and not x.startswith(b'{"' + STAGE.encode())]
        text, after = (lines[0] if lines else b""), b"\n".join(lines[1:])
        said.update(_said(after))
        rec = _record(name, text, status, memory, time.monotonic() - start)
        kept = budget.staged(name, bytes(buf)) if rec.verdict == CRASHED and not text.strip() else None
        if kept is not None:  # it died after its verdict (writing or running a reproducer): the verdict stands
            rec = dataclasses.replace(kept, notes=[*(kept.notes or []), f"after its verdict, {rec.reason}"],
                                      wall_s=kept.wall_s or rec.wall_s)
        out.append(rec)
    return out


def _said(after: bytes) -> list[str]:
    """The words a worker's line after its record gives (nothing when there is no line)."""
    try:
        said = json.loads(after.decode()) if after.strip() else {}
    except ValueError:
        return []
    got = said.get(SAID) if isinstance(said, dict) else None
    return [str(x) for x in got] if isinstance(got, list) else []


def _record(name: str, buf: bytes, status: int, memory: Optional[int], wall: float) -> Record:
    """The worker's record, checked, a `Record` again; a process that died or wrote something else
    is `crashed`."""
    try:
        rec = records.check_record(name, json.loads(buf.decode()))
        if rec.model_type != name:
            raise ValueError(f"a record for {rec.model_type}")
    except (ValueError, UserError):
        return _died(name, status, memory, wall)
    if rec.wall_s is None:
        rec.wall_s = round(wall, 2)
    return rec


def _kill(pid: int, running: dict) -> None:
    """Kill a worker with everything it started (its process group), reap it, drop it."""
    try:
        os.killpg(pid, signal.SIGKILL)
    except OSError:  # no group yet (it had not run setpgid): the worker alone
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, 0)
    os.close(running.pop(pid)[1])
