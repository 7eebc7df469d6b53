"""`bench` as a library call: what the fixed smear costs, and what each schedule costs.

Owns the settings, the A B A B rounds, the micro-benchmark of the smear functions and the result
types; statistics are in `bench.stats`, clocks and meters in `bench.meters`, output in
`bench.report`.

```python
from smearcli.measure import inputs
from smearcli.gpt import weights
from smearcli.bench import harness
lm = weights.random_model()
result = harness.bench(lm.model, inputs.random_tokens(lm.model.config, 256), ["prefill", "chunked"])
print(result.ratio("chunked").summary.median)  # fixed/old time of a chunked prefill
```

Method, chosen so the numbers survive a noisy machine:

- Every schedule runs through `schedules.run_schedule(..., capture=False)`, the code `compare`
  checks. For each schedule the logics alternate, old, fixed, old, fixed, ..., first for
  `warmup` untimed rounds, then for `repeats` timed rounds, so slow drift (thermal, other
  processes) hits both alike. Each timed round gives one fixed/old ratio; the ratios are
  summarised like the times (median and interquartile range), not divided after the fact.
- A micro-benchmark times the two smear functions of `smear.LOGICS` on the same inputs (a chunk
  with a cached predecessor, and a decode step), since in a whole forward pass their cost drowns
  in the matmuls. Each sample is the mean of `micro_inner` calls.
- On CUDA the device is synchronised before and after every timed region; peak memory is the
  caching allocator's peak above what was allocated before the run. On CPU it is the growth of
  the process's peak resident set (VmHWM, reset before the run, after returning freed heap to
  the OS where glibc allows). Memory is taken on one extra untimed run per cell after the timed
  ones, so the bookkeeping never sits inside a timed run and one-off first-run allocations
  are not counted.
- With `repeats=None` the number of timed rounds per schedule follows from the time of its
  warm-up round and what is left of `budget_s` (at least `min_repeats`), so a quick run stays
  quick on a slow machine; the JSON records how many ran.
- FLOPs come from the configuration (`smearcli.gpt.flops`); achieved FLOP/s is FLOPs over the median
  time, and, with `peak=True`, a fraction of the best FLOP/s of a square matmul measured on the
  same device, in the same dtype, in the same run.

`to_json` gives schema `smearcli.bench/1`: environment, settings, model config, the raw samples
of every cell and every pair's ratio, and their summaries.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable, Optional, Sequence

import torch
from torch import Tensor

from ..gpt import flops as F
from ..gpt.model import GPT, rms_norm
from ..util.defaults import LOGIC_NAMES
from ..measure.schedules import run_schedule
from ..measure.steps import ScheduleOptions, chunk_plan
from ..gpt.smear import LOGICS
from .sampled import MIN_SAMPLE, DecodeSample, sample_window, steps_that_fit, time_decode_steps
from .rounds import Tracker, alternate
from .meters import MemoryMeter, Peak, Timer, environment, measure_peak
from .stats import Summary, pair_ratios

Progress = Optional[Callable[[str, int, int], None]]


# -- results --------------------------------------------------------------------------------------
@dataclass(frozen=True)
class BenchSettings:
    warmup: int = 1  # untimed rounds per schedule (each runs every logic once)
    repeats: Optional[int] = None  # timed rounds per schedule; None: as many as `budget_s` allows
    budget_s: float = 20.0  # with repeats=None: the whole bench's target time
    min_repeats: int = 1  # with repeats=None: never fewer timed rounds (the report says when an IQR lacks pairs)
    max_repeats: int = 20  # with repeats=None: never more
    micro: bool = True  # time the smear functions on their own
    micro_repeats: int = 300  # timed rounds of the micro-benchmark
    micro_inner: Optional[int] = None  # smear calls per micro sample (None: 1 on CPU, 20 on GPUs)
    peak: bool = True  # measure a matmul peak and report achieved FLOP/s against it
    peak_size: Optional[int] = None  # square matmul size (default: 2048 on CPU, 8192 on GPUs)
    memory: bool = True  # peak memory of each cell, on one extra untimed run after the timed ones
    decode_sample: Optional[int] = None  # decode: one-token steps timed per run (None: all, unless over budget; 0: all)

    def check(self) -> None:
        if self.warmup < 0:
            raise ValueError(f"warmup must be >= 0, got {self.warmup}")
        if self.repeats is not None and self.repeats < 1:
            raise ValueError(f"repeats must be >= 1, got {self.repeats}")
        if not 1 <= self.min_repeats <= self.max_repeats:
            raise ValueError(f"need 1 <= min_repeats <= max_repeats, got {self.min_repeats}, {self.max_repeats}")
        if self.budget_s <= 0:
            raise ValueError(f"budget_s must be positive, got {self.budget_s}")
        if self.micro_repeats < 1 or (self.micro_inner is not None and self.micro_inner < 1):
            raise ValueError(f"micro_repeats and micro_inner must be >= 1, got {self.micro_repeats}, {self.micro_inner}")
        if self.peak_size is not None and self.peak_size < 1:
            raise ValueError(f"peak_size must be >= 1, got {self.peak_size}")

    def choose_repeats(self, round_s: float, left_s: float, schedules_left: int) -> int:
        """Timed rounds for a schedule whose round takes `round_s`, when `left_s` seconds of the
        budget remain for it and the `schedules_left - 1` after it: its share over one round,
        less the memory round, within [min_repeats, max_repeats]."""
        if self.repeats is not None:
            return self.repeats
        share = left_s / max(schedules_left, 1)
        n = int(share / round_s) - (1 if self.memory else 0) if round_s > 0 else self.max_repeats
        return max(self.min_repeats, min(self.max_repeats, n))

    def inner_for(self, device: torch.device) -> int:
        if self.micro_inner is not None:
            return self.micro_inner
        return 1 if device.type == "cpu" else 20


@dataclass
class Cell:
    """One (schedule, logic): its timed samples and what one run does."""
    schedule: str
    logic: str
    samples: list[float]  # seconds per run, in the order they ran
    steps: int  # forward steps per run
    tokens: int  # tokens fed through the model per run (all rows)
    flops: int  # forward FLOPs per run
    peak_mem: Optional[int] = None  # bytes, see MemoryMeter
    sampled: Optional[DecodeSample] = None  # set when only these steps were timed (samples are scaled)

    @property
    def summary(self) -> Summary:
        return Summary.of(self.samples)

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.summary.median

    @property
    def flops_per_s(self) -> float:
        return self.flops / self.summary.median


@dataclass
class Ratio:
    """fixed/old time per alternated pair (pair i = the i-th timed round)."""
    name: str
    ratios: list[float]

    @property
    def summary(self) -> Summary:
        return Summary.of(self.ratios)


@dataclass
class MicroCase:
    """The smear functions alone on one input shape."""
    name: str
    shape: tuple[int, int, int]  # (B, T, C) of x
    cached: bool
    with_prev: bool
    samples: dict[str, list[float]]  # logic -> seconds per call, one per sample
    ratio: Optional[Ratio] = None
    inner: int = 1  # calls timed together per sample


@dataclass
class BenchResult:
    env: dict
    settings: BenchSettings
    config: dict
    batch: int
    seq_len: int
    options: ScheduleOptions
    cells: list[Cell]
    ratios: list[Ratio]
    micro: list[MicroCase] = field(default_factory=list)
    peak: Optional[Peak] = None
    memory_kind: str = "unavailable"
    calls: list[tuple[str, str, str, int]] = field(default_factory=list)  # (phase, what, logic, round)
    wall_s: float = 0.0

    def cell(self, schedule: str, logic: str) -> Cell:
        for c in self.cells:
            if c.schedule == schedule and c.logic == logic:
                return c
        raise KeyError((schedule, logic))

    def ratio(self, schedule: str) -> Ratio:
        for r in self.ratios:
            if r.name == schedule:
                return r
        raise KeyError(schedule)

    def peak_fraction(self, cell: Cell) -> Optional[float]:
        return None if self.peak is None else cell.flops_per_s / self.peak.flops_per_s


# -- the harness ----------------------------------------------------------------------------------
def micro_inputs(model: GPT, batch: int, T: int, seed: int = 0) -> tuple[Tensor, Tensor]:
    """A (batch, T, C) pre-smear embedding and a (batch, 1, C) predecessor, normed like the model's."""
    C = model.config.n_embd
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(batch, T, C, generator=g)
    prev = torch.randn(batch, 1, C, generator=g)
    return (rms_norm(x).to(device=model.device, dtype=model.dtype),
            rms_norm(prev).to(device=model.device, dtype=model.dtype))


