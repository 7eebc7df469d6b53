"""What upstream already knows about each finding: the table `known.toml` beside this module, read
strictly, and every finding of a census placed against it (torch-free).

A maintainer who receives a report first searches the tracker, so the census does too, once, by
hand, into `known.toml`: one entry per public thread (its link, engine, the architectures, paths
and shape it covers, its status and the maintainers' word) and one per finding that matches
nothing public (status `new`, with what was searched). An entry matches a finding on the record,
never on a name alone: the engine, the model type, the verdict, the failing path (a glob over the
schedule's or boundary's name) and the shape must all agree.

Each finding of a record (`findings`: its headline schedule and every failing boundary) is then one
of (`place`):

- `new`: no public thread matches (or only a `new` entry, which says what was searched): the
  census's own contribution, which `scan --check` fails on;
- `regression`: a thread says it was fixed in a release, and this record's release is that one or
  later: a report that cites the fix, and `--check` fails on it;
- `open`: an open thread (or a duplicate of one): what the census adds belongs in a comment there,
  so an engine's draft is a comment (transformers': `engines.transformers.draft.for_upstream`), and
  `--check` lists it without failing;
- `fixed later`: found on a release before the one that fixed it: listed, not failed;
- `by design`: the maintainers said it is intended; the judge's `by_design` makes the record's
  word `by design` when every finding of it is, outside the bug count and `--check`.

`stale(records, entries)` names the entries of this engine that matched nothing although their
architectures were checked: fixed upstream, or a rule of ours changed (`scan --against` says them,
tests/census/test_known.py holds every entry to the finding it was written from).
"""

from __future__ import annotations

import fnmatch
import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional, Sequence

from ..util.errors import UserError
from ..judging.judge import by_design
from ..judging.verdicts import BUG, BY_DESIGN, FAILURES, UNSUPPORTED
from . import engines
from .record import Record, Upstream, bare as record_of

TABLE = Path(__file__).with_name("known.toml")

# the classes of a placed finding, most pressing first (`worst`)
NEW, REGRESSION, OPEN, FIXED_LATER, DESIGNED = "new", "regression", "open", "fixed later", str(BY_DESIGN)
CLASSES = (NEW, REGRESSION, OPEN, FIXED_LATER, DESIGNED)
FAILS_CHECK = (NEW, REGRESSION)  # what `scan --check` fails on (the rest is listed)

FINDING_WORDS = tuple(str(v) for v in FAILURES)  # a part of a record that is a finding: their code failed
ID = re.compile(r"[a-z0-9][a-z0-9-]*")
STATUS = re.compile(r"open|new|by design|fixed in (?P<fixed>\d+(?:\.\d+)*)|duplicate of (?P<dup>[a-z0-9][a-z0-9-]*)")
KEYS = {"id": str, "engine": str, "architectures": list, "paths": list, "shape": str, "verdicts": list,
        "status": str, "url": str, "title": str, "quote": str, "searched": str, "seen": dict}
GITHUB = re.compile(r"https://github\.com/([^/]+/[^/]+)/(?:issues|pull|discussions)/(\d+)(?:[#?/].*)?")
REQUIRED = ("id", "engine", "architectures", "paths", "shape", "status")
SEEN_KEYS = ("release", "model_type", "path", "shape", "verdict")


@dataclass(frozen=True)
class Entry:
    """One entry of the table: a public thread, or a finding nobody has reported (`status` new)."""

    id: str
    engine: str
    architectures: tuple
    paths: tuple
    shape: str
    status: str
    verdicts: tuple = FINDING_WORDS
    url: str = ""
    title: str = ""
    quote: str = ""
    searched: str = ""
    seen: dict = field(default_factory=dict, hash=False, compare=False)

    @property
    def fixed_in(self) -> Optional[str]:
        m = STATUS.fullmatch(self.status)
        return m["fixed"] if m else None

    @property
    def duplicate_of(self) -> Optional[str]:
        m = STATUS.fullmatch(self.status)
        return m["dup"] if m else None

    def covers(self, engine: str, model_type: str, part: "Part") -> bool:
        """Whether this entry speaks of that finding: engine, model type, verdict, path and shape agree."""
        return (self.engine == engine and model_type in self.architectures and part.verdict in self.verdicts
                and any(fnmatch.fnmatchcase(part.path, p) for p in self.paths)
                and self.shape in ("*", part.shape))

    def brief(self) -> dict:
        """What a record keeps of it: enough to link and quote it without the table."""
        return {"id": self.id, "status": self.status, "url": self.url, "title": self.title, "quote": self.quote}


@dataclass(frozen=True)
class Part:
    """One finding of a record: the path that failed (a schedule or a boundary), its shape, its word."""

    path: str
    shape: str
    verdict: str


