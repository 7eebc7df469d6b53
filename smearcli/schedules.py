"""Execution schedules: the ways an inference stack feeds the same tokens to the model.

The registry `SCHEDULES` is the one list every caller uses (CLI, plots, bench, notebooks, tests).
Each schedule turns (model, tokens, logic, options) into a `RunResult` holding the logits and,
on request, every captured hidden state, laid out as if the whole sequence had run at once.

- full: one forward pass without a cache. The reference every other run is measured against.
- prefill: one cached step over all tokens.
- decode: one cached step per token.
- chunked: cached steps of the given chunk sizes (chunked prefill).
- engine: upstream Engine's batch expansion: a batch-1 prefill of all but the last `gen_len`
  tokens, the cache copied into `samples` rows, then one token per step on every row.
- speculative: a prefill of all but the last `gen_len` tokens, then verify steps of `draft`
  tokens at once, as speculative decoding feeds accepted drafts.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Optional

import torch
from torch import Tensor

from .model import GPT
from .names import CHUNKS, DRAFT, GEN_LEN, SAMPLES, SCHEDULE_NAMES


@dataclass(frozen=True)
class ScheduleOptions:
    chunks: int = CHUNKS  # near-equal chunks for `chunked` (ignored when chunk_sizes is set)
    chunk_sizes: Optional[tuple[int, ...]] = None
    samples: int = SAMPLES  # rows after engine-style expansion
    gen_len: int = GEN_LEN  # tokens generated after the prompt (engine, speculative)
    draft: int = DRAFT  # tokens per speculative verify step


@dataclass
class RunResult:
    schedule: str
    logic: str
    logits: Tensor  # (R, T, V) fp32
    hiddens: Optional[list[Tensor]]  # [post-smear emb, block 0 .. block L-1], each (R, T, C) fp32
    steps: list[int]  # the sizes of the forward steps, in order (per input row)
    row_map: list[int]  # input row each output row reproduces (engine expands rows)
    expand_at: Optional[int] = None  # position where engine-style expansion happened

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
        out, pos = [], 0
        for n in self.steps:
            if pos > 0 and n > 1:
                out.append(pos)
            pos += n
        return out


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


def _run_steps(model: GPT, tokens: Tensor, steps: list[int], logic: str, capture: bool,
               cache=None, on_step=None) -> tuple[Tensor, Optional[list[Tensor]]]:
    """Feed `tokens` (B, T) through the cache in steps; stitch outputs back along T.
    `on_step(n)` is called after each step of n tokens."""
    B, T = tokens.shape
    if cache is None:
        cache = model.new_cache(B, T)
    pos0 = cache.get_pos()
    logits, caps = [], []
    pos = 0
    for n in steps:
        cap = [] if capture else None
        logits.append(model(tokens[:, pos:pos + n], cache=cache, smear=logic, capture=cap))
        caps.append(cap)
        pos += n
        if on_step is not None:
            on_step(n)
    assert pos == T and cache.get_pos() == pos0 + T
    hiddens = [torch.cat([c[i] for c in caps], dim=1) for i in range(len(caps[0]))] if capture else None
    return torch.cat(logits, dim=1), hiddens


def _full(model, tokens, logic, opts, capture, on_step=None):
    cap = [] if capture else None
    logits = model(tokens, smear=logic, capture=cap)
    if on_step is not None:
        on_step(tokens.size(1))
    return logits, cap, [tokens.size(1)], None


def _stepped(plan: Callable[[int, ScheduleOptions], list[int]]):
    def run(model, tokens, logic, opts, capture, on_step=None):
        steps = plan(tokens.size(1), opts)
        logits, hiddens = _run_steps(model, tokens, steps, logic, capture, on_step=on_step)
        return logits, hiddens, steps, None
    return run


def _engine(model, tokens, logic, opts, capture, on_step=None):
    B, T = tokens.shape
    S = opts.samples
    if S < 1:
        raise ValueError(f"samples must be >= 1, got {S}")
    P = _prompt_len(T, opts)
    logits_rows, hidden_rows = [], []
    for b in range(B):
        # 1) batch-1 prefill of the prompt
        c1 = model.new_cache(1, P)
        cap = [] if capture else None
        lp = model(tokens[b:b + 1, :P], cache=c1, smear=logic, capture=cap)
        if on_step is not None and b == B - 1:
            on_step(P)
        # 2) copy the cache (prev_embedding included) into S rows, then decode the rest
        cS = model.new_cache(S, T)
        cS.expand_from(c1)
        rest = tokens[b:b + 1, P:].expand(S, -1)
        ld, hd = _run_steps(model, rest, [1] * (T - P), logic, capture, cache=cS,
                            on_step=on_step if b == B - 1 else None)
        logits_rows.append(torch.cat([lp.expand(S, -1, -1), ld], dim=1))
        if capture:
            hidden_rows.append([torch.cat([p.expand(S, -1, -1), d], dim=1) for p, d in zip(cap, hd)])
    logits = torch.cat(logits_rows, dim=0)
    hiddens = [torch.cat([h[i] for h in hidden_rows], dim=0) for i in range(len(hidden_rows[0]))] if capture else None
    return logits, hiddens, [P] + [1] * (T - P), P


def _speculative_plan(T: int, opts: ScheduleOptions) -> list[int]:
    if opts.draft < 1:
        raise ValueError(f"draft must be >= 1, got {opts.draft}")
    P = _prompt_len(T, opts)
    steps, left = [P], T - P
    while left > 0:
        steps.append(min(opts.draft, left))
        left -= steps[-1]
    return steps


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


SCHEDULES: dict[str, Schedule] = {s.name: s for s in [
    Schedule("full", "one forward pass, no cache (the reference)", _full),
    Schedule("prefill", "one cached step over all tokens", _stepped(STEP_PLANS["prefill"])),
    Schedule("decode", "one cached step per token", _stepped(STEP_PLANS["decode"])),
    Schedule("chunked", "cached chunks: N near-equal ones, or explicit sizes", _stepped(chunk_plan)),
    Schedule("engine", "batch-1 prefill, cache copied to `samples` rows, then `gen_len` one-token steps", _engine),
    Schedule("speculative", "prefill, then verify steps of `draft` tokens over the last `gen_len`", _stepped(STEP_PLANS["speculative"])),
]}
assert tuple(SCHEDULES) == SCHEDULE_NAMES


def run_schedule(model: GPT, tokens: Tensor, schedule: str, logic: str,
                 opts: ScheduleOptions = ScheduleOptions(), capture: bool = True,
                 progress: Optional[Callable[[int, int], None]] = None) -> RunResult:
    """Run `tokens` (B, T) under one schedule and one smear logic, without gradients.
    `progress(done, total)`, if given, is called after each forward step with the positions fed
    so far and T (engine: counted on its last input row)."""
    if schedule not in SCHEDULES:
        raise ValueError(f"unknown schedule {schedule!r}; choose from {', '.join(SCHEDULES)}")
    B, T = tokens.shape
    done = [0]

    def on_step(n: int) -> None:
        done[0] += n
        progress(done[0], T)
    with torch.inference_mode():
        logits, hiddens, steps, expand_at = SCHEDULES[schedule].run(model, tokens, logic, opts, capture,
                                                                    on_step if progress else None)
    rows = logits.size(0)
    row_map = [r * B // rows for r in range(rows)] if rows != B else list(range(B))
    return RunResult(schedule, logic, logits, hiddens, steps, row_map, expand_at)
