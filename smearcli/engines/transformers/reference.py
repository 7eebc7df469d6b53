"""The reference an engine outside transformers is held to, shared by the census's vLLM and
llama.cpp engines (neither has a float64 form or a cache to zero, so transformers stands in: the
transformers engine serves it, and the other engines import it from here):

- `model_types(archs)`: the model types whose transformers causal-LM class is among an engine's
  architecture names (its registry's answer), sorted; `arch_of(model_type)` the other way;
- `save(model, directory, model_type)`: the seeded tiny model as a safetensors directory, its config
  naming the class the engine resolves;
- `powered(config, tokens, seed, tolerance)`: transformers' full pass of the tiny model, its float64
  floor and its power, at the first init of the census's ladder (`reference.INIT_LADDER`) that shows
  power (`Powered`), the reference every schedule the engine runs is measured against;
- `prepared(model_type, config, summary, length, seed, tolerance, prefix)`: the steps every engine
  held to it takes before its own run, in one place: the tokens drawn, the weights that show power,
  saved in a temporary directory the engine loads (`Ready`), or where that stopped and why.
"""

from __future__ import annotations

import contextlib
import dataclasses
import tempfile
from pathlib import Path
from typing import Iterator, Optional

import torch

from ...judging import evidence, judge
from ...measure.compare import measure_power
from ...measure.schedules import run_schedule
from .boundary import transformers_frame
from ...tiny.derive import build, vocab_of


INIT_LADDER = (None, 0.1, 0.3, 1.0)  # initializer_range: the default, then larger (seeded)


def init_note(init: float) -> str:
    """The note of a check that had power only once the init scale was raised."""
    return f"the state was shown to matter only at initializer_range={init}"


NO_POWER_NOTE = (f"the check never had power (every kind of state at {evidence.MIN_POWER:.0%}) at any init scale "
                 f"tried ({', '.join('default' if i is None else str(i) for i in INIT_LADDER)})")


def stamp() -> dict:
    """What every census record whose reference is transformers' says of it (`census.engines.Session.stamp`):
    the release this process imported, which every architecture's process runs (nothing while it has
    imported none: a census's parent has, by the time it stamps, to list the architectures)."""
    import sys

    version = getattr(sys.modules.get("transformers"), "__version__", None)
    return {"transformers_version": version} if version else {}


def model_types(archs) -> list[str]:
    """The model types whose transformers causal-LM class is one of `archs` (vLLM's names)."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES as causal

    archs = set(archs)
    return sorted(t for t, cls in causal.items() if cls in archs)


def arch_of(model_type: str) -> Optional[str]:
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES as causal

    return causal.get(model_type)


def save(model, directory: Path, model_type: str) -> Path:
    """The model as a safetensors directory, its config naming the class vLLM resolves."""
    directory = Path(directory)
    model.config.architectures = [arch_of(model_type) or type(model).__name__]
    model.save_pretrained(directory, safe_serialization=True)
    return directory


@dataclasses.dataclass
class Powered:
    """The reference a foreign engine is held to: transformers' full pass of the tiny model, built
    at the first init of the census's ladder (`reference.INIT_LADDER`) whose cache state moves the
    logits enough to show (power), or at the last one tried. `why` says why there is none."""
    model: Optional[object] = None  # None: not built
    init: Optional[float] = None
    runner: Optional[object] = None  # the reference runner (`reference`)
    ref: Optional[object] = None  # its full pass
    floor: Optional[object] = None  # the float64 noise floor
    power: Optional[evidence.Power] = None
    why: str = ""
    stop: str = ""  # where it stopped (`judge.BUILD`, `judge.REFERENCE`), with `why`


def powered(config, tokens, seed: int, tolerance: float) -> Powered:
    """Power first, on transformers' side: the engine then runs the weights that have it (vLLM and
    llama.cpp expose no cache to zero; the same weights in transformers stand in)."""
    got = Powered()
    for init in INIT_LADDER:
        try:
            got.model, got.init = build(config, init, seed), init
        except Exception as e:
            got.why, got.stop = "the model cannot be built from the tiny config: " + transformers_frame(e), judge.BUILD
            return got
        try:
            got.runner, got.ref, got.floor = reference(got.model, tokens)
        except Exception as e:
            got.why, got.stop = "the full pass in transformers does not run: " + transformers_frame(e), judge.REFERENCE
            return got
        threshold = tolerance * got.floor.per_layer[-1]
        try:
            got.power = measure_power([], got.runner, tokens, threshold)
        except Exception as e:  # transformers' own cache fails: the engine still runs, but OK cannot be shown
            got.power = evidence.Power(0, threshold, why="zeroing the transformers reference's cache raised: "
                                       + transformers_frame(e))
        if not got.power.measured or got.power.sufficient:
            break
    return got


@dataclasses.dataclass
class Ready:
    """One architecture made ready for an engine held to this reference (`prepared`): its tokens,
    its reference (`Powered`), the directory the weights were saved in (as `directory / "model"`),
    and the record's fields known so far: the tiny config's summary and vocabulary, then, once the
    reference is measured, the model's class, the init scale, the float64 floor and where it came
    from. `stop` (`judge.BUILD`, `judge.REFERENCE`) and `why`: where it stopped, and no directory."""
    tokens: torch.Tensor
    got: Powered
    fields: dict
    directory: Optional[Path] = None
    stop: str = ""
    why: str = ""


@contextlib.contextmanager
def prepared(model_type: str, config, summary: dict, length: int, seed: int, tolerance: float,
             prefix: str) -> Iterator[Ready]:
    """The tiny model of `config` (`summary`: what the record says of it) made ready for an engine:
    `length` tokens drawn on `seed`, the reference at the first init that shows power (`powered`),
    the weights saved in a temporary directory named from `prefix` that lasts the block. Yields a
    `Ready`; one that stopped (`stop`, `why`) has no directory."""
    vocab = vocab_of(config)
    fields = dict(config=summary, vocab=vocab)
    tokens = torch.randint(0, vocab, (1, length), generator=torch.Generator().manual_seed(seed))
    got = powered(config, tokens, seed, tolerance)
    if got.why:
        yield Ready(tokens, got, fields, stop=got.stop, why=got.why)
        return
    fields.update(model_class=type(got.model).__name__, init=got.init, floor=got.floor.per_layer[-1],
                  floor_source=got.floor.source)
    with tempfile.TemporaryDirectory(prefix=prefix) as d:
        try:
            save(got.model, Path(d) / "model", model_type)
        except Exception as e:
            yield Ready(tokens, got, fields, stop=judge.BUILD, why="the tiny model cannot be saved: " + transformers_frame(e))
            return
        yield Ready(tokens, got, fields, Path(d))


def reference(model, tokens):
    """(the reference runner, its full pass as log-probabilities, the float64 noise floor)."""
    from ...measure.runner import LogProbs
    from . import runner as their_runner

    runner = LogProbs(their_runner(model, "tiny config", tokens))
    ref = run_schedule(runner, tokens, "full", capture=False)
    return runner, ref, evidence.floor(runner, ref, tokens, torch.float32)
