"""Execution schedules: the ways an inference stack feeds the same tokens to the model.

The registry `SCHEDULES` is the one list every caller uses (CLI, plots, bench, notebooks, tests).
Each schedule turns (runner, tokens, options) into a `RunResult` holding the logits and, on
request, every captured hidden state, laid out as if the whole sequence had run at once, and the
boundaries it crossed by kind (`CHUNK_START`, `CACHE_COPY`). A runner (`smearcli.runner`) is any
implementation; a schedule that needs a capability (engine: copying a cache) declares it. A new
schedule is one entry of `SCHEDULES` (and its name in `names.SCHEDULE_NAMES`).

- full: one forward pass without a cache. The reference every other run is measured against.
- prefill: one cached step over all tokens.
- decode: one cached step per token.
- chunked: cached steps of the given chunk sizes (chunked prefill).
- engine: upstream Engine's batch expansion: a batch-1 prefill of all but the last `gen_len`
  tokens, the cache copied into `samples` rows, then one token per step on every row.
- speculative: a prefill of all but the last `gen_len` tokens, then verify steps of `draft`
  tokens at once, as speculative decoding feeds accepted drafts.
- packed, padded, rollback: documents packed in one row, padded batches, rejected drafts
  (`smearcli.boundaries`, which records DOCUMENT_START, PADDING and ROLLBACK boundaries).
- prefix: a first request over a prefix of whole cache blocks, then the whole sequence as a second
  request that reads those blocks from the engine's prefix cache. Only a runner that declares
  `PREFIX_CACHE` runs it, in its own `run()`.

A run an engine could not complete is still a result: `RunResult.outcome` is CRASHED (with the
engine's message) or UNCHECKED (it ran, but did not exercise what the schedule tests, e.g. a
prefix cache that was never read), and `compare` reports it without measuring it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Optional

import torch
from torch import Tensor

from . import boundaries
from .errors import CannotRun
from .names import CHUNKS, DRAFT, GEN_LEN, REJECT, SAMPLES, SCHEDULE_NAMES
from .runner import COPY, CROP, EXPAND, PADDING as PADDED_BATCH, PREFIX_CACHE, Runner

# The kinds of boundary a run records (`RunResult.boundaries`): positions where per-token state
# crosses from one call, row or document into the next (documents, padding and rollbacks add
# theirs: `boundaries.DOCUMENT_START`, `PADDING`, `ROLLBACK`).
CHUNK_START = "chunk_start"  # a multi-token cached step begins after position 0
CACHE_COPY = "cache_copy"  # the first position after a cache was copied into more rows
PREFIX_HIT = "prefix_hit"  # the first position a request computed after the blocks it read from a prefix cache

# What became of a run (`RunResult.outcome`): None for a run that returned numbers to measure.
CRASHED = "crashed"  # the implementation raised; `message` is its error
UNCHECKED = "checked nothing"  # it ran but did not exercise what the schedule tests; `message` says why


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
    outcome: Optional[str] = None  # CRASHED or UNCHECKED: not measured (logits may be empty)
    message: str = ""  # why, for an outcome: the engine's error, or what was not exercised

    @property
    def step_starts(self) -> list[int]:
        """Positions where a step begins, after position 0."""
        out, pos = [], 0
        for n in self.steps[:-1]:
            pos += n
            out.append(pos)
        return out

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


def _prompt_len(T: int, opts: ScheduleOptions) -> int:
    if T < 2:
        raise ValueError("engine and speculative schedules need at least 2 tokens")
    return T - min(opts.gen_len, T - 1)


def _run_steps(runner: Runner, tokens: Tensor, steps: list[int], capture: bool,
               cache=None, on_step=None, out=None) -> tuple[Tensor, Optional[list[Tensor]]]:
    """Feed `tokens` (B, T) through the runner's cache in steps; each step's outputs are written
    where they belong in one (B, T, ...) fp32 tensor per output, so nothing is concatenated (at
    d12 and 1024 tokens a logits row is 256 MB). `out`: the logits tensor to write into (a view of
    a larger one, as the engine schedule gives); `on_step(n)` is called after each step of n tokens."""
    B, T = tokens.shape
    if cache is None:
        cache = runner.new_cache(B, T)
    logits, hiddens, depth = out, None, None  # hiddens: None until a step returns them, [] if one did not
    pos = 0
    for n in steps:
        step = runner.step(tokens[:, pos:pos + n], cache, capture)
        if step.logits.shape[:2] != (B, n):
            raise ValueError(f"{runner.label}: a step over {n} tokens returned logits of shape "
                             f"{tuple(step.logits.shape)}")
        if logits is None:
            logits = step.logits.new_empty((B, T) + tuple(step.logits.shape[2:]), dtype=torch.float32)
        logits[:, pos:pos + n] = step.logits
        if capture:
            got = step.hiddens
            if got is None or hiddens == []:
                hiddens = []  # one step without hidden states: the run has none
            else:
                if depth is None:
                    depth = len(got)
                    hiddens = [h.new_empty((B, T) + tuple(h.shape[2:]), dtype=torch.float32) for h in got]
                if len(got) != depth:
                    raise ValueError("steps returned different numbers of hidden states")
                for buf, h in zip(hiddens, got):
                    buf[:, pos:pos + n] = h
        pos += n
        if on_step is not None:
            on_step(n)
    assert pos == T
    return logits, (hiddens or None) if capture else None


def run_steps(runner: Runner, tokens: Tensor, steps, capture: bool = False, schedule: str = "steps") -> RunResult:
    """`tokens` (B, T) fed through a fresh cache in any plan of `steps` (a census fuzzes them),
    without gradients, as a RunResult named `schedule`."""
    with torch.inference_mode():
        logits, hiddens = _run_steps(runner, tokens, list(steps), capture)
    return RunResult(schedule, runner.label, logits, hiddens, list(steps), list(range(tokens.size(0))))


def _stitch(parts: list, dim: int) -> Optional[list[Tensor]]:
    """Concatenate per-step hidden-state lists along `dim`; None when any step had none."""
    if not parts or any(p is None for p in parts):
        return None
    depth = {len(p) for p in parts}
    if len(depth) != 1:
        raise ValueError("steps returned different numbers of hidden states")
    return [torch.cat([p[i].float() for p in parts], dim=dim) for i in range(depth.pop())]


def _full(runner, tokens, opts, capture, on_step=None):
    out = runner.forward(tokens, capture)
    if on_step is not None:
        on_step(tokens.size(1))
    return out.logits.float(), _stitch([out.hiddens], 1) if capture else None, [tokens.size(1)], {}


def _stepped(plan: Callable[[int, ScheduleOptions], list[int]]):
    def run(runner, tokens, opts, capture, on_step=None):
        steps = plan(tokens.size(1), opts)
        logits, hiddens = _run_steps(runner, tokens, steps, capture, on_step=on_step)
        return logits, hiddens, steps, {}
    return run


def _engine(runner, tokens, opts, capture, on_step=None):
    B, T = tokens.shape
    S = opts.samples
    if S < 1:
        raise ValueError(f"samples must be >= 1, got {S}")
    P = _prompt_len(T, opts)
    logits, hidden_rows = None, []  # logits: (B * S, T, V), each row block written in place
    for b in range(B):
        # 1) batch-1 prefill of the prompt
        c1 = runner.new_cache(1, P)
        first = runner.step(tokens[b:b + 1, :P], c1, capture)
        if on_step is not None and b == B - 1:
            on_step(P)
        if logits is None:
            logits = first.logits.new_empty((B * S, T) + tuple(first.logits.shape[2:]), dtype=torch.float32)
        rows = logits[b * S:(b + 1) * S]
        rows[:, :P] = first.logits  # the prompt's logits, the same in every sample row
        # 2) copy the cache (the smear state included) into S rows, then decode the rest
        cS = runner.expand(c1, S, T)
        rest = tokens[b:b + 1, P:].expand(S, -1)
        _, hd = _run_steps(runner, rest, [1] * (T - P), capture, cache=cS,
                           on_step=on_step if b == B - 1 else None, out=rows[:, P:])
        if capture:
            hidden_rows.append(None if first.hiddens is None or hd is None else
                               [torch.cat([p.float().expand(S, -1, -1), d], dim=1) for p, d in zip(first.hiddens, hd)])
    hiddens = _stitch(hidden_rows, 0) if capture else None
    return logits, hiddens, [P] + [1] * (T - P), {CACHE_COPY: [P]}


def _engine_only(runner, tokens, opts, capture, on_step=None):
    raise ValueError(f"{runner.label}: the prefix schedule needs an engine's own prefix cache (Runner.run)")


def _speculative_plan(T: int, opts: ScheduleOptions) -> list[int]:
    if opts.draft < 1:
        raise ValueError(f"draft must be >= 1, got {opts.draft}")
    P = _prompt_len(T, opts)
    steps, left = [P], T - P
    while left > 0:
        steps.append(min(opts.draft, left))
        left -= steps[-1]
    return steps


def document_lengths(T: int, opts: ScheduleOptions) -> list[int]:
    """The packed schedule's documents: as given (they must cover T), else `chunks` near-equal ones."""
    if opts.documents is None:
        return split_even(T, opts.chunks)
    lengths = list(opts.documents)
    if any(n < 1 for n in lengths) or sum(lengths) != T:
        raise ValueError(f"documents of lengths {','.join(map(str, lengths))} do not cover the {T} tokens")
    return lengths


