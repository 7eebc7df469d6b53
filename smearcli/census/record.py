"""One architecture's census record: every field it carries, with its JSON type and its default,
declared once here.

`Record` is what every engine's check returns (`new`: a field it does not declare is a TypeError,
not a key that `report.document` would drop in silence) and what every reader takes: it stays a
`Record` from the check through `isolate`, the record file and the report. JSON exists only at the
edges: `to_json` where a record crosses the pipe from a census worker or is written to a file,
`from_json` where one is read back (`records.check_record` holds the JSON to `JSON_TYPES` first,
so an edited record with a string where a number goes is refused with the file and line, not an
internal error half way through the report). `FIELDS` is the order the JSON document lists them
in. A field added here reaches the record files, the JSON document and the type check at once
(tests/census/test_scan_record.py holds every surface to this list). `built_from` is the one field
that never leaves the process: the config the check built the model from, which the reachability
runs and the reproducer rebuild.

A record is typed all the way down. A field that holds more than one value holds parts (`Part`:
`ScheduleResult` per schedule, `BoundaryResult` per boundary, `BornIn`, `Variant` per layer order,
`ConfirmationEntry`, `PowerEntry`, `ReachEntry` per public path, `Replication`, `Upstream` per
finding; `PARTS` says which field holds which, and how), and a part given as a JSON object, where
the record is made or read, is read as its part. Readers use attributes: only this module and
`records` see the JSON.

The core declares no engine's field. What an engine keeps at a record's top level (vLLM's release
and data, llama.cpp's data) its folder declares and its registration adds (`hold`): a held field
is read and set like a declared one, typed as its part, and its JSON follows the declared fields in
the order the engines registered (`FIELDS`), which is the order the record files have always had.

Kept torch-free: the parent of a census, `--merge` and the report read records without torch.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Optional

# JSON types a field may hold (null is always allowed): the Python types it reads as, and the words
STRING, NUMBER, INTEGER = ((str,), "a string"), ((int, float), "a number"), ((int,), "an integer")
LIST, OBJECT = ((list,), "a list"), ((dict,), "an object")


BOOLEAN = ((bool,), "true or false")
# how a field holds parts: ONE part, a dict of them BY_NAME, or a LIST_OF them
ONE, BY_NAME, LIST_OF = "one", "by name", "list"
ABSENT = object()  # a field of a part never given: left out of its JSON (`Part`)


def part_field(kind, key: Optional[str] = None):
    """A part's field: never given until a value is, of the JSON type `kind`; `key`: its name in
    the JSON where that is not the attribute's (a Python keyword: "class")."""
    return field(default=ABSENT, metadata={"json": kind, **({"key": key} if key else {})})