def micro_bench(model: GPT, batch: int, chunk_len: int, logics: Sequence[str], settings: BenchSettings,
                timer: Timer, log: Optional[list] = None, tracker: Optional[Tracker] = None) -> list[MicroCase]:
    """The smear functions alone on the same inputs: a chunk of `chunk_len` tokens after cached
    ones (where old and fixed differ), and a single decode step. Old and fixed alternate call
    block by call block, so a preempted block spoils one pair, not the median."""
    cases = []
    w, lam = model.smear_gate.weight, model.smear_lambda
    inner = settings.inner_for(model.device)
    for name, T in (("chunk", chunk_len), ("decode", 1)):
        x, prev = micro_inputs(model, batch, T)

        def make(fn, x=x, prev=prev):
            def go():
                for _ in range(inner):
                    fn(x, w, lam, prev, True)
            return go

        with torch.inference_mode():
            totals = alternate({lg: make(LOGICS[lg]) for lg in logics}, max(settings.warmup, 1) * 10,
                               settings.micro_repeats, timer.measure, log=log, what=f"smear:{name}",
                               tracker=tracker).samples
        per_call = {lg: [t / inner for t in ts] for lg, ts in totals.items()}
        r = pair_ratios(per_call)
        cases.append(MicroCase(name, (batch, T, model.config.n_embd), True, True, per_call,
                               None if r is None else Ratio(f"smear:{name}", r), inner))
    return cases