def load(path: Optional[Path] = None) -> tuple[Entry, ...]:
    """The entries of `path` (default: the package's table), checked: a key no entry has, a missing
    or mistyped field, a status outside the vocabulary, an id given twice or a duplicate of no entry
    is a UserError naming the file and the entry."""
    path = Path(path) if path is not None else TABLE
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except OSError as e:
        raise UserError(f"{path}: cannot read the table of what upstream knows ({e.strerror or e})") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
        raise UserError(f"{path}: not a valid TOML table of what upstream knows: {e}") from None
    extra = sorted(set(data) - {"thread"})
    if extra:
        raise UserError(f"{path}: unknown table {extra[0]!r}; every entry is a [[thread]]")
    raw = data.get("thread", [])
    if not isinstance(raw, list):
        raise UserError(f"{path}: 'thread' must be an array of tables ([[thread]])")
    out, ids = [], {}
    for i, d in enumerate(raw, 1):
        where = f"{path}: entry {i}" + (f" ({d['id']})" if isinstance(d.get("id"), str) else "")
        out.append(_entry(d, where))
        if out[-1].id in ids:
            raise UserError(f"{where}: id {out[-1].id!r} is already entry {ids[out[-1].id]}; each thread once")
        ids[out[-1].id] = i
    for e in out:
        if e.duplicate_of is not None and e.duplicate_of not in ids:
            raise UserError(f"{path}: entry {ids[e.id]} ({e.id}): a duplicate of {e.duplicate_of!r}, which no entry is")
    return tuple(out)


def _entry(d: dict, where: str) -> Entry:
    for k in d:
        if k not in KEYS:
            raise UserError(f"{where}: unknown field {k!r} (the fields: {', '.join(KEYS)})")
    for k in REQUIRED:
        if k not in d:
            raise UserError(f"{where}: no {k!r}")
    for k, v in d.items():
        if not isinstance(v, KEYS[k]) or (KEYS[k] is list and not all(isinstance(x, str) for x in v)):
            raise UserError(f"{where}: {k!r} must be {'a list of strings' if KEYS[k] is list else KEYS[k].__name__}")
    if not ID.fullmatch(d["id"]):
        raise UserError(f"{where}: id {d['id']!r} must be lowercase letters, digits and dashes")
    if not STATUS.fullmatch(d["status"]):
        raise UserError(f"{where}: status {d['status']!r} is none of: open, new, by design, fixed in X.Y.Z, "
                        "duplicate of ID")
    if not d["architectures"] or not d["paths"]:
        raise UserError(f"{where}: 'architectures' and 'paths' each name at least one")
    if d["status"] not in ("new",) and not d.get("url", "").startswith("https://"):
        raise UserError(f"{where}: a public thread needs its url (https://...)")
    if d["status"] == "new" and not d.get("searched"):
        raise UserError(f"{where}: a finding nobody has reported says what was searched ('searched')")
    seen = d.get("seen", {})
    missing = [k for k in SEEN_KEYS if not isinstance(seen.get(k), str)]
    if missing:
        raise UserError(f"{where}: 'seen' needs {', '.join(missing)} (the finding the entry was written from)")
    return Entry(d["id"], d["engine"], tuple(d["architectures"]), tuple(d["paths"]), d["shape"], d["status"],
                 tuple(d.get("verdicts", FINDING_WORDS)), d.get("url", ""), d.get("title", ""),
                 d.get("quote", ""), d.get("searched", ""), dict(seen))


def engine_of(record: Record) -> str:
    """The engine that made `record`, as known.toml's entries name it (`engines.name_of`)."""
    return engines.name_of(record) or "?"


def version(text: Optional[str]) -> tuple:
    """"5.25.0" -> (5, 25, 0); a local or dev suffix is dropped ("0.32.0+cpu"); () when none."""
    m = re.match(r"\d+(?:\.\d+)*", text or "")
    return tuple(int(x) for x in m[0].split(".")) if m else ()


def findings(record: Record) -> list[Part]:
    """The record's findings: its headline (when its word is a finding) and every boundary that
    failed beside it, each path once (a crop their API accepted on a path the library declares
    unsupported, that left the state wrong, is among them: `engines.transformers.boundary.declared`). A record
    written before that rule kept such a crop as `unsupported` with an `api_finding`: it is placed
    too, with that word. A record placed before keeps the parts it was placed with (its headline
    may read `by design`)."""
    out = []
    word = record.verdict
    ups = record.upstream if isinstance(record.upstream, list) else []
    if ups and all(isinstance(u, Upstream) and all(isinstance(x, str) for x in (u.path, u.shape, u.verdict))
                   and u.verdict in FINDING_WORDS + (str(UNSUPPORTED),) for u in ups):
        return [Part(u.path, u.shape, u.verdict) for u in ups]  # placed before: each keeps its word
    if word in FINDING_WORDS:
        out.append(Part(record.worst_schedule or "", record.shape or "", word))
    for name, e in (record.boundaries or {}).items():
        st = getattr(e, "status", None)
        if st in FINDING_WORDS and all(p.path != name for p in out):
            out.append(Part(name, getattr(e, "shape", None) or "", st))
    for name, e in (record.boundaries or {}).items():  # an older record: declared, and their crop departed anyway
        crop = getattr(e, "their_crop", None)
        if (getattr(crop, "api_finding", None) is not None and getattr(crop, "status", None) == str(UNSUPPORTED)
                and all(p.path != name for p in out)):
            out.append(Part(name, getattr(crop, "shape", None) or "", str(UNSUPPORTED)))
    return out