class Part:
    """A nested part of a record (one schedule's result, one boundary's) whose JSON holds exactly
    what its writer gave it: a field is in the JSON once it has been given a value, None included,
    at construction or later; one never given reads None and is left out. `extra`: keys a file
    holds that no field declares, kept as they were. Subclasses are dataclasses whose fields (all
    but `extra`) are made with `part_field`, which says each one's JSON type (`types()`, what
    `records.check_record` holds a file's entries to).

    `AS_GIVEN`: the JSON lists the fields in the order they were first given (a file's order when
    read back), so a part reads out as its writer built it; otherwise in the declaration's order."""

    AS_GIVEN = False

    def __setattr__(self, name: str, value) -> None:
        if name in self.names():
            given = self.__dict__.setdefault("_given", {})
            if value is ABSENT:
                value = None
            else:
                given.setdefault(name, None)
                value = self._read(name, value)  # a nested part given as a JSON object is read as its part
        object.__setattr__(self, name, value)

    def __eq__(self, other) -> bool:
        return type(other) is type(self) and self.to_json() == other.to_json()

    @classmethod
    def names(cls) -> tuple[str, ...]:
        if "_names" not in cls.__dict__:  # once per kind of part: every assignment asks
            cls._names = tuple(f.name for f in dataclasses.fields(cls) if f.name != "extra")
        return cls._names

    @classmethod
    def keys(cls) -> dict:
        """attribute -> its key in the JSON (the same name unless the field says otherwise)."""
        return {f.name: f.metadata.get("key", f.name) for f in dataclasses.fields(cls) if f.name != "extra"}

    @classmethod
    def types(cls) -> dict:
        """JSON key -> its JSON type (STRING, NUMBER, ...): the type check of a file's entries."""
        return {f.metadata.get("key", f.name): f.metadata["json"] for f in dataclasses.fields(cls)
                if "json" in f.metadata}

    def given(self, name: str) -> bool:
        """Whether `name` was given a value (and so is in the JSON)."""
        return name in self.__dict__.get("_given", ())

    def _order(self) -> list[str]:
        given = self.__dict__.get("_given", {})
        return list(given) if self.AS_GIVEN else [n for n in self.names() if n in given]

    def but(self, **fields) -> "Part":
        """A copy with `fields` given (the fields given here stay given there, in the same order)."""
        out = type(self)(extra=dict(self.extra))
        for name in self._order():
            setattr(out, name, getattr(self, name))
        for name, value in fields.items():
            setattr(out, name, value)
        return out

    def to_json(self) -> dict:
        out, keys = {}, self.keys()
        for name in self._order():
            out[keys[name]] = _json(getattr(self, name))
        return {**out, **self.extra}

    @classmethod
    def from_json(cls, d: dict) -> "Part":
        """The part a JSON object holds (`records.check_record` checked its types), in its order."""
        names = {key: name for name, key in cls.keys().items()}
        out = cls(extra={k: v for k, v in d.items() if k not in names})
        for key, value in d.items():
            if key in names:
                setattr(out, names[key], value)
        return out

    NESTED: dict = {}  # field -> (its kind of part, ONE or BY_NAME): the parts inside this one

    @classmethod
    def _read(cls, name: str, value):
        if name not in cls.NESTED:
            return value
        kind, how = cls.NESTED[name]
        return typed((part_kind(kind), how), value)


def part_kind(kind):
    """A part's class, named by a string where the class is declared after the one naming it."""
    return globals()[kind] if isinstance(kind, str) else kind


def _json(value):
    """A part's value as JSON: a part, a dict or a list of parts, each part's own JSON."""
    if isinstance(value, Part):
        return value.to_json()
    if isinstance(value, dict) and any(isinstance(v, Part) for v in value.values()):
        return {k: _json(v) for k, v in value.items()}
    if isinstance(value, list) and any(isinstance(v, Part) for v in value):
        return [_json(v) for v in value]
    return value


@dataclass(eq=False)
class ScheduleResult(Part):
    """One schedule's result in a record (`Record.schedules[name]`): a step plan or an engine's
    schedule ("chunked@13", "ubatch"), as the engine that ran it measured it against the reference.

    A run that was measured holds its numbers (`max_abs`, `multiple`), whether it is within the
    tolerance (`passed`, transformers') and its status once judged; one that was not its status and
    `why`. A departure rerun in float64 holds its `confirmation`; llama.cpp's runs their distance
    from llama.cpp's own one-call prefill (`vs_prefill`) and the first position past it (`first`);
    a run of several steps its step sizes (`steps`, "3,3,3", at most 12)."""

    AS_GIVEN = True

    status: Optional[str] = part_field(STRING)  # a word of smearcli.judging.verdicts, as `judge.status` gives it
    max_abs: Optional[float] = part_field(NUMBER)
    multiple: Optional[float] = part_field(NUMBER)
    passed: Optional[bool] = part_field(BOOLEAN)
    why: Optional[str] = part_field(STRING)
    confirmation: Optional["ConfirmationEntry"] = part_field(OBJECT)  # the departure rerun in float64
    vs_prefill: Optional[float] = part_field(NUMBER)
    first: Optional[int] = part_field(INTEGER)
    steps: Optional[str] = part_field(STRING)
    shape: Optional[str] = part_field(STRING)  # as a boundary's entry has them (docs/schemas/scan-1.json)
    mode: Optional[str] = part_field(STRING)
    extra: dict = field(default_factory=dict)

    NESTED = {"confirmation": ("ConfirmationEntry", ONE)}