def _packed(runner, tokens, opts, capture, on_step=None):
    return boundaries.packed(runner, tokens, opts, capture, on_step, document_lengths(tokens.size(1), opts))


def _rollback(runner, tokens, opts, capture, on_step=None):
    return boundaries.rollback(runner, tokens, opts, capture, on_step, _prompt_len(tokens.size(1), opts))


STEP_PLANS: dict[str, Callable[[int, ScheduleOptions], list[int]]] = {
    "prefill": lambda T, o: [T],
    "decode": lambda T, o: [1] * T,
    "chunked": chunk_plan,
    "speculative": _speculative_plan,
}


def plan_steps(schedule: str, T: int, opts: ScheduleOptions = ScheduleOptions()) -> list[int]:
    """The step sizes a single-row schedule feeds `T` tokens in (not full, not engine)."""
    if schedule not in STEP_PLANS:
        raise ValueError(f"schedule {schedule!r} is not a plain sequence of steps; choose from {', '.join(STEP_PLANS)}")
    return STEP_PLANS[schedule](T, opts)


@dataclass(frozen=True)
class Schedule:
    name: str
    summary: str
    run: Callable = field(repr=False)
    needs: frozenset = frozenset()  # runner capabilities it needs (smearcli.runner)
    needs_one_of: frozenset = frozenset()  # of these, at least one (rollback: crop, or a copy)