def micro_chunk_len(T: int, options: ScheduleOptions) -> int:
    """The chunk the micro-benchmark smears: the chunked schedule's second chunk (the first that
    follows cached tokens), or T // 2 when the plan has one chunk."""
    plan = chunk_plan(T, options)
    return plan[1] if len(plan) > 1 else max(1, T // 2)


def bench(model: GPT, tokens: Tensor, schedules: Sequence[str], logics: Sequence[str] = LOGIC_NAMES,
          options: ScheduleOptions = ScheduleOptions(), settings: BenchSettings = BenchSettings(),
          timer: Optional[Timer] = None, run: Callable = run_schedule, progress: Progress = None,
          sample_decode: Callable = time_decode_steps) -> BenchResult:
    """Time every schedule under every logic (alternating), the smear alone, and a matmul peak.

    Order: matmul peak, smear micro-benchmark, then the schedules, so that with `repeats=None`
    each schedule gets its share of what is left of `budget_s`. `timer` and `run` are injectable:
    tests pass a fake clock and a recording runner (and `sample_decode`, which times a decode's
    sampled steps, see `bench.sampled`). `progress(description, done, total)` is called before
    every run."""
    settings.check()
    schedules = list(dict.fromkeys(schedules))
    if not schedules:
        raise ValueError("no schedules to bench")
    for lg in logics:
        if lg not in LOGICS:
            raise ValueError(f"unknown smear logic {lg!r}; choose from {', '.join(LOGICS)}")
    logics = list(dict.fromkeys(logics))
    device = model.device
    timer = timer or Timer(device)
    meter = MemoryMeter(device)
    cfg = model.config
    B, T = tokens.shape
    env = environment(device, model.dtype)  # load average at the start, before we add to it
    env["clock"] = timer.name
    t_start, wall_start = timer.clock(), time.perf_counter()
    calls: list = []
    tracker = Tracker(progress)

    peak = None
    if settings.peak:
        peak = measure_peak(device, model.dtype, timer, settings.peak_size, tick=tracker.tick)
    micro = []
    if settings.micro:
        micro = micro_bench(model, B, micro_chunk_len(T, options), logics, settings, timer,
                            log=calls, tracker=tracker)

    cells, ratios = [], []
    for i, sched in enumerate(schedules):
        results = {}
        share = (settings.budget_s - (timer.clock() - t_start)) / (len(schedules) - i)
        sampler = _Sampler(model, tokens, timer, meter if settings.memory else None, sample_decode)
        sample = _decode_sample(tokens, logics, settings, share, sampler) if sched == "decode" else None
        if sample is not None:
            cells_s, ratio = _sampled_cells(tokens, logics, settings, timer, sample, sampler, calls, tracker,
                                            t_start, len(schedules) - i)
            cells += cells_s
            ratios += [ratio] if ratio is not None else []
            continue

        def make(lg, sched=sched):
            def go():
                results[lg] = run(model, tokens, sched, lg, options, capture=False)
            return go

        def choose(round_s, left=len(schedules) - i):
            return settings.choose_repeats(round_s, settings.budget_s - (timer.clock() - t_start), left)

        rounds = alternate({lg: make(lg) for lg in logics}, settings.warmup, settings.repeats or choose,
                           timer.measure, log=calls, what=sched, tracker=tracker,
                           memory=meter.measure if settings.memory else None,
                           memory_extra=lambda round_s: settings.budget_s - (timer.clock() - t_start) > 2 * round_s)
        for lg in logics:
            res = results[lg]
            rows = res.logits.size(0)
            cells.append(Cell(sched, lg, rounds.samples[lg], len(res.steps),
                              F.run_tokens(res.steps, B, rows, res.expand_at),
                              F.run_flops(cfg, res.steps, B, rows, res.expand_at), rounds.memory.get(lg)))
        r = pair_ratios(rounds.samples)
        if r is not None:
            ratios.append(Ratio(sched, r))
        results.clear()

    tracker.finish()
    return BenchResult(env, settings, cfg.to_dict(), B, T, options, cells, ratios, micro, peak,
                       meter.kind if settings.memory else "not measured", calls,
                       time.perf_counter() - wall_start)


class _Sampler:
    """A sampled decode's calls: filled caches kept per logic, and the peak memory of the call that
    filled each (a cache of the full length, a prefill and the steps: what a decode holds)."""

    def __init__(self, model, tokens, timer: Timer, meter: Optional[MemoryMeter], sample_decode: Callable):
        self.model, self.tokens, self.timer, self.meter, self.fn = model, tokens, timer, meter, sample_decode
        self.caches: dict = {}
        self.memory: dict = {}

    def __call__(self, logic: str, sample: DecodeSample) -> float:
        out = []

        def go():
            out.append(self.fn(self.model, self.tokens, logic, sample, self.timer.measure, self.caches))
        if self.meter is not None and logic not in self.memory:
            self.memory[logic] = self.meter.measure(go)
        else:
            go()
        return out[0]


def _decode_sample(tokens, logics, settings: BenchSettings, share_s: float, sampler: _Sampler) -> Optional[DecodeSample]:
    """The decode steps to time per run, or None to time whole decodes: as set, or, with
    repeats=None, a sample when a probe says the rounds of whole decodes would overrun the share."""
    T = tokens.size(1)
    if settings.decode_sample is not None:
        return sample_window(T, settings.decode_sample) if settings.decode_sample else None
    if settings.repeats is not None or T <= 2 * MIN_SAMPLE:
        return None
    probe = sample_window(T, 2 * MIN_SAMPLE)
    per_step = sum(sampler(lg, probe) for lg in logics) / probe.steps
    rounds = settings.warmup + settings.min_repeats + (1 if settings.memory else 0)
    if per_step * T * rounds <= share_s:
        return None
    want = settings.warmup + max(settings.min_repeats, IQR_MIN_PAIRS)
    return sample_window(T, steps_that_fit(per_step, share_s, want, T), probe.start)


IQR_MIN_PAIRS = 5  # fewer timed pairs and the report leaves the IQR out


def _sampled_cells(tokens, logics, settings, timer, sample: DecodeSample, sampler: _Sampler, calls,
                   tracker, t_start, left):
    """The decode cells from `sample.steps` timed steps per run, scaled to the whole decode."""
    B, T = tokens.shape
    fns = {lg: (lambda lg=lg: sampler(lg, sample)) for lg in logics}

    def choose(round_s):
        return settings.choose_repeats(round_s, settings.budget_s - (timer.clock() - t_start), left)

    rounds = alternate(fns, settings.warmup, settings.repeats or choose, lambda fn: fn(), log=calls,
                       what=f"decode (sampled {sample.steps} of {T})", tracker=tracker)
    cfg, steps = sampler.model.config, [1] * T
    cells = [Cell("decode", lg, [t * sample.scale for t in rounds.samples[lg]], T, F.run_tokens(steps, B, B),
                  F.run_flops(cfg, steps, B, B), sampler.memory.get(lg), sample) for lg in logics]
    r = pair_ratios({c.logic: c.samples for c in cells})
    return cells, None if r is None else Ratio("decode", r)
