"""The engines a census runs on, in one registry: `scan --engine NAME` runs any registered engine
through one loop (`isolate.census`: one `--only`/`--shard`/`--resume`/`--merge` path, one record
file, one report, one figure). The census names no engine: each registers itself.

An engine is one folder (`smearcli.engines.NAME`, its session module there) and one registration,
in its folder's `registration` module, which registers its `compare --impl` implementation and this
`Engine` together (`smearcli.engines.registry.register`; an engine that compare does not run
registers its `Engine` alone). Importing `smearcli.engines` registers every built-in one; a lookup
here before that finds none of them, and says so.

```python
from smearcli.census.engines import Engine
from smearcli.engines import registry
registry.register(Engine("toy", "a toy engine", open="my_module:open_session"))
```

What an `Engine` declares (cheap: registering imports none of its code, `--help` lists it):

- `name`: what `--engine` takes; `help`: one phrase for `--engine`'s help.
- `open`: `(python, quiet) -> Session`, or "module:function" naming it (imported when a census
  runs): the engine made ready, its environment checked. `python` is the interpreter of the
  engine's own environment (from `--engine-python` or the variable `env_var`), None for an engine
  that runs in smearcli's own process. A bad environment is a `UserError` (the CLI makes it exit 2
  before anything is checked or written).
- `env_var`: the environment variable naming its Python; None: the engine runs in-process and
  takes no `--engine-python` (the CLI refuses one). `environment`: what that Python's environment
  is and how one is made, for the refusal when none is given.
- `concurrent`: whether architectures may run `--jobs` at once (each in its own forked process);
  False when they share one resource (vLLM's one worker process).
- `failing`: the verdict words `scan --check` exits 1 on (transformers: bug; vLLM, which has no
  float64 rerun to confirm a departure: bug, crashed, unconfirmed).
- `names_are`: what its model types are, for `--only`'s refusal ("is not NAMES_ARE").
- `repro_tails`: the file-name tails its reproducer (and draft) write per finding, after the
  model type ("llama.py", "llama-vllm.py"), or a "module:function" giving them: the CLI refuses,
  before anything runs, a directory or a FIFO where one would go.
- `unnamed`: its records leave the `engine` field out (transformers', which predate the field):
  a record with none is this engine's.
- `product` and `release`: what its release is called ("vLLM") and `(record) -> str or None`, the
  release that made a record (its version, as the record keeps it): a diff between two censuses
  and the table of what upstream knows name and compare releases through these alone.
- `title`: its Markdown page's first line, formatted with the run's meta (`{transformers_version}`,
  `{vllm_version}`, ...; a missing key reads "?"); `counted`: what the page's count line counts
  ("causal-LM architectures").
- `sections`: `(records, meta) -> list[str]` (or "module:function"): its page's own Markdown
  lines after the count line (findings, what could not run, every architecture; `report.markdown`
  puts the frame around them).
- `data`: {record field: `census.record.Part` subclass or JSON kind}: the fields a record holds
  at its top level for this engine (vLLM's `vllm_version` and `vllm`, llama.cpp's `llamacpp`), each
  a typed part declared in the engine's folder or a plain JSON value; registering the engine adds
  them to every record, after the fields the core declares (`census.record.hold`), so the core
  names no engine's field.
- `after_run`: `(records, meta) -> None` (or "module:function", or None): what it writes once a
  run (not a `--merge`) is over, like the transformers engine's one bug-report draft per root cause.
- `groups`: `(records) -> list[dict]` (or "module:function", or None: none): the root causes its
  findings share, the JSON document's `groups`; `footer`: `(records) -> list[str]` (or
  "module:function", or None), the console table's lines after its rows (transformers: each
  boundary's counts, then one per piece of its API's code found wrong); `under`: `(record) ->
  list[str]` (or "module:function", or None), what the table says under one architecture's row
  (transformers: the module its finding was born in).

What a `Session` (the object `open` returns) does while the census runs:

- `meta() -> dict`: the versions it reports for the run's meta (and the JSON document's header),
  beyond those of smearcli's own process (transformers, torch, Python: every run's meta holds
  them); asked once the run is over, so a benchmark of the run may be in it;
- `model_types() -> list[str]`: every model type it can check, sorted (`--only` and `--shard`
  pick from these);
- `check(model_type, repro_dir, timeout, memory) -> Record`: one architecture's record
  (`census.record.Record`, made with `census.record.new`), called in the architecture's own forked
  process (`isolate`, which sends it to the census's process as JSON and makes it a `Record` again), its
  reproducer written in `repro_dir` for a finding; `timeout` in seconds and `memory` in bytes are
  the limits `isolate` holds the process to (a check that waits on another process ends its waits
  within them);
- `checked(record, more) -> bool`: in the census's own process after each `Record`, before it is
  written (`more`: whether another architecture follows): whatever the engine must do between
  architectures (restart a worker it shares); True checks that architecture once more instead of
  writing this record (the second record is written whatever it says);
- optionally `stamp() -> dict`: the record fields every record of the run carries where its check left them
  null, those the census's own process makes included (a worker that died, a time-out): the releases
  that made it (transformers' reference: `transformers_version`);
- `close()`: the run is over (or stopped): release what `open` started;
- optionally `gathering()` and `gathered(words) -> str`: a context manager entered in each
  architecture's process around its check, yielding a set the engine adds words to, and the one
  line the census says of every process's words at its end (transformers: the fast kernels it fell
  back without). An engine without them gathers nothing.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional, Protocol, Sequence, Union

from ..util.errors import UserError
from ..util.named import load
from ..judging.verdicts import BUG
from .record import Record, hold


class Session(Protocol):
    def meta(self) -> dict: ...

    def model_types(self) -> list[str]: ...

    def check(self, model_type: str, repro_dir: Path, timeout: float, memory: Optional[int]) -> Record: ...

    def checked(self, record: Record, more: bool) -> bool: ...

    def close(self) -> None: ...


@dataclass(frozen=True)
class Engine:
    name: str
    help: str
    open: Union[Callable, str]
    env_var: Optional[str] = None
    environment: str = "the engine's own environment"
    concurrent: bool = True
    failing: tuple[str, ...] = (str(BUG),)
    product: str = "the engine"
    release: Callable[[Record], Optional[str]] = lambda record: None
    stamp: Callable[[Optional[str]], dict] = lambda release: {}  # the record fields `release` reads back
    unnamed: bool = False
    names_are: str = "a model type this engine checks"
    repro_tails: Union[tuple[str, ...], str, Callable] = (".py",)
    title: str = "smearcli scan"
    counted: str = "architectures"
    sections: Union[Callable, str, None] = None
    after_run: Union[Callable, str, None] = None
    groups: Union[Callable, str, None] = None
    footer: Union[Callable, str, None] = None
    under: Union[Callable, str, None] = None
    data: dict = field(default_factory=dict)

    def session(self, python: Optional[str], quiet: bool = False) -> Session:
        return load(self.open)(python, quiet)

    def tails(self) -> tuple[str, ...]:
        return tuple(self.repro_tails if isinstance(self.repro_tails, tuple) else load(self.repro_tails)())

    def page_title(self, meta: dict) -> str:
        return self.title.format_map(_Unknown(meta or {}))

    def page_sections(self, records: Sequence[Record], meta: dict) -> list[str]:
        return list(load(self.sections)(records, meta)) if self.sections else []

    def root_causes(self, records: Sequence[Record]) -> list[dict]:
        return list(load(self.groups)(records)) if self.groups else []

    def table_footer(self, records: Sequence[Record]) -> list[str]:
        return list(load(self.footer)(records)) if self.footer else []

    def row_lines(self, record: Record) -> list[str]:
        return list(load(self.under)(record)) if self.under else []

    def finish(self, records: Sequence[Record], meta: dict) -> None:
        if self.after_run:
            load(self.after_run)(records, meta)


class _Unknown(dict):
    def __missing__(self, key):
        return "?"


ENGINES: dict[str, Engine] = {}


def register(engine: Engine) -> Engine:
    """Add an engine (a name already taken is replaced: a test's toy engine may shadow one), and
    the parts its data is (`Engine.data`)."""
    ENGINES[engine.name] = engine
    for name, part in engine.data.items():
        hold(name, part)
    return engine


def names() -> list[str]:
    return list(ENGINES)


NONE_REGISTERED = "no engine is registered (importing smearcli.engines registers the built-in ones)"


def get(name: str) -> Engine:
    """The engine `name`; a UserError listing every registered one."""
    if name not in ENGINES:
        raise UserError(f"no engine is named {name!r}; " + (f"the engines are {', '.join(ENGINES)}" if ENGINES
                                                               else NONE_REGISTERED))
    return ENGINES[name]


def unnamed() -> Optional[Engine]:
    """The engine whose records leave `engine` out (`Engine.unnamed`), if one is registered."""
    return next((e for e in ENGINES.values() if e.unnamed), None)


def name_of(record: Record) -> Optional[str]:
    """The name of the engine that made `record`: its `engine` field, else the unnamed engine's (a
    UserError while no engine is registered: which engine made it is not known then, and a record
    read as no engine's would match nothing upstream knows)."""
    if record.engine:
        return record.engine
    if not ENGINES:
        raise UserError(NONE_REGISTERED)
    engine = unnamed()
    return engine.name if engine else None


def of_records(records: Sequence[Record]) -> Engine:
    """The engine a census's records ran on (the `engine` field; none: the unnamed engine's); a
    UserError for a mix, or a name no engine registered here holds."""
    kinds = {name_of(r) for r in records} if records else {getattr(unnamed(), "name", None)}
    if len(kinds) > 1:
        raise UserError(f"the records mix engines ({', '.join(sorted(str(k) for k in kinds))}): "
                        "a census is of one engine")
    name = kinds.pop()
    if name not in ENGINES:
        raise UserError(f"the records are of the engine {name!r}, which is not registered here" if name else
                        f"the records name no engine, and {NONE_REGISTERED}")
    return ENGINES[name]


def stamped(name: str, release: Optional[str]) -> dict:
    """The fields of a record made by engine `name`'s `release`: its `engine` (None for the
    unnamed engine, whose records predate the field) and where that engine keeps its release
    (`Engine.stamp`, the inverse of `Engine.release`)."""
    engine = ENGINES.get(name)
    return {"engine": None if engine is not None and engine.unnamed else name,
            **(engine.stamp(release) if engine else {})}


def release_of(record: Record) -> Optional[str]:
    """The release of its engine that made `record` (None: not recorded, or no such engine here)."""
    engine = ENGINES.get(name_of(record) or "")
    return engine.release(record) if engine is not None else None
