"""What every schedule is made of: its options, its result, and the `Schedule` record that
registers one (`smearcli.measure.schedules` holds the registry and the step loop, `run_steps`).

A schedule's `run(runner, tokens, opts, capture, on_step)` returns a `Ran`: the logits (and, on
request, every captured hidden state) laid out as if the whole sequence had run at once, the step
sizes it fed, and the boundaries it crossed by kind; `schedules.run_schedule` turns that into the
`RunResult` every caller measures. A boundary's `Schedule` also carries what the rest of the
project says about it: the shape of its failure, the words its marks get in a figure, whether the
census runs it, and its part of the census's standalone reproducer (`Repro`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, NamedTuple, Optional

from torch import Tensor

from ..util.defaults import CHUNKS, DRAFT, GEN_LEN, REJECT, SAMPLES

# The kinds of boundary a run records (`RunResult.boundaries`): positions where per-token state
# crosses from one call, row or document into the next (documents, padding and rollbacks add
# theirs: `names.DOCUMENT_START`, `PADDING`, `ROLLBACK`).
CHUNK_START = "chunk_start"  # a multi-token cached step begins after position 0
CACHE_COPY = "cache_copy"  # the first position after a cache was copied into more rows
PREFIX_HIT = "prefix_hit"  # the first position a request computed after the blocks it read from a prefix cache



@dataclass(frozen=True)
class ScheduleOptions:
    chunks: int = CHUNKS  # near-equal chunks for `chunked` (ignored when chunk_sizes is set)
    chunk_sizes: Optional[tuple[int, ...]] = None
    samples: int = SAMPLES  # rows after engine-style expansion
    gen_len: int = GEN_LEN  # tokens generated after the prompt (engine, speculative)
    draft: int = DRAFT  # tokens per speculative verify step
    documents: Optional[tuple[int, ...]] = None  # packed: document lengths (None: `chunks` near-equal ones)
    reject: int = REJECT  # rollback: draft tokens rejected per verify step


@dataclass
class RunResult:
    schedule: str
    logic: str  # the runner's label
    logits: Tensor  # (R, T, V) fp32
    hiddens: Optional[list[Tensor]]  # one (R, T, C) fp32 tensor per capture point before the logits
    steps: list[int]  # the sizes of the forward steps, in order (per input row)
    row_map: list[int]  # input row each output row reproduces (engine expands rows)
    marks: dict = field(default_factory=dict)  # boundaries the schedule adds: kind -> positions
    starts: Optional[list[int]] = None  # chunk starts, where the steps' running sums are not (packed, rollback)
    notes: tuple[str, ...] = ()  # what the run did that a reader must know (rollback: crop or copy)
    # None for a run that returned numbers to measure, else why it was not (logits may be empty):
    # `judge.RAISED` (the implementation raised; `message` is its error), `judge.CHECKED_NOTHING` (it
    # ran but did not exercise what the schedule tests; `message` says why) or `judge.CANNOT_RUN`;
    # the judge gives it its status
    outcome: Optional[str] = None
    message: str = ""  # why, for an outcome: the engine's error, or what was not exercised

    @property
    def chunk_starts(self) -> list[int]:
        """Starts of multi-token steps after position 0: where the old logic drops a predecessor."""
        if self.starts is not None:
            return list(self.starts)
        out, pos = [], 0
        for n in self.steps:
            if pos > 0 and n > 1:
                out.append(pos)
            pos += n
        return out

    @property
    def boundaries(self) -> dict[str, list[int]]:
        """Every boundary of this run by kind (CHUNK_START, CACHE_COPY, ...), positions in the
        reference's coordinates; kinds without a position are left out."""
        out = {CHUNK_START: self.chunk_starts, **self.marks}
        return {k: list(v) for k, v in out.items() if v}

    @property
    def expand_at(self) -> Optional[int]:
        """Where engine-style expansion happened (the first position after the cache copy)."""
        at = self.marks.get(CACHE_COPY)
        return at[0] if at else None


def split_even(T: int, n: int) -> list[int]:
    """n near-equal chunk sizes summing to T, larger ones first (T=10, n=4 -> 3,3,2,2)."""
    if n < 1:
        raise ValueError(f"number of chunks must be >= 1, got {n}")
    if n > T:
        raise ValueError(f"{n} chunks for {T} tokens: every chunk needs at least one token")
    q, r = divmod(T, n)
    return [q + 1] * r + [q] * (n - r)


def chunk_plan(T: int, opts: ScheduleOptions) -> list[int]:
    if opts.chunk_sizes is None:
        return split_even(T, opts.chunks)
    sizes = list(opts.chunk_sizes)
    if any(n <= 0 for n in sizes):
        raise ValueError(f"chunk sizes must be positive, got {','.join(map(str, sizes))}")
    if sum(sizes) != T:
        raise ValueError(f"chunk sizes sum to {sum(sizes)} but the sequence has {T} tokens")
    return sizes


def prompt_len(T: int, opts: ScheduleOptions) -> int:
    """The prompt of the schedules that generate after one (engine, speculative, rollback)."""
    if T < 2:
        raise ValueError("engine and speculative schedules need at least 2 tokens")
    return T - min(opts.gen_len, T - 1)


class Ran(NamedTuple):
    """What a schedule's `run` returns: `RunResult`'s fields that the schedule decides."""
    logits: Tensor  # (R, T, V) fp32
    hiddens: Optional[list[Tensor]]
    steps: list[int]
    marks: dict = {}  # boundaries the schedule adds: kind -> positions (never mutated: run_schedule copies it)
    starts: Optional[list[int]] = None  # chunk starts, where the steps' running sums are not
    notes: tuple[str, ...] = ()


@dataclass(frozen=True)
class Repro:
    """A boundary's part of the census's standalone reproducer (`smearcli.engines.transformers.repro`), which
    imports torch and transformers only: `source` defines `def <name>(model, ids)` with the
    constants it reads, a `str.format` template (braces doubled) over the fields `values(entry, T)`
    gives from the boundary's census entry and the reproducer's length; it may call the
    reproducer's `step(model, ids, cache, pos)` and `their_crop(model, ids)`."""
    what: str  # the subject of the reproducer's docstring: "A prefill, then drafts ... cache,"
    source: str
    values: Callable[[dict, int], dict] = field(repr=False)


@dataclass(frozen=True)
class Schedule:
    """One way to feed the tokens, registered once (`schedules.register`). Everything the project
    says of it is here: the table, JSON, figures, census and reproducers read it by name."""
    name: str
    summary: str
    run: Callable = field(repr=False)  # (runner, tokens, opts, capture, on_step) -> Ran
    needs: frozenset = frozenset()  # runner capabilities it needs (smearcli.measure.runner)
    needs_one_of: frozenset = frozenset()  # of these, at least one (rollback: crop, or a copy)
    shape: Optional[str] = None  # a boundary's failure, in words ("padding leaks into a row")
    shape_at: Optional[str] = None  # the shape holds only when the error is born at this mark kind
    marks: tuple[tuple[str, str], ...] = ()  # (mark kind, the figure legend's words) it records
    census: bool = False  # the scan runs it on every architecture (`smearcli.engines.transformers.boundary`)
    compare: bool = True  # compare offers it; False: only the census's own set-up can run it (the
    # boundaries in combination), so what compare accepts never depends on whether the census was imported
    repro: Optional[Repro] = None  # the census's reproducer of its failure