SCHEDULES: dict[str, Schedule] = {s.name: s for s in [
    Schedule("full", "one forward pass, no cache (the reference)", _full),
    Schedule("prefill", "one cached step over all tokens", _stepped(STEP_PLANS["prefill"])),
    Schedule("decode", "one cached step per token", _stepped(STEP_PLANS["decode"])),
    Schedule("chunked", "cached chunks: N near-equal ones, or explicit sizes", _stepped(chunk_plan)),
    Schedule("engine", "batch-1 prefill, cache copied to `samples` rows, then `gen_len` one-token steps", _engine,
             frozenset({EXPAND})),
    Schedule("speculative", "prefill, then verify steps of `draft` tokens over the last `gen_len`", _stepped(STEP_PLANS["speculative"])),
    Schedule("packed", "each BOS-started document of the packed row alone, against the packed row", _packed),
    Schedule("padded", "the row beside its prefix right- and left-padded in one batch, with the mask",
             boundaries.padded, frozenset({PADDED_BATCH})),
    Schedule("rollback", "prefill, then drafts of `draft` tokens whose last `reject` are rejected and "
             "taken back out of the cache", _rollback, needs_one_of=frozenset({CROP, COPY})),
    Schedule("prefix", "a request for a prefix of whole blocks, then the sequence reading them from the prefix cache",
             _engine_only, frozenset({PREFIX_CACHE})),
]}
assert tuple(SCHEDULES) == SCHEDULE_NAMES


def runnable(runner: Runner, schedule: str) -> bool:
    """Whether `runner` declares every capability `schedule` needs."""
    s = SCHEDULES[schedule]
    one_of = not s.needs_one_of or any(runner.can(c) for c in s.needs_one_of)
    return one_of and all(runner.can(c) for c in s.needs)


def missing(runner: Runner, schedule: str) -> str:
    """What `runner` lacks for `schedule`, in words: "it needs: expand", "it can neither crop nor copy its cache"."""
    s = SCHEDULES[schedule]
    if s.needs_one_of and not any(runner.can(c) for c in s.needs_one_of):
        return f"it can neither {' nor '.join(sorted(s.needs_one_of))} its cache"
    return "it needs: " + ", ".join(sorted(c for c in s.needs if not runner.can(c)))


def as_runner(target, logic: Optional[str] = None) -> Runner:
    """`target` itself when it is a Runner (then `logic` must be None); our GPT under `logic`."""
    if isinstance(target, Runner):
        if logic is not None:
            raise ValueError(f"a runner brings its own logic ({target.label}); leave logic out")
        return target
    from .ours import GPTRunner  # our GPT: the one model smearcli itself implements
    return GPTRunner(target, logic or "fixed")


def run_schedule(target, tokens: Tensor, schedule: str, logic: Optional[str] = None,
                 opts: ScheduleOptions = ScheduleOptions(), capture: bool = True,
                 progress: Optional[Callable[[int, int], None]] = None) -> RunResult:
    """Run `tokens` (B, T) under one schedule on a runner (or on our GPT under `logic`), without
    gradients. `progress(done, total)`, if given, is called after each forward step with the
    positions fed so far and T (engine: counted on its last input row)."""
    if schedule not in SCHEDULES:
        raise ValueError(f"unknown schedule {schedule!r}; choose from {', '.join(SCHEDULES)}")
    runner = as_runner(target, logic)
    if not runnable(runner, schedule):
        raise CannotRun(f"{runner.label} cannot run the {schedule} schedule ({missing(runner, schedule)})")
    B, T = tokens.shape
    done = [0]

    def on_step(n: int) -> None:
        done[0] += n
        progress(done[0], T)
    with torch.inference_mode():
        whole = runner.run(schedule, tokens, opts)  # an engine that schedules by itself
        if whole is not None:
            if progress:
                progress(T, T)
            return whole
        logits, hiddens, steps, marks, *extra = SCHEDULES[schedule].run(runner, tokens, opts, capture,
                                                                        on_step if progress else None)
    rows = logits.size(0)
    row_map = [r * B // rows for r in range(rows)] if rows != B else list(range(B))
    return RunResult(schedule, runner.label, logits, hiddens, steps, row_map, marks, **(extra[0] if extra else {}))