@dataclass(eq=False)
class BoundaryResult(Part):
    """One boundary's result in a record (`Record.boundaries[name]`: padded, rollback, ...), or one
    way of taking rollback's drafts back (its `their_crop` and `copy`), as `engines.transformers.boundary` makes it.

    Each kind of result holds its own fields: every entry its status, numbers, shape, mode and why;
    padded its pad id, positions and rows; rollback its confirmation, both ways and what `generate`
    refuses; a failure beside the headline its reproducer; a way the library declares unsupported
    `declared` and `api_finding`. Its JSON lists them in this order (`Part`)."""

    status: Optional[str] = part_field(STRING)  # passed / ok / bug / crashed / not run / ... (smearcli.judging.verdicts)
    max_abs: Optional[float] = part_field(NUMBER)
    multiple: Optional[float] = part_field(NUMBER)
    shape: Optional[str] = part_field(STRING)  # a failure's shape: the boundary's own (`schedules.shape`)
    mode: Optional[str] = part_field(STRING)  # rollback: how the headline run took the drafts back (crop, copy)
    why: Optional[str] = part_field(STRING)
    confirmation: Optional["ConfirmationEntry"] = part_field(OBJECT)  # a failure rerun in float64
    declared: Optional[str] = part_field(STRING)  # their crop: what the library declares unsupported, quoted
    api_finding: Optional["ApiFinding"] = part_field(OBJECT)  # their crop, declared unsupported, ran anyway and departed
    pad_id: Optional[int] = part_field(INTEGER)  # padded: the id padding holds
    positions: Optional[bool] = part_field(BOOLEAN)  # padded: whether explicit position_ids were passed
    rows: Optional[dict] = part_field(OBJECT)  # padded: max |dlogit| per row of the batch
    their_crop: Optional["BoundaryResult"] = part_field(OBJECT)  # rollback through their cache API
    copy: Optional["BoundaryResult"] = part_field(OBJECT)  # rollback through a copy taken before each draft
    generate_refuses: Optional[str] = part_field(STRING)  # rollback: why generate() refuses assisted decoding
    reproducer: Optional[str] = part_field(STRING)  # a failure beside another headline: its own reproducer
    reproducer_status: Optional[int] = part_field(INTEGER)
    extra: dict = field(default_factory=dict)

    NESTED = {"confirmation": ("ConfirmationEntry", ONE), "their_crop": ("BoundaryResult", ONE),
              "copy": ("BoundaryResult", ONE), "api_finding": ("ApiFinding", ONE)}


@dataclass(eq=False)
class ApiFinding(Part):
    """A path the library declares unsupported whose call their API accepted anyway and got wrong
    (`BoundaryResult.api_finding`, `engines.transformers.boundary.declared`): the API's code that did
    it (`at`: the cache layer's `crop`), what it left wrong, and the word."""

    AS_GIVEN = True

    at: Optional[str] = part_field(STRING)
    what: Optional[str] = part_field(STRING)
    status: Optional[str] = part_field(STRING)
    extra: dict = field(default_factory=dict)


@dataclass(eq=False)
class ConfirmationEntry(Part):
    """A departure rerun in float64, as a record keeps it (`smearcli.judging.evidence.Confirmation`,
    its `to_json`): its size in the run's own precision and in float64 with the float32 islands
    lifted, the bound float64 rounding could leave, the word that makes it (`status`) and why. A
    plain float64 cast (`float64`, without the lift) is filled in for the headline alone."""

    AS_GIVEN = True

    status: Optional[str] = part_field(STRING)  # bug, rounding or unconfirmed
    dtype: Optional[str] = part_field(STRING)
    original: Optional[float] = part_field(NUMBER)
    float64: Optional[float] = part_field(NUMBER)
    float64_lifted: Optional[float] = part_field(NUMBER)
    rounding_bound: Optional[float] = part_field(NUMBER)
    why: Optional[str] = part_field(STRING)
    extra: dict = field(default_factory=dict)


@dataclass(eq=False)
class PowerEntry(Part):
    """What zeroing each kind of carried state showed (`smearcli.judging.evidence.Power`, its
    `to_json`): how far each moves the logits after `split` tokens, and the share of that effect an
    error must have to show past `threshold`."""

    AS_GIVEN = True

    split: Optional[int] = part_field(INTEGER)
    threshold: Optional[float] = part_field(NUMBER)
    effects: Optional[dict] = part_field(OBJECT)  # state kind -> max |dlogit| with it zeroed
    detectable_fraction: Optional[dict] = part_field(OBJECT)  # state kind -> the share an error must have to show
    min_power: Optional[float] = part_field(NUMBER)
    sufficient: Optional[bool] = part_field(BOOLEAN)
    why: Optional[str] = part_field(STRING)
    extra: dict = field(default_factory=dict)


