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


ABSENT = object()  # a field of a boundary's result never given: left out of its JSON (`BoundaryResult`)


@dataclass(eq=False)
class BoundaryResult:
    """One boundary's result in a record (`Record.boundaries[name]`: padded, rollback, ...), or one
    way of taking rollback's drafts back (its `their_crop` and `copy`), as `engines.transformers.boundary` makes it.

    Each kind of result holds its own fields: every entry its status, numbers, shape, mode and why;
    padded its pad id, positions and rows; rollback its confirmation, both ways and what `generate`
    refuses; a failure beside the headline its reproducer; a way the library declares unsupported
    `declared` and `api_finding`. So a field is in the JSON (`to_json`, in this order) once it has
    been given a value, None included, at construction or later; one never given reads None and is
    left out, as the census has always written its entries. `extra`: keys a file holds that no field
    declares, kept as they were."""

    status: Optional[str] = ABSENT  # passed / ok / bug / crashed / not run / ... (smearcli.judging.verdicts)
    max_abs: Optional[float] = ABSENT
    multiple: Optional[float] = ABSENT
    shape: Optional[str] = ABSENT  # a failure's shape: the boundary's own (`schedules.shape`)
    mode: Optional[str] = ABSENT  # rollback: how the headline run took the drafts back (crop, copy)
    why: Optional[str] = ABSENT
    confirmation: Optional[dict] = ABSENT  # a failure rerun in float64 (evidence.Confirmation)
    declared: Optional[str] = ABSENT  # their crop: what the library declares unsupported, quoted
    api_finding: Optional[dict] = ABSENT  # their crop, declared unsupported, ran anyway and departed
    pad_id: Optional[int] = ABSENT  # padded: the id padding holds
    positions: Optional[bool] = ABSENT  # padded: whether explicit position_ids were passed
    rows: Optional[dict] = ABSENT  # padded: max |dlogit| per row of the batch
    their_crop: Optional["BoundaryResult"] = ABSENT  # rollback through their cache API
    copy: Optional["BoundaryResult"] = ABSENT  # rollback through a copy taken before each draft
    generate_refuses: Optional[str] = ABSENT  # rollback: why generate() refuses assisted decoding
    reproducer: Optional[str] = ABSENT  # a failure beside another headline: its own reproducer
    reproducer_status: Optional[int] = ABSENT
    extra: dict = field(default_factory=dict)

    def __setattr__(self, name: str, value) -> None:
        if name in _RESULT_FIELDS:
            given = self.__dict__.setdefault("_given", set())
            if value is ABSENT:
                value = None
            else:
                given.add(name)
        object.__setattr__(self, name, value)

    def __eq__(self, other) -> bool:
        return isinstance(other, BoundaryResult) and self.to_json() == other.to_json()

    def given(self, name: str) -> bool:
        """Whether `name` was given a value (and so is in the JSON)."""
        return name in self.__dict__.get("_given", ())

    def but(self, **fields) -> "BoundaryResult":
        """A copy with `fields` given (the fields given here stay given there)."""
        out = BoundaryResult(**{name: getattr(self, name) for name in _RESULT_FIELDS if self.given(name)},
                             extra=dict(self.extra))
        for name, value in fields.items():
            setattr(out, name, value)
        return out

    def to_json(self) -> dict:
        out = {}
        for name in _RESULT_FIELDS:
            if self.given(name):
                value = getattr(self, name)
                out[name] = value.to_json() if isinstance(value, BoundaryResult) else value
        return {**out, **self.extra}

    @classmethod
    def from_json(cls, d: dict) -> "BoundaryResult":
        """The result a JSON object holds (`records.check_record` checked its types)."""
        known = {k: v for k, v in d.items() if k in _RESULT_FIELDS}
        for way in ("their_crop", "copy"):
            if isinstance(known.get(way), dict):
                known[way] = cls.from_json(known[way])
        return cls(**known, extra={k: v for k, v in d.items() if k not in _RESULT_FIELDS})