def stand_in(entry: Entry) -> Record:
    """A record holding the finding `entry.seen` describes, as a census would write it (a declared
    limit's departure seen as `unsupported`, as records before `boundary.declared` kept it, as
    their crop's `api_finding`): what the tests hold each entry to."""
    s = entry.seen
    made = engines.stamped(entry.engine, s["release"])
    if s["verdict"] == str(UNSUPPORTED):
        crop = {"status": str(UNSUPPORTED), "api_finding": {"at": "?", "what": s["shape"], "status": str(BUG)}}
        return record_of(s["model_type"], "ok", boundaries={s["path"]: {"status": "ok", "their_crop": crop}}, **made)
    return record_of(s["model_type"], s["verdict"], worst_schedule=s["path"], shape=s["shape"], **made)


def classify(entries: Sequence[Entry], record: Record, by_id: dict) -> str:
    """The class of a finding that `entries` cover (module docstring), on `record`'s release."""
    public = [by_id.get(e.duplicate_of, e) if e.duplicate_of else e for e in entries if e.status != "new"]
    if not public:
        return NEW
    ranks = []
    for e in public:
        if e.status == "by design":
            ranks.append(DESIGNED)
        elif e.fixed_in is not None:
            ranks.append(REGRESSION if version(engines.release_of(record)) >= version(e.fixed_in) else FIXED_LATER)
        else:  # open, or a duplicate of a thread whose own status is new (none: public ones only)
            ranks.append(OPEN)
    return min(ranks, key=CLASSES.index)


def place(records: Sequence[Record], entries: Optional[Sequence[Entry]] = None) -> list[Record]:
    """Every record with `upstream` set (one entry per finding: path, shape, word, class and the
    threads that cover it) and its word as the judge reads it once placed (`judge.by_design`)."""
    entries = load() if entries is None else tuple(entries)
    for r in records:
        parts = findings(r)
        if not parts:
            r.upstream = None
            continue
        r.upstream = placed = _placed(entries, r, parts)
        headline = next((u.verdict for u in placed if u.path == (r.worst_schedule or "")), None)
        r.verdict = str(by_design(headline or r.verdict, [u.class_name for u in placed]))
    return list(records)


def _placed(entries: Sequence[Entry], record: Record, parts: Sequence[Part]) -> list[Upstream]:
    """Each part of `record` with its class and the threads that cover it (`place`'s entries)."""
    by_id = {e.id: e for e in entries}
    out = []
    for p in parts:
        covering = [e for e in entries if e.covers(engine_of(record), record.model_type, p)]
        out.append(Upstream(p.path, p.shape, p.verdict, classify(covering, record, by_id),
                            [e.brief() for e in covering if e.status != "new"],
                            "; ".join(e.searched for e in covering if e.status == "new" and e.searched) or None))
    return out


def of_run(comparison, engine: str, model_type: str, release: Optional[str], name_of=None,
           entries: Optional[Sequence[Entry]] = None) -> list[Upstream]:
    """The findings of one `compare` run outside a census (`compare --impl hf|vllm|llamacpp` on one
    model) placed as `place` places a record's: each run that failed (bug, unconfirmed) or crashed
    is a part, its path named as that engine's census names the same steps (`name_of(schedule,
    steps)`; default: the schedule's own name), its shape from its error (`shapes.classify`: a
    boundary's own shape, else the error's profile). The census names some shapes from reruns a
    compare does not make (a cache that misreports its length), so an entry of such a shape does not
    cover a compare run: it reads `new`, and `--check` fails on it as before."""
    from ..measure.schedules import shape as registered_shape
    from ..judging.verdicts import CRASHED
    from ..measure.shapes import classify as shape_of

    if str(comparison.word) not in FINDING_WORDS:  # ok, or no finding at all (inconclusive): nothing to place
        return []
    entries = load() if entries is None else tuple(entries)
    name_of = name_of or (lambda schedule, steps: schedule)
    parts: list[Part] = []
    for m in comparison.failures:
        threshold = m.noise.per_layer[-1] * m.tolerance
        path = name_of(m.schedule, list(m.steps))
        err, steps = m.abs_err[-1].tolist(), list(m.steps)
        # an error profile reads positions against steps that cover them; an engine's own schedule
        # (two sequences in one call) has steps of its own: its registered shape, or none
        shape = (shape_of(err, steps, threshold, schedule=m.schedule) if sum(steps) == len(err)
                 else registered_shape(m.schedule) or "")
        parts.append(Part(path, shape, str(comparison.status(m))))
    for r in comparison.crashed:
        parts.append(Part(name_of(r.schedule, list(r.steps or [])), "", str(CRASHED)))
    parts = list({(p.path, p.verdict): p for p in parts}.values())  # several series of one path: once
    return _placed(entries, record_of(model_type, "ok", **engines.stamped(engine, release)), parts)