@dataclass(eq=False)
class ReachEntry(Part):
    """A finding run through one path of the public API (`Record.reach[path]`,
    `engines.transformers.reach`): what it gave (`result`: "silently wrong", "raises first", ...),
    how far, and where the numbers come from."""

    AS_GIVEN = True

    result: Optional[str] = part_field(STRING)
    max_abs: Optional[float] = part_field(NUMBER)
    gap: Optional[float] = part_field(NUMBER)
    numbered: Optional[float] = part_field(NUMBER)
    tokens: Optional[str] = part_field(STRING)  # its tokens against the row's own generate
    lazy: Optional[float] = part_field(NUMBER)
    assistant: Optional[str] = part_field(STRING)
    why: Optional[str] = part_field(STRING)
    extra: dict = field(default_factory=dict)


@dataclass(eq=False)
class Rerun(Part):
    """What one rerun of a finding gave (a second seed, a tie-break, the default counts): its word,
    schedule and size, and its shape or (llama.cpp) its kind of departure."""

    AS_GIVEN = True

    verdict: Optional[str] = part_field(STRING)
    worst_schedule: Optional[str] = part_field(STRING)
    max_abs: Optional[float] = part_field(NUMBER)
    shape: Optional[str] = part_field(STRING)
    departure: Optional[str] = part_field(STRING)
    reason: Optional[str] = part_field(STRING)
    extra: dict = field(default_factory=dict)


@dataclass(eq=False)
class DefaultCounts(Part):
    """A finding rerun at the head and expert counts the derivation shrank, restored
    (`tiny.derive.default_counts`): what was restored and skipped, the rerun, and each kind of count
    alone where all at once could not run."""

    AS_GIVEN = True

    restored: Optional[dict] = part_field(OBJECT)
    skipped: Optional[dict] = part_field(OBJECT)
    rerun: Optional[Rerun] = part_field(OBJECT)
    ties: Optional[int] = part_field(INTEGER)
    reason: Optional[str] = part_field(STRING)
    alone: Optional[dict] = part_field(OBJECT)  # kind of count -> its `Rerun`
    extra: dict = field(default_factory=dict)

    NESTED = {"rerun": (Rerun, ONE), "alone": (Rerun, BY_NAME)}


@dataclass(eq=False)
class Replication(Part):
    """A finding put to its reruns before it is called one (`Record.replication`): exact ties seen,
    a tie-break, a second seed, the default counts."""

    AS_GIVEN = True

    ties: Optional[int] = part_field(INTEGER)
    tie_break: Optional[Rerun] = part_field(OBJECT)
    seed: Optional[int] = part_field(INTEGER)
    second_seed: Optional[Rerun] = part_field(OBJECT)
    default_counts: Optional[DefaultCounts] = part_field(OBJECT)
    extra: dict = field(default_factory=dict)

    NESTED = {"tie_break": (Rerun, ONE), "second_seed": (Rerun, ONE), "default_counts": (DefaultCounts, ONE)}


@dataclass(eq=False)
class Thread(Part):
    """A public thread that covers a finding, as a record keeps it (`known.Entry.brief`): enough to
    link and quote it without the table."""

    AS_GIVEN = True

    id: Optional[str] = part_field(STRING)
    status: Optional[str] = part_field(STRING)
    url: Optional[str] = part_field(STRING)
    title: Optional[str] = part_field(STRING)
    quote: Optional[str] = part_field(STRING)
    extra: dict = field(default_factory=dict)


@dataclass(eq=False)
class Upstream(Part):
    """One finding of a record placed against what upstream knows (`Record.upstream`, `census.known`):
    its path, shape and word, its class (new, open, by design, ...), the threads that cover it and
    where a new one was searched."""

    AS_GIVEN = True

    path: Optional[str] = part_field(STRING)
    shape: Optional[str] = part_field(STRING)
    verdict: Optional[str] = part_field(STRING)
    class_name: Optional[str] = part_field(STRING, key="class")
    threads: Optional[list] = part_field(LIST)  # a `Thread` each
    searched: Optional[str] = part_field(STRING)
    extra: dict = field(default_factory=dict)

    NESTED = {"threads": (Thread, LIST_OF)}


