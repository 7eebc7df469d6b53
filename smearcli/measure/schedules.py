"""Execution schedules: the ways an inference stack feeds the same tokens to the model.

The registry `SCHEDULES` is the one list every caller uses (CLI, plots, bench, census, notebooks,
tests). Each schedule turns (runner, tokens, options) into a `RunResult` holding the logits and,
on request, every captured hidden state, laid out as if the whole sequence had run at once, and
the boundaries it crossed by kind (`CHUNK_START`, `CACHE_COPY`). A runner (`smearcli.measure.runner`) is
any implementation; a schedule that needs a capability (engine: copying a cache) declares it, and
`runnable(runner, name)` is the one answer to whether it runs there: the CLI offers each
implementation the schedules its runner's capabilities allow, and nothing else decides.

To add a schedule, write it in one module and register it once:

```python
from smearcli.measure.schedules import Ran, Schedule, register

def run(runner, tokens, opts, capture, on_step=None):  # -> Ran(logits, hiddens, steps, marks)
    ...

register(Schedule("mine", "what it feeds, in one phrase", run, shape="what its failure is",
                  marks=(("my_mark", "the figure legend's words"),), census=True))
```

`compare`, its table and JSON, the figures (its marks), the census (an entry per architecture
when `census=True`) and, given a `Repro`, the census's reproducers then know it by name
(`tests/core/test_boundary_plugin.py` does exactly this with a toy boundary). `unregister` takes it out.

- full: one forward pass without a cache. The reference every other run is measured against.
- prefill: one cached step over all tokens.
- decode: one cached step per token.
- chunked: cached steps of the given chunk sizes (chunked prefill).
- engine: upstream Engine's batch expansion: a batch-1 prefill of all but the last `gen_len`
  tokens, the cache copied into `samples` rows, then one token per step on every row.
- speculative: a prefill of all but the last `gen_len` tokens, then verify steps of `draft`
  tokens at once, as speculative decoding feeds accepted drafts.
- packed, padded, rollback: documents packed in one row, padded batches, rejected drafts
  (`smearcli.measure.boundaries`, which records DOCUMENT_START, PADDING and ROLLBACK boundaries).
- prefix: a first request over a prefix of whole cache blocks, then the whole sequence as a second
  request that reads those blocks from the engine's prefix cache. Only a runner that declares
  `PREFIX_CACHE` runs it, in its own `run()`.

A run an engine could not complete is still a result: `RunResult.outcome` says why, in the judge's
words (`judge.RAISED`, with the engine's message; `judge.CHECKED_NOTHING`: it ran, but did not
exercise what the schedule tests, e.g. a prefix cache that was never read), and `compare` reports
it without measuring it.
"""

from __future__ import annotations

from typing import Callable, Optional

import torch
from torch import Tensor

from . import boundaries
from ..util.errors import CannotRun
from ..util.defaults import REFERENCE, SCHEDULE_NAMES
from .owned import Owned
from .runner import EXPAND, PREFIX_CACHE, Runner
from .steps import CACHE_COPY, Ran, RunResult, Schedule, ScheduleOptions, chunk_plan, prompt_len


# -- the built-in schedules' runs -------------------------------------------------------------------

def _full(runner, tokens, opts, capture, on_step=None):
    out = runner.forward(tokens, capture)
    if on_step is not None:
        on_step(tokens.size(1))
    return Ran(out.logits.float(), _stitch([out.hiddens], 1) if capture else None, [tokens.size(1)])


def _stepped(plan: Callable[[int, ScheduleOptions], list[int]]):
    def run(runner, tokens, opts, capture, on_step=None):
        steps = plan(tokens.size(1), opts)
        logits, hiddens = _run_steps(runner, tokens, steps, capture, on_step=on_step)
        return Ran(logits, hiddens, steps)
    return run