def gated(placed: Sequence[Upstream]) -> list[Upstream]:
    """The placed findings of one run that `--check` fails on: new ones and regressions."""
    return [u for u in placed if u.class_name in FAILS_CHECK]


def lines(placed: Sequence[Upstream]) -> list[str]:
    """One console line per placed finding of a run: its path, its class and the threads."""
    out = []
    for u in placed:
        where = "; ".join(f"{reference(t.url)} [{t.status}]" + (f" {t.title}" if t.title else "")
                          for t in u.threads)
        out.append(f"upstream: {u.path} ({u.verdict}) is {u.class_name}: "
                   + (where or "no public thread matches (smearcli/census/known.toml)"))
    return out


def worst(record: Record) -> Optional[str]:
    """The most pressing class of a record's findings (new first), None when it has none."""
    classes = [u.class_name for u in record.upstream or []]
    return min(classes, key=CLASSES.index) if classes else None


def failing(records: Sequence[Record], words: Sequence[str]) -> list[Record]:
    """The records `scan --check` fails on: a word of the engine's `failing`, with a finding that is
    new or a regression (a known open bug, a bug fixed later, a departure by design: listed only)."""
    return [r for r in records if r.verdict in words and worst(r) in FAILS_CHECK]


def summary(records: Sequence[Record]) -> Optional[str]:
    """The page's line under the counts: the findings by what upstream knows, new first."""
    n = {c: 0 for c in CLASSES}
    for r in records:
        for u in r.upstream or []:
            n[u.class_name] += 1
    if not any(n.values()):
        return None
    words = {NEW: "new", REGRESSION: "regression" if n[REGRESSION] == 1 else "regressions",
             OPEN: "known and open upstream", FIXED_LATER: "fixed in a later release", DESIGNED: "by design"}
    total = sum(n.values())
    return (f"**{n[NEW]} new finding{'s' * (n[NEW] != 1)}** of {total} against what upstream knows: "
            + ", ".join(f"{n[c]} {words[c]}" for c in CLASSES if n[c]) + " (`smearcli/census/known.toml`).")


def cell(record: Record, path: Optional[str] = None) -> str:
    """One Markdown cell: `new`, or each covering thread linked with its status (a regression says so)."""
    ups = [u for u in record.upstream or [] if path is None or u.path == path]
    if not ups:
        return "-"
    out = []
    for u in ups:
        if not u.threads:
            out.append(u.class_name)
            continue
        links = ", ".join(f"[{t.status}]({t.url})" for t in u.threads)
        out.append(links + (f": {u.class_name}" if u.class_name in (REGRESSION,) else ""))
    return "; ".join(dict.fromkeys(out))


def console(record: Record) -> Optional[str]:
    """The console's line under a finding: "upstream: new", "upstream: open <url>", ..."""
    ups = record.upstream or []
    if not ups:
        return None
    u = min(ups, key=lambda u: CLASSES.index(u.class_name))
    return f"upstream: {u.class_name}" + (f" {reference(u.threads[0].url)}" if u.threads else "")


def reference(url: str) -> str:
    """A GitHub thread as GitHub writes a reference ("huggingface/transformers#123"); any other url as it is."""
    m = GITHUB.fullmatch(url)
    return f"{m[1]}#{m[2]}" if m else url


def stale(records: Sequence[Record], entries: Optional[Sequence[Entry]] = None) -> list[Entry]:
    """The entries of the records' engine that match no finding although the census checked one of
    their architectures: fixed upstream, or our rule changed (say so, and mend the table)."""
    entries = load() if entries is None else tuple(entries)
    if not records:
        return []
    engine = engine_of(records[0])
    checked = {r.model_type for r in records}
    used = {t.id for r in records for u in r.upstream or [] for t in u.threads}
    used |= {e.id for r in records for p in findings(r) for e in entries
             if e.covers(engine, r.model_type, p)}
    return [e for e in entries if e.engine == engine and e.id not in used and checked & set(e.architectures)]
