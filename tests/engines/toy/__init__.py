"""A toy census engine, registered the way a real one is (`smearcli.engines.registry`): one folder,
one registration, no package file touched (tests/census/test_engines.py runs the whole census on it).

Its "model" is a running sum over the tokens with a cache that carries the sum from one chunk to
the next; the model type names how its cached path behaves: `toy_ok` carries the sum, `toy_drop`
drops it at every chunk start (the bug), `toy_crash` raises in its cached path. The error of a
schedule is measured here, against the full pass, and handed to the census as a `census.measured.Ran`
(which makes the word and the record's fields, as it does for vLLM and llama.cpp); a finding gets a
standalone reproducer that recomputes it and exits 1 while it is there.
"""

from __future__ import annotations

import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from smearcli.judging import evidence, judge
from smearcli.census import engines, measured, record
from smearcli.engines import registry
from smearcli.judging.verdicts import BUG

TYPES = ("toy_crash", "toy_drop", "toy_ok")
TOKENS = [3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5, 8]
PLANS = {"chunks of 4": 4, "chunks of 5": 5, "decode": 1}
FLOOR = 1e-6  # the toy's arithmetic is exact: any departure is many floors

REPRO = '''"""Reproducer: {model_type} drops its carried sum at chunk starts ({schedule})."""
import sys

TOKENS, CHUNK = {tokens!r}, {chunk!r}
full = [sum(TOKENS[:i + 1]) for i in range(len(TOKENS))]
cached, carried = [], 0
for start in range(0, len(TOKENS), CHUNK):
    carried = 0  # the bug: the cache's sum is not carried into the chunk
    for t in TOKENS[start:start + CHUNK]:
        carried += t
        cached.append(carried)
err = max(abs(a - b) for a, b in zip(full, cached))
print(f"max abs error {{err}}")
sys.exit(1 if err > 0 else 0)
'''


def confirmed(full: list, model_type: str, chunk: int, err: float) -> evidence.Confirmation:
    """A departure's float64 rerun (Python's floats are float64): without one the judge keeps no bug."""
    again = max(abs(float(a) - b) for a, b in zip(full, outputs(model_type, chunk)))
    c = evidence.Confirmation(err, "float32", again, 0.0)
    c.status, c.why = judge.confirmed(c.original, c.lifted, c.bound)
    return c


def outputs(model_type: str, chunk: int) -> list[int]:
    """The toy's running sum, computed `chunk` tokens at a time through its cache."""
    out, carried = [], 0
    for start in range(0, len(TOKENS), chunk):
        if model_type == "toy_crash" and start > 0:
            raise RuntimeError("toy cache: no slot for a second chunk")
        if model_type == "toy_drop":
            carried = 0
        for t in TOKENS[start:start + chunk]:
            carried += t
            out.append(carried)
    return out


@dataclass
class Error:
    """A schedule's error as the census reads a measured run (`measure.metrics.RunMetrics` has the same)."""
    max_abs_logits: float

    logits_multiple = property(lambda self: self.max_abs_logits / FLOOR)
    passed = property(lambda self: self.max_abs_logits == 0)


class Toy:
    """The toy's session: in-process, nothing started, architectures at once as --jobs allows."""

    def __init__(self, python=None, quiet=False):
        pass

    def meta(self) -> dict:
        return {"engine": "toy"}

    def model_types(self) -> list[str]:
        return list(TYPES)

    def check(self, model_type: str, repro_dir: Path, timeout: float, memory) -> record.Record:
        """Measured runs in (`census.measured.Ran`); the word and the fields it keeps are the census's."""
        full = outputs("toy_ok", len(TOKENS))
        # power: the carried sum zeroed after the first chunk moves the outputs this much
        moved = max(abs(a - b) for a, b in zip(full, outputs("toy_drop", 4)))
        power = evidence.Power(4, 10 * FLOOR, {"sum": float(moved)})
        runs = []
        for name, chunk in PLANS.items():
            try:
                err = float(max(abs(a - b) for a, b in zip(full, outputs(model_type, chunk))))
            except RuntimeError as e:
                runs.append(measured.Ran(name, [chunk], outcome=judge.RAISED, why=str(e)))
                continue
            runs.append(measured.Ran(name, [chunk], Error(err), confirmed(full, model_type, chunk, err) if err else None))
        j = measured.judged(runs, power)
        rec = record.new(model_type, j.word, engine="toy", schedules=measured.entries(runs, j), floor=FLOOR,
                         **{"reason": j.why or None, **measured.verdict_fields(runs, j, power, j.named(BUG))})
        if j.word == BUG:
            path = Path(repro_dir) / f"{model_type}-toy.py"
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(REPRO.format(model_type=model_type, schedule=rec.worst_schedule, tokens=TOKENS,
                                         chunk=PLANS[rec.worst_schedule]))
            done = subprocess.run([sys.executable, str(path)], capture_output=True, timeout=timeout)
            rec.reproducer, rec.reproducer_status = str(path), done.returncode
        return rec

    def checked(self, rec: record.Record, more: bool) -> bool:
        return False

    def close(self) -> None:
        pass


def sections(records: list[record.Record], meta: dict) -> list[str]:
    """The toy's page: one line per architecture."""
    return ["## Toy architectures", ""] + [f"- {r.model_type}: {r.verdict}" for r in records] + [""]


ENGINE = engines.Engine("toy", "a running sum with a carried cache (a test's engine)", open=Toy,
                        names_are="a toy model type", repro_tails=("-toy.py",), title="# smearcli scan on the toy",
                        sections=sections)


def register() -> None:
    """Its one registration (a census alone: compare does not run it)."""
    registry.register(ENGINE)
