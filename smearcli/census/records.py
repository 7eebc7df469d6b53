"""The scan's record files (JSON Lines, one architecture's record a line), read strictly and
written one whole record at a time (the output a scan writes, resumes and merges).

A file someone else wrote, cut short, concatenated or edited is never merged silently: every line
must be one JSON object with a known `verdict` and fields of the types the report reads, and a
model type may appear once across everything read. Anything else is a UserError naming the file
and the line. The one exception is what a scan killed mid-write leaves, a last line without its
newline that does not parse: a resumed scan drops it (and says so) and runs that architecture again.

`Sink` is the output file while a scan writes it: a regular file, held under an exclusive `flock` so a
second scan on it is refused rather than interleaving its records; each record is one `write`
with SIGINT and SIGTERM held back (`signals_held`), so a record on disk is always whole.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import signal
import stat
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Optional

from ..util import jsonsafe
from ..util.errors import UserError
from ..util.files import missing_directory, regular_file, special_kind
from ..measure.jsondoc import SCHEMAS
from ..judging.verdicts import RECORD as VERDICTS
from .record import BY_NAME, JSON_TYPES, ONE, PARTS, Record, part_kind

SCHEMA = SCHEMAS["scan"]

MAX_BYTES = 64 << 20  # a census of every architecture is well under 1 MiB; the meta files' cap
FIELD_TYPES = JSON_TYPES  # the JSON type of every field a record may hold (census.record)
SIGNALS = {signal.SIGINT, signal.SIGTERM}


@dataclass
class Parsed:
    """One file's records with the line each came from; `torn` the line number of a last line cut
    mid-record (only when asked to allow one) and `keep` the bytes before it."""

    records: list = field(default_factory=list)
    lines: list = field(default_factory=list)
    torn: Optional[int] = None
    keep: int = 0


def _json_kind(value) -> str:
    return {dict: "object", list: "array", str: "string", bool: "boolean", type(None): "null"}.get(
        type(value), "number")


def _check_types(where: str, rec: dict, types: dict) -> None:
    for key, (allowed, word) in types.items():
        value = rec.get(key)
        if value is not None and ((isinstance(value, bool) and bool not in allowed) or not isinstance(value, allowed)):
            raise UserError(f"{where}: \"{key}\" must be {word} or null, got {json.dumps(value)[:40]}")


def _check_parts(at: str, value, how: tuple) -> None:
    """Each part a field (or a part's field) holds: an object of its part's types, and the parts
    inside it the same (`Part.NESTED`)."""
    part, shape = how
    entries = {"": value} if shape == ONE else (value or {}) if shape == BY_NAME else dict(enumerate(value or []))
    for key, entry in entries.items():
        here = at + ("" if shape == ONE else f".{json.dumps(key)}" if shape == BY_NAME else f"[{key}]")
        if entry is None:
            continue
        if not isinstance(entry, dict):
            raise UserError(f"{here} must be an object, got {json.dumps(entry)[:40]}")
        _check_types(here, entry, part.types())
        keys = part.keys()
        for name, inner in part.NESTED.items():
            _check_parts(f"{here}.\"{keys[name]}\"", entry.get(keys[name]), (part_kind(inner[0]), inner[1]))


def check_record(where: str, rec) -> Record:
    """The `Record` a JSON value holds when it is a scan record the report can show (the one type
    check of a record read from a file or a worker's pipe); a UserError saying what is wrong."""
    if not isinstance(rec, dict):
        raise UserError(f"{where}: a JSON {_json_kind(rec)}, not a scan record (an object with "
                        "model_type and verdict)")
    if rec.get("schema") == SCHEMA:
        raise UserError(f"{where}: a {SCHEMA} document (the scan's JSON document), not the JSON Lines "
                        "record file a scan writes")
    name = rec.get("model_type")
    if not isinstance(name, str) or not name.strip():
        got = "none" if "model_type" not in rec else json.dumps(name)[:40]
        raise UserError(f"{where}: not a scan record (\"model_type\" must be a non-empty string, got {got})")
    if rec.get("verdict") not in VERDICTS:
        raise UserError(f"{where}: {name}: \"verdict\" must be one of {', '.join(VERDICTS)}; got "
                        f"{json.dumps(rec.get('verdict'))[:40]}")
    _check_types(f"{where}: {name}", rec, FIELD_TYPES)
    for group, how in PARTS.items():
        _check_parts(f"{where}: {name}: \"{group}\"", rec.get(group), how)
    return Record.from_json(rec)


def _load(where: str, line: bytes, last: bool):
    """One line's JSON value, or a UserError in words (which also tells a torn line by `last`)."""
    try:
        return json.loads(line.decode("utf-8"))
    except UnicodeDecodeError:
        raise UserError(f"{where}: not UTF-8 text (a binary file?)") from None
    except RecursionError:
        raise UserError(f"{where}: nested too deeply to be a scan record") from None
    except json.JSONDecodeError as e:
        if e.msg == "Extra data":  # `{...}{...}`: two records glued together
            raise UserError(f"{where}: more than one JSON value on the line (records concatenated "
                            "without a newline?)") from None
        if last:
            raise UserError(f"{where}: not a JSON object (truncated?)") from None
        raise UserError(f"{where}: not a JSON object ({e.msg} at column {e.colno})") from None
    except ValueError as e:  # an integer beyond Python's digit limit
        raise UserError(f"{where}: not a JSON object ({e})") from None


def parse(name: str, data: bytes, torn_ok: bool = False) -> Parsed:
    """The records of one JSON Lines file's bytes, each checked (`check_record`), no model type
    twice. `torn_ok`: a last line without its newline that does not parse is left out (`torn`)."""
    out = Parsed(keep=len(data))
    seen: dict[str, int] = {}
    pieces = data.split(b"\n")
    offset = 0
    for i, line in enumerate(pieces, 1):
        start, offset = offset, offset + len(line) + 1
        if not line.strip():
            continue
        last = i == len(pieces)  # no newline after it
        try:
            value = _load(f"{name}:{i}", line, last)
        except UserError:
            if last and torn_ok:
                out.torn, out.keep = i, start
                break
            if i == 1 and not last:
                _whole_document(name, data)
            raise
        rec = check_record(f"{name}:{i}", value)
        mt = rec.model_type
        if mt in seen:
            first = seen[mt]
            raise UserError(f"{name}:{i}: a second record for {mt} "
                            f"({_against(out.records[first], rec, f'line {out.lines[first]}')})")
        seen[mt] = len(out.records)
        out.records.append(rec)
        out.lines.append(i)
    return out


def _against(first: Record, second: Record, there: str) -> str:
    """How a second record of a model type compares with the first: the same, or what differs."""
    a, b = first.to_json(), second.to_json()
    differ = sorted(k for k in a if k != "wall_s" and a[k] != b[k])  # the timing differs from run to run
    if not differ:
        return f"{there} has the same one"
    if first.verdict != second.verdict:
        return f"conflicts with {there}: {first.verdict} there, {second.verdict} here"
    return f"conflicts with {there}, which differs in " + ", ".join(differ[:4])


def _whole_document(name: str, data: bytes) -> None:
    """A file whose first line does not parse may be one JSON document over many lines (scan
    the JSON document, indented): say so rather than "line 1"."""
    try:
        doc = json.loads(data.decode("utf-8"))
    except (ValueError, RecursionError):
        return
    if isinstance(doc, dict) and doc.get("schema") == SCHEMA:
        raise UserError(f"{name}: a {SCHEMA} document (the scan's JSON document), not the JSON Lines "
                        "record file a scan writes")
    raise UserError(f"{name}: one JSON {_json_kind(doc)} over several lines, not JSON Lines (a scan "
                    "record on each line)")


def _open_regular(path: Path, flags: int) -> int:
    """A descriptor on `path` once it is known to be a regular file: opened without blocking (a
    FIFO never waits for a writer), checked with fstat before anything is read or written."""
    try:
        fd = os.open(path, flags | os.O_NONBLOCK | os.O_CLOEXEC, 0o666)
    except IsADirectoryError:
        raise UserError(f"{path}: is a directory, not a file") from None
    except (FileNotFoundError, NotADirectoryError):
        raise UserError(f"{path}: {missing_directory(path.parent)}") from None
    except OSError as e:
        if e.errno == errno.ENXIO:  # a FIFO nobody reads: opening it to write fails, never blocks
            raise UserError(f"{path}: a FIFO (named pipe), not a regular file; give a file") from None
        raise
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        kind = "directory" if stat.S_ISDIR(st.st_mode) else special_kind(st.st_mode)
        raise UserError(f"{path}: a {kind}, not a regular file; give a file")
    os.set_blocking(fd, True)
    return fd


def _read_all(fd: int, path: Path) -> bytes:
    size = os.fstat(fd).st_size
    if size > MAX_BYTES:
        raise UserError(f"{path}: {size} bytes, more than the {MAX_BYTES >> 20} MiB a scan file may "
                        "hold; is it a scan file?")
    chunks = []
    os.lseek(fd, 0, os.SEEK_SET)
    while chunk := os.read(fd, 1 << 20):
        chunks.append(chunk)
    return b"".join(chunks)


def _lock(fd: int, path: Path, kind: int, doing: str) -> None:
    try:
        fcntl.flock(fd, kind | fcntl.LOCK_NB)
    except BlockingIOError:
        raise UserError(f"{path}: another smearcli scan is writing it; {doing}") from None


def read(path, torn_ok: bool = False, busy: str = "read it once that scan has ended") -> Parsed:
    """One scan file, read whole under a shared lock (a scan still writing it is refused, saying
    `busy`: what to do)."""
    path = Path(path)
    if not path.exists() and not path.is_symlink():
        raise UserError(f"{path}: no such scan file")
    regular_file(path)  # a dangling link, a loop, a device: named before anything is opened
    fd = _open_regular(path, os.O_RDONLY)
    try:
        _lock(fd, path, fcntl.LOCK_SH, busy)
        return parse(str(path), _read_all(fd, path), torn_ok)
    finally:
        os.close(fd)


def merge(paths: Iterable) -> list[Record]:
    """One record per model type from scan files (shards), sorted by model type. Each file must
    hold at least one record; a model type in two files, or a file given twice, is refused."""
    by_name: dict[str, tuple[Record, str]] = {}
    seen_files: dict[tuple[int, int], str] = {}
    for p in paths:
        p = Path(p)
        with contextlib.suppress(OSError):
            st = os.stat(p)
            if (st.st_dev, st.st_ino) in seen_files:
                raise UserError(f"{p}: given twice (also as {seen_files[st.st_dev, st.st_ino]}); a file's "
                                "records count once")
            seen_files[st.st_dev, st.st_ino] = str(p)
        got = read(p)
        if not got.records:
            raise UserError(f"{p}: holds no scan record (an empty file); nothing to merge")
        for rec, line in zip(got.records, got.lines):
            mt = rec.model_type
            if mt in by_name:
                first, there = by_name[mt]
                raise UserError(f"{p}:{line}: a second record for {mt} ({_against(first, rec, there)}); "
                                "shards never share an architecture")
            by_name[mt] = rec, f"{p}:{line}"
    return [by_name[k][0] for k in sorted(by_name)]


@contextlib.contextmanager
def signals_held():
    """SIGINT and SIGTERM held back while what runs inside completes (a record written, a worker
    forked and listed), then handled as they would have been. Blocking them with pthread_sigmask
    is not enough: torch runs threads of its own, and the kernel hands a signal to any thread that
    does not block it, after which Python runs the handler in the main thread all the same. So the
    Python-level handlers are swapped for one that only notes the signal. (Off the main thread,
    where handlers cannot be set, the body runs as it is.)"""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    caught: list[int] = []
    old = {s: signal.getsignal(s) for s in SIGNALS}
    for s, handler in old.items():
        if handler not in (signal.SIG_IGN, None):
            signal.signal(s, lambda n, frame: caught.append(n))
    try:
        yield
    finally:
        for s, handler in old.items():
            if handler is not None:
                signal.signal(s, handler)
        for n in dict.fromkeys(caught):  # now, as if it had just arrived
            if callable(old[n]):
                old[n](n, None)
            elif old[n] == signal.SIG_DFL:
                os.kill(os.getpid(), n)


class Sink:
    """The output file while a scan writes it: a regular file under an exclusive lock. Without `resume` it
    starts empty; with it, its records are read (`kept`) and a torn last line is cut (`torn`: its
    line number). `write(rec)` appends one whole record."""

    def __init__(self, path, resume: bool = False):
        self.path = Path(path)
        self.fd = _open_regular(self.path, os.O_RDWR | os.O_APPEND | os.O_CREAT)
        try:
            _lock(self.fd, self.path, fcntl.LOCK_EX, "wait for it to end, or give another output file")
            got = parse(str(self.path), _read_all(self.fd, self.path), torn_ok=True) if resume else Parsed()
            self.kept, self.torn = got.records, got.torn
            self.written: list[Record] = []
            self._start(got.keep if resume else 0)
        except BaseException:
            os.close(self.fd)
            raise

    def _start(self, keep: int) -> None:
        """The file cut to `keep` bytes (0: a fresh scan), and ending with a newline."""
        with signals_held():
            if os.fstat(self.fd).st_size != keep:
                os.ftruncate(self.fd, keep)
            if keep and os.pread(self.fd, 1, keep - 1) != b"\n":  # a last record without its newline
                os.write(self.fd, b"\n")

    def names(self) -> set:
        return {r.model_type for r in self.kept}

    def write(self, rec: Record) -> None:
        """Append one whole record. A write that fails part way (a full disk, a quota) is undone:
        the file is cut back to the records it held, and the UserError names the file."""
        data = (jsonsafe.dumps(rec.to_json(), default=str) + "\n").encode("utf-8")
        with signals_held():
            before = os.fstat(self.fd).st_size
            view = memoryview(data)
            try:
                while view:  # one write for a regular file; the loop only guards against a short one
                    view = view[os.write(self.fd, view):]
            except OSError as e:
                with contextlib.suppress(OSError):
                    if os.fstat(self.fd).st_size != before:
                        os.ftruncate(self.fd, before)  # no torn record left behind
                n = len(self.kept) + len(self.written)
                raise UserError(f"{self.path}: cannot write {rec.model_type}'s record ({e.strerror or e}); the file "
                                f"holds the {n} whole record{'s' * (n != 1)} written before it: make room, then "
                                "resume the scan") from None
        self.written.append(rec)

    def records(self) -> list[Record]:
        """Everything the file holds now, kept and written, sorted by model type."""
        return sorted(self.kept + self.written, key=lambda r: r.model_type)

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)  # the lock goes with it
            self.fd = -1

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