@dataclass(eq=False)
class BornIn(Part):
    """Where a finding on a step plan is born (`Record.born_in`, `engines.transformers.born`): the
    first module whose output leaves the floor while the inputs it receives agree, with its class's
    `forward` (file, first and last line, a digest of its code with the model's names normalised,
    the suspect lines inside it), the position and the first capture point off. A trace that found
    no module holds `module` None and `why`; the classes its class declares it copies
    (`copies`) and the state a replay showed to be the cause (`cause`) come later."""

    AS_GIVEN = True

    module: Optional[str] = part_field(STRING)  # its qualified name in the model; None: none found (`why`)
    class_name: Optional[str] = part_field(STRING, key="class")
    file: Optional[str] = part_field(STRING)  # "transformers/models/x/modeling_x.py"
    lines: Optional[list] = part_field(LIST)  # [first, last] line of the forward
    code: Optional[str] = part_field(STRING)  # the forward's digest, names normalised (`groups`)
    suspects: Optional[list] = part_field(LIST)  # [line, text, what the pattern means] each
    position: Optional[int] = part_field(INTEGER)
    first_off: Optional[str] = part_field(STRING)  # the first capture point off (not the module's inputs)
    multiple: Optional[float] = part_field(NUMBER)
    cause: Optional[str] = part_field(STRING)
    copies: Optional[list] = part_field(LIST)  # the classes it declares it copies (`# Copied from`, modular)
    why: Optional[str] = part_field(STRING)
    extra: dict = field(default_factory=dict)

    def named(self) -> bool:
        """Whether it names a module (not a trace that found none)."""
        return isinstance(self.module, str) and bool(self.module)

    def span(self) -> Optional[tuple[int, int]]:
        """(first, last) line of the forward, or None where an edited file holds something else."""
        ok = isinstance(self.lines, list) and len(self.lines) == 2 and all(type(x) is int for x in self.lines)
        return (self.lines[0], self.lines[1]) if ok else None

    def suspect_lines(self) -> list:
        """The suspect lines, each [line, text, what], those an edited file malformed left out."""
        found = self.suspects if isinstance(self.suspects, list) else []
        return [x for x in found if isinstance(x, list) and len(x) >= 2 and isinstance(x[1], str)]

    def copied(self) -> list[str]:
        """The classes it declares it copies ([] when none was read)."""
        return [c for c in self.copies if isinstance(c, str)] if isinstance(self.copies, list) else []


@dataclass(eq=False)
class Variant(Part):
    """One layer order's verdict and numbers (`Record.variants`, `engines.transformers.orders`)."""

    AS_GIVEN = True

    order: Optional[list] = part_field(LIST)  # its layer kinds, layer 0 first
    verdict: Optional[str] = part_field(STRING)
    worst_schedule: Optional[str] = part_field(STRING)
    max_abs: Optional[float] = part_field(NUMBER)
    multiple: Optional[float] = part_field(NUMBER)
    shape: Optional[str] = part_field(STRING)
    born_at: Optional[str] = part_field(STRING)
    born_in: Optional[BornIn] = part_field(OBJECT)
    init: Optional[float] = part_field(NUMBER)
    reason: Optional[str] = part_field(STRING)
    extra: dict = field(default_factory=dict)

    NESTED = {"born_in": (BornIn, ONE)}


def _f(kind, default=None, factory=None):
    if factory is not None:
        return field(default_factory=factory, metadata={"json": kind})
    return field(default=default, metadata={"json": kind})