_RESULT_FIELDS = tuple(f.name for f in dataclasses.fields(BoundaryResult) if f.name != "extra")


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
    born_in: Optional[dict] = _f(OBJECT)  # the first module whose output departs (engines.transformers.born)
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
    schedules: dict = _f(OBJECT, factory=dict)  # name -> {max_abs, multiple, passed, status, ...}
    steps: Optional[list] = _f(LIST)  # the finding's step sizes
    config: Optional[dict] = _f(OBJECT)  # the derived tiny config's summary
    vocab: Optional[int] = _f(INTEGER, 256)  # the token ids drawn below it
    reproducer: Optional[str] = _f(STRING)  # the standalone reproducer's path
    reproducer_status: Optional[int] = _f(INTEGER)  # its exit status when run once
    reproducer_output: Optional[str] = _f(STRING)  # its last line when run once (the vLLM engine's)
    report_draft: Optional[str] = _f(STRING)  # the bug-report draft's path
    boundaries: dict = _f(OBJECT, factory=dict)  # padded, rollback, ...: one `BoundaryResult` each
    order: Optional[list] = _f(LIST)  # the layer kinds, layer 0 first, of the order that heads the record
    variants: Optional[list] = _f(LIST)  # each layer order's verdict and numbers
    wall_s: Optional[float] = _f(NUMBER)  # seconds the architecture took (census.isolate)
    transformers_version: Optional[str] = _f(STRING)  # the release that made the record
    engine: Optional[str] = _f(STRING)  # "vllm" for `scan --engine vllm` (None: transformers itself)
    vllm_version: Optional[str] = _f(STRING)  # the vLLM release, for the vLLM engine
    vllm: Optional[dict] = _f(OBJECT)  # the vLLM engine's start times and memory
    llamacpp: Optional[dict] = _f(OBJECT)  # the llama.cpp engine's version, GGUF, conversion, load and run times
    # in this process only, never serialised: the config the model was built from (None: not built)
    built_from: object = field(default=None, repr=False, compare=False)

    def to_json(self) -> dict:
        """The record as JSON-ready dict: every field of `FIELDS`, in its order."""
        out = {name: getattr(self, name) for name in FIELDS}
        if isinstance(self.boundaries, dict):
            out["boundaries"] = {k: e.to_json() if isinstance(e, BoundaryResult) else e
                                 for k, e in self.boundaries.items()}
        return out

    @classmethod
    def from_json(cls, d: dict) -> "Record":
        """The record a JSON object holds (checked by `records.check_record` first). A field the
        object lacks reads as null, as the JSON document has always shown it; a key no field
        declares is left out, as the document leaves it out."""
        fields = {name: d.get(name) for name in FIELDS}
        if isinstance(fields["boundaries"], dict):
            fields["boundaries"] = {k: BoundaryResult.from_json(e) if isinstance(e, dict) else e
                                    for k, e in fields["boundaries"].items()}
        return cls(**fields)


# the fields a record's JSON holds, in order: all but `built_from`, which never leaves the process
FIELDS = tuple(f.name for f in dataclasses.fields(Record)
               if "json" in f.metadata or f.name in ("model_type", "verdict"))
JSON_TYPES = {f.name: f.metadata["json"] for f in dataclasses.fields(Record) if "json" in f.metadata}
# the releases a record names (its engine's, where the engine keeps it at the top; the reference's),
# which a page's title reads when the run's meta lacks them (a `--merge`)
VERSIONS = tuple(f for f in FIELDS if f.endswith("_version"))


def born_module(rec: "Record") -> dict:
    """A record's `born_in` when it names a module ({} otherwise: a boundary finding, a trace that
    failed), each field of the type the report formats (an edited record's other values: None)."""
    b = rec.born_in
    if not isinstance(b, dict) or not isinstance(b.get("module"), str) or not b["module"]:
        return {}
    out = {k: (v if isinstance(v, str) else None) for k, v in b.items() if k not in ("lines", "suspects", "copies")}
    out["copies"] = [c for c in b.get("copies") or [] if isinstance(c, str)] if isinstance(b.get("copies"), list) else []
    lines = b.get("lines")
    ok = isinstance(lines, list) and len(lines) == 2 and all(type(x) is int for x in lines)
    out["lines"] = lines if ok else None
    out["suspects"] = [s for s in b.get("suspects") or [] if isinstance(s, list) and len(s) >= 2
                       and isinstance(s[1], str)] if isinstance(b.get("suspects"), list) else []
    out["module"] = b["module"]
    return out


def new(model_type: str, verdict: str, **fields) -> Record:
    """A record, every field present (defaults for those not given)."""
    return Record(model_type, str(verdict), **fields)


def bare(model_type: str, verdict: str, **fields) -> Record:
    """A record that says only what it is given, every other field null: what is known of an
    architecture whose process died or ran out of time (`isolate`, `budget`)."""
    return Record.from_json({"model_type": model_type, "verdict": str(verdict), **fields})