def _engine(runner, tokens, opts, capture, on_step=None):
    B, T = tokens.shape
    S = opts.samples
    if S < 1:
        raise ValueError(f"samples must be >= 1, got {S}")
    P = prompt_len(T, opts)
    logits, hidden_rows = None, []  # logits: (B * S, T, V), each row block written in place
    for b in range(B):
        # 1) batch-1 prefill of the prompt
        c1 = runner.new_cache(1, P)
        first = runner.step(tokens[b:b + 1, :P], c1, capture)
        if on_step is not None and b == B - 1:
            on_step(P)
        # 2) copy the cache (the smear state included) into S rows, then decode the rest
        cS = runner.expand(c1, S, T)
        rest = tokens[b:b + 1, P:].expand(S, -1)
        if B == 1:  # its samples' logits held once where they decode alike (`_one_row`)
            tail, hd = _run_steps(runner, rest, [1] * (T - P), capture, cache=cS, on_step=on_step)
            logits = _one_row(first.logits, tail)
        else:
            if logits is None:
                logits = first.logits.new_empty((B * S, T) + tuple(first.logits.shape[2:]), dtype=torch.float32)
            rows = logits[b * S:(b + 1) * S]
            rows[:, :P] = first.logits  # the prompt's logits, the same in every sample row
            _, hd = _run_steps(runner, rest, [1] * (T - P), capture, cache=cS,
                               on_step=on_step if b == B - 1 else None, out=rows[:, P:])
        if capture:
            hidden_rows.append(None if first.hiddens is None or hd is None else
                               [torch.cat([p.float().expand(S, -1, -1), d], dim=1) for p, d in zip(first.hiddens, hd)])
    hiddens = _stitch(hidden_rows, 0) if capture else None
    return Ran(logits, hiddens, [P] + [1] * (T - P), {CACHE_COPY: [P]})


def _one_row(prompt: Tensor, tail: Tensor) -> Tensor:
    """One input row's engine logits (S, T, V) from its prompt's (1, P, V) and its S samples'
    decoded ones (S, T - P, V). Every sample row begins with the same prompt logits (one prefill,
    its cache copied); where the samples also decoded bit for bit alike, the S rows are one
    (1, T, V) row expanded (stride 0): at d12 / 1024 tokens one 260 MB copy of the prompt's
    logits, not S, and as much less memory held. Samples that differ are written out in full."""
    P, S = prompt.size(1), tail.size(0)
    if all(torch.equal(tail[i], tail[0]) for i in range(1, S)):
        row = prompt.new_empty((1, P + tail.size(1), prompt.size(2)), dtype=torch.float32)
        row[:, :P], row[:, P:] = prompt, tail[:1]
        return row.expand(S, -1, -1)
    rows = prompt.new_empty((S, P + tail.size(1), prompt.size(2)), dtype=torch.float32)
    rows[:, :P], rows[:, P:] = prompt, tail
    return rows


def _engine_only(runner, tokens, opts, capture, on_step=None):
    raise ValueError(f"{runner.label}: the prefix schedule needs an engine's own prefix cache (Runner.run)")


def _speculative_plan(T: int, opts: ScheduleOptions) -> list[int]:
    if opts.draft < 1:
        raise ValueError(f"draft must be >= 1, got {opts.draft}")
    P = prompt_len(T, opts)
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


# -- the step loop --------------------------------------------------------------------------------
# Every step-driven schedule ends here: the runner's cached steps, each one's outputs written where
# they belong (each already checked and owned: the runner arrives wrapped in `owned.Owned`).

def _run_steps(runner: Runner, tokens: Tensor, steps: list[int], capture: bool,
               cache=None, on_step=None, out=None, receive=None) -> tuple[Tensor, Optional[list[Tensor]]]:
    """Feed `tokens` (B, T) through the runner's cache in steps; each step's outputs are written
    where they belong in one (B, T, ...) fp32 tensor per output, so nothing is concatenated (at
    d12 and 1024 tokens a logits row is 256 MB), before the next step is asked for: `runner` is an
    `owned.Owned`, which checks each step and leaves the copy to this loop. `out`: the logits tensor
    to write into (a view of a larger one, as the engine schedule gives); `on_step(n)` is called
    after each step of n tokens. `receive(pos, logits)`: each step's logits handed over instead of
    kept (`stream_logits`): no run tensor is made, and (None, None) is returned."""
    B, T = tokens.shape
    if cache is None:
        cache = runner.new_cache(B, T)
    logits, hiddens, depth = out, None, None  # hiddens: None until a step returns them, [] if one did not
    pos = 0
    for n in steps:
        if receive is not None:
            receive(pos, runner.step(tokens[:, pos:pos + n], cache, False, keep=False).logits)
            pos += n
            if on_step is not None:
                on_step(n)
            continue
        if n == T and pos == 0 and out is None:  # one step over every token (prefill): its owned outputs are the run's
            step = runner.step(tokens, cache, capture)
            logits, hiddens = step.logits, list(step.hiddens or [])  # [] (none) reads as None below
            pos = T
            if on_step is not None:
                on_step(n)
            continue
        step = runner.step(tokens[:, pos:pos + n], cache, capture, keep=False)  # checked; copied just below
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
    if receive is not None:
        return None, None
    return logits, (hiddens or None) if capture else None