@dataclass
class Record:
    model_type: str  # the config's model_type, as transformers registers it
    verdict: str  # a word of smearcli.judging.verdicts (the worst over the layer orders)
    worst_schedule: Optional[str] = _f(STRING)  # the finding's schedule (a step plan or a boundary)
    max_abs: Optional[float] = _f(NUMBER)  # its largest |dlogit|
    multiple: Optional[float] = _f(NUMBER)  # ... as a multiple of the float64 floor
    shape: Optional[str] = _f(STRING)  # the failure's shape (smearcli.measure.shapes, or the boundary's)
    born_at: Optional[str] = _f(STRING)  # the first capture point@position past the floor
    born_in: Optional[BornIn] = _f(OBJECT)  # the first module whose output departs (engines.transformers.born)
    init: Optional[float] = _f(NUMBER)  # the initializer_range the verdict came at (None: default)
    floor: Optional[float] = _f(NUMBER)  # the logits' float64 floor
    floor_source: Optional[str] = _f(STRING)  # where the floor came from
    power: Optional[PowerEntry] = _f(OBJECT)  # what zeroing each kind of state showed (evidence.Power)
    confirmation: Optional[ConfirmationEntry] = _f(OBJECT)  # the finding rerun in float64 (evidence.Confirmation)
    reach: Optional[dict] = _f(OBJECT)  # the finding through the public API: path -> its `ReachEntry` (engines.transformers.reach)
    replication: Optional[Replication] = _f(OBJECT)  # the finding rerun on a second seed, under a tie-break (engines.transformers.ties)
    upstream: Optional[list] = _f(LIST)  # each finding placed against what upstream knows: an `Upstream` each (census.known)
    model_class: Optional[str] = _f(STRING)
    reason: Optional[str] = _f(STRING)  # why it is crashed or not built
    notes: list = _f(LIST, factory=list)
    schedules: dict = _f(OBJECT, factory=dict)  # name -> its `ScheduleResult`
    steps: Optional[list] = _f(LIST)  # the finding's step sizes
    config: Optional[dict] = _f(OBJECT)  # the derived tiny config's summary
    vocab: Optional[int] = _f(INTEGER, 256)  # the token ids drawn below it
    reproducer: Optional[str] = _f(STRING)  # the standalone reproducer's path
    reproducer_status: Optional[int] = _f(INTEGER)  # its exit status when run once
    reproducer_output: Optional[str] = _f(STRING)  # its last line when run once (the vLLM engine's)
    report_draft: Optional[str] = _f(STRING)  # the bug-report draft's path
    boundaries: dict = _f(OBJECT, factory=dict)  # padded, rollback, ...: one `BoundaryResult` each
    order: Optional[list] = _f(LIST)  # the layer kinds, layer 0 first, of the order that heads the record
    variants: Optional[list] = _f(LIST)  # each layer order's verdict and numbers: a `Variant` each
    wall_s: Optional[float] = _f(NUMBER)  # seconds the architecture took (census.isolate)
    transformers_version: Optional[str] = _f(STRING)  # the release of the reference that made the record
    engine: Optional[str] = _f(STRING)  # the engine that made it (None: the unnamed engine's, `census.engines`)
    # the fields engines hold at the record's top level (`hold`: vLLM's release and data, llama.cpp's
    # data), after these in the JSON, in the order the engines registered them: name -> value
    held: dict = field(default_factory=dict, repr=False)
    # in this process only, never serialised: the config the model was built from (None: not built)
    built_from: object = field(default=None, repr=False, compare=False)

    def __setattr__(self, name: str, value) -> None:
        # a record's parts are typed however they are given: a part given as a JSON object (a file
        # read back, a check's fields) is read as its part (`PARTS`); an engine's field is held
        if name in PARTS:
            value = typed(PARTS[name], value)
        if name in HELD:  # held where given: a null is no entry, so records equal by what they say
            if value is None:
                self.held.pop(name, None)
            else:
                self.held[name] = value
            return
        object.__setattr__(self, name, value)

    def __getattr__(self, name: str):
        # only for a name the class does not have: an engine's field (None until given)
        if name in HELD:
            return self.__dict__.get("held", {}).get(name)
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    def to_json(self) -> dict:
        """The record as JSON-ready dict: every field of `FIELDS`, in its order (an engine's field
        it was never given: null, as a declared one's)."""
        out = {name: getattr(self, name) for name in FIELDS}
        for name in PARTS:
            out[name] = _json(out[name])
        return out

    @classmethod
    def from_json(cls, d: dict) -> "Record":
        """The record a JSON object holds (checked by `records.check_record` first). A field the
        object lacks reads as null, as the JSON document has always shown it; a key no field
        declares (an engine's, where that engine is not registered) is left out, as the document
        leaves it out."""
        return new(d.get("model_type"), d.get("verdict"), **{name: d.get(name) for name in FIELDS[2:]})


