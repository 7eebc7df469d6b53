"""An engine's one registration: what `compare --impl NAME` runs and, where it has a census, what
`scan --engine NAME` runs.

An `Implementation` names itself, says which shared options it needs, owns or refuses (each
refusal with its one-line reason), which commands it serves, the runner classes a run compares
(their declared capabilities decide which schedules it is offered: `schedules.runnable`, never a
list of its own), how to prepare a run (`prepare(spec, schedules, tolerance) -> cli.reports.Job`),
and its census (`census`: a `census.engines.Engine`, or None for an implementation no census
runs). The commands ask `cli.impls.implementation(spec, command)` and never name one.

```python
from smearcli.engines import registry
registry.register(registry.Implementation("toy", "a toy model", prepare=my_prepare, runners=(MyRunner,),
                                          census=my_census_engine))
```

Each engine's folder registers itself in its `registration` module, and importing `smearcli.engines`
imports every built-in folder's: none of them imports the engine's code (its runners, `prepare` and
session are "module:name" strings, imported when a run needs them), so `--help` imports no torch.
A text a user reads (`help`, a refusal's reason) names an option by its field in braces
(`{hf_model}`) and the implementation itself as `{this}`: the CLI, which owns the flags, writes
them (`cli.options.said`). `register` also takes a census `Engine` alone: an engine that
`compare` does not run (the test suite's toy engine).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional, Union

from ..census.engines import Engine, register as register_census
from ..util.named import load

COMMANDS = ("compare", "plot", "bench")
# the options that configure our nanochat model or its inputs: an implementation that runs another
# model refuses them, each with its reason
NANOCHAT_ONLY = tuple((f, "configures a nanochat model and does not apply to {this} ({hf_model} names the model)")
                      for f in ("checkpoint", "step", "model", "depth", "text", "text_file", "source",
                                "model_tag", "preset")) + (
    ("chat", "encodes a nanochat conversation; it does not apply to {this}"),
    ("logic", "picks nanochat's smear logic; with {this} the model's own code runs"),
    ("samples", "sizes the engine schedule, which {this} does not run"),
    ("documents", "sizes the packed schedule, which {this} does not run"),
    ("leak_limit", "gates the packed schedule, which {this} does not run"))


@dataclass(frozen=True)
class Implementation:
    name: str
    help: str  # one phrase, for --impl's help
    prepare: Union[Callable, str]  # (spec, schedules, tolerance) -> Job, or "module:function" naming it
    needs: tuple[tuple[str, str], ...] = ()  # (RunSpec field, what to give) that must be set
    owns: tuple[str, ...] = ()  # RunSpec fields only this implementation (and those sharing them) use
    refuses: tuple[tuple[str, str], ...] = ()  # (RunSpec field, why it does not apply)
    commands: tuple[str, ...] = ("compare", "plot")
    # the `Runner` classes (or "module:Class") whose runs it compares: a schedule is offered when
    # every one of them can run it (None: a plain Runner's, which steps through a cache and no more)
    runners: Optional[tuple[Union[type, str], ...]] = None
    census: Optional[Engine] = None  # its census (`scan --engine`), if it has one

    def job(self, spec, schedules, tolerance: float):
        """Prepare a run (imports the implementation's code now)."""
        return load(self.prepare)(spec, schedules, tolerance)

    def runner_classes(self) -> list[type]:
        """Its runner classes (imports their modules now)."""
        from ..measure.runner import Runner

        return [load(r) for r in self.runners] if self.runners else [Runner]


REGISTRY: dict[str, Implementation] = {}


def register(*entries: Union[Implementation, Engine]) -> None:
    """Add (or replace) implementations, each with its census, or census engines alone: `--impl
    NAME` and `scan --engine NAME` then run them."""
    for entry in entries:
        if isinstance(entry, Implementation):
            REGISTRY[entry.name] = entry
            entry = entry.census
        if entry is not None:
            register_census(entry)
