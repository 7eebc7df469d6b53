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
ABSENT = object()  # a field of a part never given: left out of its JSON (`Part`)


def _p(kind, key: Optional[str] = None):
    """A part's field: never given until a value is, of the JSON type `kind`; `key`: its name in
    the JSON where that is not the attribute's (a Python keyword: "class")."""
    return field(default=ABSENT, metadata={"json": kind, **({"key": key} if key else {})})


class Part:
    """A nested part of a record (one schedule's result, one boundary's) whose JSON holds exactly
    what its writer gave it: a field is in the JSON once it has been given a value, None included,
    at construction or later; one never given reads None and is left out. `extra`: keys a file
    holds that no field declares, kept as they were. Subclasses are dataclasses whose fields (all
    but `extra`) are made with `_p`, which says each one's JSON type (`types()`, what
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
            value = getattr(self, name)
            out[keys[name]] = value.to_json() if isinstance(value, Part) else value
        return {**out, **self.extra}

    @classmethod
    def from_json(cls, d: dict) -> "Part":
        """The part a JSON object holds (`records.check_record` checked its types), in its order."""
        names = {key: name for name, key in cls.keys().items()}
        out = cls(extra={k: v for k, v in d.items() if k not in names})
        for key, value in d.items():
            if key in names:
                setattr(out, names[key], cls._read(names[key], value))
        return out

    @classmethod
    def _read(cls, name: str, value):
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

    status: Optional[str] = _p(STRING)  # a word of smearcli.judging.verdicts, as `judge.status` gives it
    max_abs: Optional[float] = _p(NUMBER)
    multiple: Optional[float] = _p(NUMBER)
    passed: Optional[bool] = _p(BOOLEAN)
    why: Optional[str] = _p(STRING)
    confirmation: Optional[dict] = _p(OBJECT)  # the departure rerun in float64 (evidence.Confirmation)
    vs_prefill: Optional[float] = _p(NUMBER)
    first: Optional[int] = _p(INTEGER)
    steps: Optional[str] = _p(STRING)
    extra: dict = field(default_factory=dict)


@dataclass(eq=False)
class BoundaryResult(Part):
    """One boundary's result in a record (`Record.boundaries[name]`: padded, rollback, ...), or one
    way of taking rollback's drafts back (its `their_crop` and `copy`), as `engines.transformers.boundary` makes it.

    Each kind of result holds its own fields: every entry its status, numbers, shape, mode and why;
    padded its pad id, positions and rows; rollback its confirmation, both ways and what `generate`
    refuses; a failure beside the headline its reproducer; a way the library declares unsupported
    `declared` and `api_finding`. Its JSON lists them in this order (`Part`)."""

    status: Optional[str] = _p(STRING)  # passed / ok / bug / crashed / not run / ... (smearcli.judging.verdicts)
    max_abs: Optional[float] = _p(NUMBER)
    multiple: Optional[float] = _p(NUMBER)
    shape: Optional[str] = _p(STRING)  # a failure's shape: the boundary's own (`schedules.shape`)
    mode: Optional[str] = _p(STRING)  # rollback: how the headline run took the drafts back (crop, copy)
    why: Optional[str] = _p(STRING)
    confirmation: Optional[dict] = _p(OBJECT)  # a failure rerun in float64 (evidence.Confirmation)
    declared: Optional[str] = _p(STRING)  # their crop: what the library declares unsupported, quoted
    api_finding: Optional[dict] = _p(OBJECT)  # their crop, declared unsupported, ran anyway and departed
    pad_id: Optional[int] = _p(INTEGER)  # padded: the id padding holds
    positions: Optional[bool] = _p(BOOLEAN)  # padded: whether explicit position_ids were passed
    rows: Optional[dict] = _p(OBJECT)  # padded: max |dlogit| per row of the batch
    their_crop: Optional["BoundaryResult"] = _p(OBJECT)  # rollback through their cache API
    copy: Optional["BoundaryResult"] = _p(OBJECT)  # rollback through a copy taken before each draft
    generate_refuses: Optional[str] = _p(STRING)  # rollback: why generate() refuses assisted decoding
    reproducer: Optional[str] = _p(STRING)  # a failure beside another headline: its own reproducer
    reproducer_status: Optional[int] = _p(INTEGER)
    extra: dict = field(default_factory=dict)

    @classmethod
    def _read(cls, name: str, value):
        return cls.from_json(value) if name in ("their_crop", "copy") and isinstance(value, dict) else value


@dataclass(eq=False)
class BornIn(Part):
    """Where a finding on a step plan is born (`Record.born_in`, `engines.transformers.born`): the
    first module whose output leaves the floor while the inputs it receives agree, with its class's
    `forward` (file, first and last line, a digest of its code with the model's names normalised,
    the suspect lines inside it), the position and the first capture point off. A trace that found
    no module holds `module` None and `why`; the classes its class declares it copies
    (`copies`) and the state a replay showed to be the cause (`cause`) come later."""

    AS_GIVEN = True

    module: Optional[str] = _p(STRING)  # its qualified name in the model; None: none found (`why`)
    class_name: Optional[str] = _p(STRING, key="class")
    file: Optional[str] = _p(STRING)  # "transformers/models/x/modeling_x.py"
    lines: Optional[list] = _p(LIST)  # [first, last] line of the forward
    code: Optional[str] = _p(STRING)  # the forward's digest, names normalised (`groups`)
    suspects: Optional[list] = _p(LIST)  # [line, text, what the pattern means] each
    position: Optional[int] = _p(INTEGER)
    first_off: Optional[str] = _p(STRING)  # the first capture point off (not the module's inputs)
    multiple: Optional[float] = _p(NUMBER)
    cause: Optional[str] = _p(STRING)
    copies: Optional[list] = _p(LIST)  # the classes it declares it copies (`# Copied from`, modular)
    why: Optional[str] = _p(STRING)
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

    order: Optional[list] = _p(LIST)  # its layer kinds, layer 0 first
    verdict: Optional[str] = _p(STRING)
    worst_schedule: Optional[str] = _p(STRING)
    max_abs: Optional[float] = _p(NUMBER)
    multiple: Optional[float] = _p(NUMBER)
    shape: Optional[str] = _p(STRING)
    born_at: Optional[str] = _p(STRING)
    born_in: Optional[BornIn] = _p(OBJECT)
    init: Optional[float] = _p(NUMBER)
    reason: Optional[str] = _p(STRING)
    extra: dict = field(default_factory=dict)

    @classmethod
    def _read(cls, name: str, value):
        return BornIn.from_json(value) if name == "born_in" and isinstance(value, dict) else value


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
    power: Optional[dict] = _f(OBJECT)  # what zeroing each kind of state showed (evidence.Power)
    confirmation: Optional[dict] = _f(OBJECT)  # the finding rerun in float64 (evidence.Confirmation)
    reach: Optional[dict] = _f(OBJECT)  # the finding through the public API: path -> result (engines.transformers.reach)
    replication: Optional[dict] = _f(OBJECT)  # the finding rerun on a second seed, under a tie-break (engines.transformers.ties)
    upstream: Optional[list] = _f(LIST)  # each finding placed against what upstream knows (census.known)
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
    transformers_version: Optional[str] = _f(STRING)  # the release that made the record
    engine: Optional[str] = _f(STRING)  # "vllm" for `scan --engine vllm` (None: transformers itself)
    vllm_version: Optional[str] = _f(STRING)  # the vLLM release, for the vLLM engine
    vllm: Optional[dict] = _f(OBJECT)  # the vLLM engine's start times and memory
    llamacpp: Optional[dict] = _f(OBJECT)  # the llama.cpp engine's version, GGUF, conversion, load and run times
    # in this process only, never serialised: the config the model was built from (None: not built)
    built_from: object = field(default=None, repr=False, compare=False)

    def __setattr__(self, name: str, value) -> None:
        # a record's parts are typed however they are given: a part given as a JSON object (a file
        # read back, a check's fields) is read as its part (`PARTS`)
        if name in PARTS:
            value = _parts(PARTS[name], value, lambda e: PARTS[name][0].from_json(e) if isinstance(e, dict) else e)
        object.__setattr__(self, name, value)

    def to_json(self) -> dict:
        """The record as JSON-ready dict: every field of `FIELDS`, in its order."""
        out = {name: getattr(self, name) for name in FIELDS}
        for name, how in PARTS.items():
            out[name] = _parts(how, out[name], lambda e: e.to_json() if isinstance(e, Part) else e)
        return out

    @classmethod
    def from_json(cls, d: dict) -> "Record":
        """The record a JSON object holds (checked by `records.check_record` first). A field the
        object lacks reads as null, as the JSON document has always shown it; a key no field
        declares is left out, as the document leaves it out."""
        fields = {name: d.get(name) for name in FIELDS}
        return cls(**fields)


# the fields that hold parts: (the kind of part, how: ONE part, a dict of them BY_NAME, or a LIST)
ONE, BY_NAME, LIST_OF = "one", "by name", "list"
PARTS = {"born_in": (BornIn, ONE), "schedules": (ScheduleResult, BY_NAME), "boundaries": (BoundaryResult, BY_NAME),
         "variants": (Variant, LIST_OF)}


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
# the fields a record's JSON holds, in order: all but `built_from`, which never leaves the process
FIELDS = tuple(f.name for f in dataclasses.fields(Record)
               if "json" in f.metadata or f.name in ("model_type", "verdict"))
JSON_TYPES = {f.name: f.metadata["json"] for f in dataclasses.fields(Record) if "json" in f.metadata}
# the releases a record names (its engine's, where the engine keeps it at the top; the reference's),
# which a page's title reads when the run's meta lacks them (a `--merge`)
VERSIONS = tuple(f for f in FIELDS if f.endswith("_version"))


def born_module(rec: "Record") -> Optional[BornIn]:
    """A record's `born_in` when it names a module (None otherwise: a boundary finding, a trace that
    found none)."""
    b = rec.born_in
    return b if isinstance(b, BornIn) and b.named() else None


def new(model_type: str, verdict: str, **fields) -> Record:
    """A record, every field present (defaults for those not given)."""
    return Record(model_type, str(verdict), **fields)


def bare(model_type: str, verdict: str, **fields) -> Record:
    """A record that says only what it is given, every other field null: what is known of an
    architecture whose process died or ran out of time (`isolate`, `budget`)."""
    return Record.from_json({"model_type": model_type, "verdict": str(verdict), **fields})