# the fields that hold parts: (the kind of part, how it holds them)
PARTS = {"born_in": (BornIn, ONE), "schedules": (ScheduleResult, BY_NAME), "boundaries": (BoundaryResult, BY_NAME),
         "variants": (Variant, LIST_OF), "confirmation": (ConfirmationEntry, ONE), "power": (PowerEntry, ONE),
         "reach": (ReachEntry, BY_NAME), "replication": (Replication, ONE), "upstream": (Upstream, LIST_OF)}


def hold(name: str, kind) -> None:
    """From now on a record holds the field `name` at its top level, after the fields declared here:
    an engine's own (`census.engines.Engine.data`, registered with the engine: vLLM's release and
    data, llama.cpp's data), declared in its folder, so that the core names no engine. `kind` is a
    JSON kind (`STRING`, ...) or a `Part` subclass, whose JSON object the record then reads as one
    part. Registering a held field again (a test's engine shadowing one) keeps its place."""
    if name in DECLARED or name == "held":
        raise ValueError(f"{name!r} is a field every record declares, not one an engine holds")
    if isinstance(kind, type) and issubclass(kind, Part):
        PARTS[name] = (kind, ONE)
        kind = OBJECT
    JSON_TYPES[name] = kind
    if name not in HELD:
        HELD.append(name)
        FIELDS.append(name)
        if name.endswith("_version"):
            VERSIONS.append(name)


def typed(how: tuple, value):
    """`value` of a field that holds parts (`how`: the kind of part, and ONE, BY_NAME or LIST_OF),
    each part given as a JSON object read as its part."""
    kind = how[0]
    return _parts(how, value, lambda e: kind.from_json(e) if isinstance(e, dict) else e)


def _parts(how: tuple, value, each):
    """`value` of a field that holds parts, `each` applied to every part in it (anything else kept)."""
    shape = how[1]
    if shape == ONE:
        return each(value) if value is not None else None
    if shape == BY_NAME and isinstance(value, dict):
        return {k: each(e) for k, e in value.items()}
    if shape == LIST_OF and isinstance(value, list):
        return [each(e) for e in value]
    return value
# the fields every record declares, in the order its JSON holds them: all but `held` (whose fields
# follow) and `built_from`, which never leaves the process
DECLARED = tuple(f.name for f in dataclasses.fields(Record)
                 if "json" in f.metadata or f.name in ("model_type", "verdict"))
HELD: list = []  # the engines' fields (`hold`), in the order they were registered
# every field a record's JSON holds, in order, and the JSON type of each: the declared ones, then
# the engines' (lists and a dict that `hold` extends in place, so that a module's alias follows)
FIELDS: list = list(DECLARED)
JSON_TYPES = {f.name: f.metadata["json"] for f in dataclasses.fields(Record) if "json" in f.metadata}
# the releases a record names (the reference's; an engine's, where the engine holds it at the top),
# which a page's title reads when the run's meta lacks them (a `--merge`)
VERSIONS: list = [f for f in FIELDS if f.endswith("_version")]


def born_module(rec: "Record") -> Optional[BornIn]:
    """A record's `born_in` when it names a module (None otherwise: a boundary finding, a trace that
    found none)."""
    b = rec.born_in
    return b if isinstance(b, BornIn) and b.named() else None


def new(model_type: str, verdict: str, **fields) -> Record:
    """A record, every field present (defaults for those not given); an engine's field (`hold`) is
    given like any other."""
    held = {k: fields.pop(k) for k in list(fields) if k in HELD}
    rec = Record(model_type, str(verdict), **fields)
    for name, value in held.items():
        setattr(rec, name, value)
    return rec


def bare(model_type: str, verdict: str, **fields) -> Record:
    """A record that says only what it is given, every other field null: what is known of an
    architecture whose process died or ran out of time (`isolate`, `budget`)."""
    return Record.from_json({"model_type": model_type, "verdict": str(verdict), **fields})