def stream_logits(runner: Runner, tokens: Tensor, schedule: str, receive: Callable[[int, Tensor], None],
                  opts: ScheduleOptions = ScheduleOptions()) -> bool:
    """Run a plain sequence of steps (`STEP_PLANS`: prefill, decode, chunked, speculative) on
    `runner`, handing each step's logits (B, n, V) to `receive(pos, logits)` (pos: the step's first
    position) before the next step, and keeping none: for a caller that reduces a run as it goes (a
    confirmation's max |dlogit|: at d12 / 1024 tokens a float64 run is 537 MB that need not exist).
    Each is checked (`owned.Owned`) but not copied: read it before `receive` returns, as a runner
    may write the same tensor again on its next step.
    An engine that runs the schedule whole hands over its logits in one piece. False, having run
    nothing, for any other schedule: run it with `run_schedule`."""
    if schedule not in STEP_PLANS:
        return False
    driven = _driven(runner, schedule)
    with torch.inference_mode():
        whole = driven.run(schedule, tokens, opts)
        if whole is not None:
            if whole.outcome is not None:  # nothing measured: said as the engine said it
                raise RuntimeError(f"its {schedule} run: {whole.outcome}: {whole.message}")
            receive(0, whole.logits)
            return True
        _run_steps(driven, tokens, plan_steps(schedule, tokens.size(1), opts), False, receive=receive)
    return True


def run_steps(runner: Runner, tokens: Tensor, steps, capture: bool = False, schedule: str = "steps") -> RunResult:
    """`tokens` (B, T) fed through a fresh cache in any plan of `steps` (a census fuzzes them),
    without gradients, as a RunResult named `schedule`."""
    with torch.inference_mode():
        logits, hiddens = _run_steps(Owned(runner, schedule), tokens, list(steps), capture)
    return RunResult(schedule, runner.label, logits, hiddens, list(steps), list(range(tokens.size(0))))


def _stitch(parts: list, dim: int) -> Optional[list[Tensor]]:
    """Concatenate per-step hidden-state lists along `dim`; None when any step had none."""
    if not parts or any(p is None for p in parts):
        return None
    depth = {len(p) for p in parts}
    if len(depth) != 1:
        raise ValueError("steps returned different numbers of hidden states")
    return [torch.cat([p[i].float() for p in parts], dim=dim) for i in range(depth.pop())]


# -- the registry ---------------------------------------------------------------------------------

BUILT_IN = (
    Schedule("full", "one forward pass, no cache (the reference)", _full),
    Schedule("prefill", "one cached step over all tokens", _stepped(STEP_PLANS["prefill"])),
    Schedule("decode", "one cached step per token", _stepped(STEP_PLANS["decode"])),
    Schedule("chunked", "cached chunks: N near-equal ones, or explicit sizes", _stepped(chunk_plan)),
    Schedule("engine", "batch-1 prefill, cache copied to `samples` rows, then `gen_len` one-token steps", _engine,
             frozenset({EXPAND})),
    Schedule("speculative", "prefill, then verify steps of `draft` tokens over the last `gen_len`",
             _stepped(STEP_PLANS["speculative"])),
    *boundaries.BOUNDARIES,
    Schedule("prefix", "a request for a prefix of whole blocks, then the sequence reading them from the prefix cache",
             _engine_only, frozenset({PREFIX_CACHE})),
)
SCHEDULES: dict[str, Schedule] = {s.name: s for s in BUILT_IN}  # `register` adds to it
assert tuple(SCHEDULES) == SCHEDULE_NAMES


def register(schedule: Schedule) -> Schedule:
    """Add (or replace) a schedule: every caller then knows it by name."""
    SCHEDULES[schedule.name] = schedule
    return schedule


def unregister(name: str) -> None:
    """Take a registered schedule out again (a test's toy, a plug-in unloaded)."""
    SCHEDULES.pop(name)


def missing(runner, schedule: str) -> str:
    """What `runner` lacks for `schedule`, in words ("it needs: expand", "it can neither crop nor
    copy its cache"), or "" when it can run it. `runner`: a Runner or a Runner class (what it
    declares: the CLI asks before any model is built)."""
    s = SCHEDULES[schedule]
    if isinstance(runner, type):
        has = lambda c: c in runner.capabilities  # noqa: E731
    else:
        has = runner.can
    own = runner.runs_itself  # an engine that runs whole schedules: those it names, no others
    if own is not None and schedule not in own and schedule != REFERENCE:
        return f"it runs only {', '.join(n for n in SCHEDULES if n in own)} itself"
    if s.needs_one_of and not any(has(c) for c in s.needs_one_of):
        return f"it can neither {' nor '.join(sorted(s.needs_one_of))} its cache"
    lacks = sorted(c for c in s.needs if not has(c))
    return "it needs: " + ", ".join(lacks) if lacks else ""


def runnable(runner, schedule: str) -> bool:
    """Whether `runner` (a Runner or a Runner class) declares what `schedule` needs."""
    return not missing(runner, schedule)


def shape(schedule: str) -> Optional[str]:
    """The shape of a registered boundary's failure, in words (None: a plain schedule)."""
    s = SCHEDULES.get(schedule)
    return None if s is None else s.shape


def shape_at(schedule: str) -> Optional[str]:
    """The mark kind where a boundary's error must be born for its shape to hold (None: anywhere)."""
    s = SCHEDULES.get(schedule)
    return None if s is None else s.shape_at


def mark_words() -> dict[str, str]:
    """Every mark kind the registered schedules record beyond chunk starts, and a figure's words
    for it, in registry order."""
    return {kind: words for s in SCHEDULES.values() for kind, words in s.marks}


def compare_schedules() -> tuple[str, ...]:
    """The schedules compare offers, in registry order: every registered one but the census's own
    (`Schedule.compare`), so its list is the same whether or not the census has been imported."""
    return tuple(s.name for s in SCHEDULES.values() if s.compare)


def census_schedules() -> tuple[str, ...]:
    """The boundaries the census runs on every architecture, in registry order."""
    return tuple(s.name for s in SCHEDULES.values() if s.census)


def as_runner(target, logic: Optional[str] = None) -> Runner:
    """`target` itself when it is a Runner (then `logic` must be None); our GPT under `logic`."""
    if isinstance(target, Runner):
        if logic is not None:
            raise ValueError(f"a runner brings its own logic ({target.label}); leave logic out")
        return target
    from ..gpt.gpt_runners import GPTRunner  # our GPT: the one model smearcli itself implements
    return GPTRunner(target, logic or "fixed")


def _driven(runner: Runner, schedule: str) -> Owned:
    """`runner` as `schedule` drives it, every output checked and copied as it is received
    (`owned.Owned`); CannotRun when the runner lacks what the schedule needs."""
    if not runnable(runner, schedule):
        raise CannotRun(f"{runner.label} cannot run the {schedule} schedule ({missing(runner, schedule)})")
    return Owned(runner, schedule)


def run_schedule(target, tokens: Tensor, schedule: str, logic: Optional[str] = None,
                 opts: ScheduleOptions = ScheduleOptions(), capture: bool = True,
                 progress: Optional[Callable[[int, int], None]] = None) -> RunResult:
    """Run `tokens` (B, T) under one schedule on a runner (or on our GPT under `logic`), without
    gradients. `progress(done, total)`, if given, is called after each forward step with the
    positions fed so far and T (engine: counted on its last input row)."""
    if schedule not in SCHEDULES:
        raise ValueError(f"unknown schedule {schedule!r}; choose from {', '.join(SCHEDULES)}")
    runner = as_runner(target, logic)
    driven = _driven(runner, schedule)  # every output checked and copied as it is received
    B, T = tokens.shape
    done = [0]

    def on_step(n: int) -> None:
        done[0] += n
        progress(done[0], T)
    with torch.inference_mode():
        whole = driven.run(schedule, tokens, opts)  # an engine that schedules by itself
        if whole is not None:
            if progress:
                progress(T, T)
            return whole
        ran = SCHEDULES[schedule].run(driven, tokens, opts, capture, on_step if progress else None)
    rows = ran.logits.size(0)
    row_map = [r * B // rows for r in range(rows)] if rows != B else list(range(B))
    return RunResult(schedule, runner.label, ran.logits, ran.hiddens, list(ran.steps), row_map, dict(ran.marks),
                     ran.starts, tuple(ran.notes))
