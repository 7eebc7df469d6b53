"""`bench` as a library call: what the fixed smear costs, and what each schedule costs.

    from smearcli import bench, models
    from smearcli.compare import random_tokens
    lm = models.random_model()
    result = bench.bench(lm.model, random_tokens(lm.model.config, 256), ["prefill", "chunked"])
    print(result.ratio("chunked").summary.median)  # fixed/old time of a chunked prefill

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
- FLOPs come from the configuration (`smearcli.flops`); achieved FLOP/s is FLOPs over the median
  time, and, with `peak=True`, a fraction of the best FLOP/s of a square matmul measured on the
  same device, in the same dtype, in the same run.

`to_json` gives schema `smearcli.bench/1`: environment, settings, model config, the raw samples
of every cell and every pair's ratio, and their summaries.
"""

from __future__ import annotations

import ctypes
import os
import platform
import sys
import time
from dataclasses import dataclass, field
from typing import Callable, Optional, Sequence, Union

import torch
from torch import Tensor

from . import flops as F
from .model import GPT, rms_norm
from .names import LOGIC_NAMES
from .schedules import ScheduleOptions, chunk_plan, run_schedule
from .smear import LOGICS

SCHEMA = "smearcli.bench/1"

Progress = Optional[Callable[[str, int, int], None]]


# -- statistics -----------------------------------------------------------------------------------
def quantile(xs: Sequence[float], q: float) -> float:
    """The q-quantile of xs with linear interpolation between order statistics (numpy's default)."""
    if not xs:
        raise ValueError("quantile of no samples")
    if not 0.0 <= q <= 1.0:
        raise ValueError(f"q must be in [0, 1], got {q}")
    s = sorted(xs)
    h = (len(s) - 1) * q
    lo = int(h)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (h - lo) * (s[hi] - s[lo])


@dataclass(frozen=True)
class Summary:
    n: int
    median: float
    q1: float
    q3: float
    min: float
    max: float

    @property
    def iqr(self) -> float:
        return self.q3 - self.q1

    @classmethod
    def of(cls, xs: Sequence[float]) -> "Summary":
        return cls(len(xs), quantile(xs, 0.5), quantile(xs, 0.25), quantile(xs, 0.75), min(xs), max(xs))

    def to_json(self) -> dict:
        return {"n": self.n, "median": self.median, "q1": self.q1, "q3": self.q3, "iqr": self.iqr,
                "min": self.min, "max": self.max}


# -- timing and memory ----------------------------------------------------------------------------
CLOCKS = {
    # wall time: what a user waits for
    "wall": time.perf_counter,
    # CPU time of the whole process (all threads): on a shared CPU it leaves out the time other
    # processes hold the cores, so with one thread it measures the work, not the queue
    "cpu": time.process_time,
}


class Timer:
    """Times a callable: synchronise the device, read the clock, run, synchronise, read again.

    `clock` is a name from CLOCKS or a callable returning seconds (tests pass a fake one)."""

    def __init__(self, device: torch.device | str = "cpu", clock: Union[str, Callable[[], float]] = "wall"):
        self.device = torch.device(device)
        if isinstance(clock, str):
            if clock not in CLOCKS:
                raise ValueError(f"unknown clock {clock!r}; choose from {', '.join(CLOCKS)}")
            if clock == "cpu" and self.device.type != "cpu":
                raise ValueError(f"the cpu clock cannot time work on {self.device.type}: use the wall clock")
            self.name, self.clock = clock, CLOCKS[clock]
        else:
            self.name, self.clock = getattr(clock, "__name__", "custom"), clock

    def sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        elif self.device.type == "mps":
            torch.mps.synchronize()

    def measure(self, fn: Callable[[], object]) -> float:
        self.sync()
        t0 = self.clock()
        fn()
        self.sync()
        return self.clock() - t0


def _libc():
    try:
        return ctypes.CDLL("libc.so.6")
    except OSError:
        return None


def _proc_status_kb(key: str) -> Optional[int]:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(key + ":"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


def _reset_hwm() -> bool:
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # resets the peak resident set (VmHWM) to the current one
        return True
    except OSError:
        return False


def _maxrss_bytes() -> Optional[int]:
    try:
        import resource  # POSIX only
    except ImportError:
        return None
    r = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return r if sys.platform == "darwin" else r * 1024  # bytes on macOS, KiB on Linux


class MemoryMeter:
    """Peak memory a callable adds: `meter.measure(fn)` -> bytes, or None where unknown.

    CUDA: the allocator's peak (torch.cuda.max_memory_allocated) above what was allocated before.
    CPU on Linux: VmHWM after the run minus VmRSS before it, with VmHWM reset first and freed heap
    returned to the OS (malloc_trim) so the run's allocations show up as growth. Elsewhere on CPU:
    the growth of ru_maxrss, which never resets (a lower bound after the first big run)."""

    def __init__(self, device: torch.device | str = "cpu"):
        self.device = torch.device(device)
        if self.device.type == "cuda":
            self.kind = "cuda allocator peak"
        elif self.device.type == "cpu":
            self.kind = "peak RSS growth" if _proc_status_kb("VmHWM") is not None and _reset_hwm() \
                else "ru_maxrss growth"
        else:
            self.kind = "unavailable"
        self._libc = _libc() if self.device.type == "cpu" else None

    def measure(self, fn: Callable[[], object]) -> Optional[int]:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
            base = torch.cuda.memory_allocated(self.device)
            fn()
            torch.cuda.synchronize(self.device)
            return max(0, torch.cuda.max_memory_allocated(self.device) - base)
        if self.device.type != "cpu":
            fn()
            return None
        if self.kind == "peak RSS growth":
            trim = getattr(self._libc, "malloc_trim", None)  # glibc only
            if trim is not None:
                trim(0)
            _reset_hwm()
            base = _proc_status_kb("VmRSS")
            fn()
            peak = _proc_status_kb("VmHWM")
            return None if base is None or peak is None else max(0, (peak - base) * 1024)
        base = _maxrss_bytes()
        fn()
        after = _maxrss_bytes()
        return None if base is None or after is None else max(0, after - base)


# -- environment ----------------------------------------------------------------------------------
def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def environment(device: torch.device, dtype: torch.dtype) -> dict:
    """What the numbers were measured on: device, its name, threads, torch, dtype, load."""
    env = {
        "torch": torch.__version__,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "device": str(device),
        "dtype": str(dtype).removeprefix("torch."),
        "cpu": _cpu_name(),
        "cpu_count": os.cpu_count(),
        "threads": torch.get_num_threads(),
    }
    if device.type == "cuda":
        env["device_name"] = torch.cuda.get_device_name(device)
        env["cuda"] = torch.version.cuda
    else:
        env["device_name"] = env["cpu"] if device.type == "cpu" else device.type
    if hasattr(os, "getloadavg"):
        env["loadavg"] = [round(x, 2) for x in os.getloadavg()]
    return env


# -- results --------------------------------------------------------------------------------------
@dataclass(frozen=True)
class BenchSettings:
    warmup: int = 1  # untimed rounds per schedule (each runs every logic once)
    repeats: Optional[int] = None  # timed rounds per schedule; None: as many as `budget_s` allows
    budget_s: float = 20.0  # with repeats=None: the whole bench's target time
    min_repeats: int = 3  # with repeats=None: never fewer timed rounds per schedule
    max_repeats: int = 20  # with repeats=None: never more
    micro: bool = True  # time the smear functions on their own
    micro_repeats: int = 300  # timed rounds of the micro-benchmark
    micro_inner: Optional[int] = None  # smear calls per micro sample (None: 1 on CPU, 20 on GPUs)
    peak: bool = True  # measure a matmul peak and report achieved FLOP/s against it
    peak_size: Optional[int] = None  # square matmul size (default: 2048 on CPU, 8192 on GPUs)
    memory: bool = True  # peak memory of each cell, on one extra untimed run after the timed ones

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
class Peak:
    size: int
    dtype: str
    samples: list[float]  # seconds per matmul

    @property
    def flops(self) -> int:
        return F.matmul_flops(self.size, self.size, self.size)

    @property
    def flops_per_s(self) -> float:
        """The best observed rate: a peak is what the hardware can do, not what it usually does."""
        return self.flops / min(self.samples)


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
class Tracker:
    """Counts runs for a progress callback `progress(description, done, total)`; the total grows
    when the number of timed rounds is chosen."""

    def __init__(self, progress: Progress = None):
        self.progress, self.done, self.total = progress, 0, 0

    def add(self, n: int) -> None:
        self.total += n

    def tick(self, desc: str) -> None:
        if self.progress:
            self.progress(desc, self.done, max(self.total, self.done + 1))
        self.done += 1

    def finish(self) -> None:
        if self.progress:
            self.progress("done", self.done, self.done)


@dataclass
class Rounds:
    """What `alternate` measured: timed samples per name, in round order, and the peak memory of
    each name's extra run after them (when a memory meter was given)."""
    samples: dict[str, list[float]]
    memory: dict[str, Optional[int]] = field(default_factory=dict)


def alternate(fns: dict[str, Callable[[], object]], warmup: int, repeats: Union[int, Callable[[float], int]],
              measure: Callable[[Callable[[], object]], float], log: Optional[list] = None,
              what: str = "", tracker: Optional[Tracker] = None,
              memory: Optional[Callable[[Callable[[], object]], Optional[int]]] = None) -> Rounds:
    """Run every fn once per round, in dict order (A B A B ...): `warmup` rounds whose times are
    discarded, then the timed rounds.

    `repeats` is the number of timed rounds, or a function of one round's duration (the last
    warm-up round, or the first timed round without warm-up) that returns it. With `memory`, each
    fn runs once more after the timed rounds, untimed, through it: a steady-state run (a first run
    pays one-off allocations), and no memory bookkeeping inside a timed run. Every call is appended to `log` as
    (phase, what, name, round)."""
    samples: dict[str, list[float]] = {name: [] for name in fns}
    mem: dict[str, Optional[int]] = {}
    tracker = tracker or Tracker()
    n_timed = repeats if isinstance(repeats, int) else None
    guess = n_timed if n_timed is not None else 1
    extra = 1 if memory is not None else 0
    tracker.add(len(fns) * (warmup + guess + extra))
    r = 0
    while n_timed is None or r < warmup + n_timed:
        phase = "warmup" if r < warmup else "timed"
        round_s = 0.0
        for name, fn in fns.items():
            tracker.tick(f"{what} {name} ({phase} round {r + 1 if r < warmup else r - warmup + 1})")
            if log is not None:
                log.append((phase, what, name, r))
            t = measure(fn)
            round_s += t
            if phase == "timed":
                samples[name].append(t)
        r += 1
        if n_timed is None and r == max(warmup, 1):
            n_timed = max(1, int(repeats(round_s)))
            tracker.add(len(fns) * (n_timed - guess))
    if extra:
        for name, fn in fns.items():
            tracker.tick(f"{what} {name} (memory)")
            if log is not None:
                log.append(("memory", what, name, r))
            mem[name] = memory(fn)
    return Rounds(samples, mem)


def pair_ratios(samples: dict[str, list[float]], num: str = "fixed", den: str = "old") -> Optional[list[float]]:
    """num/den per round, or None when either logic did not run."""
    if num not in samples or den not in samples:
        return None
    return [a / b for a, b in zip(samples[num], samples[den])]


def measure_peak(device: torch.device, dtype: torch.dtype, timer: Timer, size: Optional[int] = None,
                 warmup: int = 2, repeats: int = 5, tracker: Optional[Tracker] = None) -> Peak:
    """Time a square matmul in `dtype` on `device` and keep every sample."""
    n = size or (2048 if device.type == "cpu" else 8192)
    g = torch.Generator().manual_seed(0)
    a = torch.randn(n, n, generator=g).to(device=device, dtype=dtype)
    b = torch.randn(n, n, generator=g).to(device=device, dtype=dtype)
    with torch.inference_mode():
        samples = alternate({"matmul": lambda: torch.mm(a, b)}, warmup, repeats, timer.measure,
                            what="peak", tracker=tracker).samples["matmul"]
    return Peak(n, str(dtype).removeprefix("torch."), samples)


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
          timer: Optional[Timer] = None, run: Callable = run_schedule, progress: Progress = None) -> BenchResult:
    """Time every schedule under every logic (alternating), the smear alone, and a matmul peak.

    Order: matmul peak, smear micro-benchmark, then the schedules, so that with `repeats=None`
    each schedule gets its share of what is left of `budget_s`. `timer` and `run` are injectable:
    tests pass a fake clock and a recording runner. `progress(description, done, total)` is
    called before every run."""
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
        peak = measure_peak(device, model.dtype, timer, settings.peak_size, tracker=tracker)
    micro = []
    if settings.micro:
        micro = micro_bench(model, B, micro_chunk_len(T, options), logics, settings, timer,
                            log=calls, tracker=tracker)

    cells, ratios = [], []
    for i, sched in enumerate(schedules):
        results = {}

        def make(lg, sched=sched):
            def go():
                results[lg] = run(model, tokens, sched, lg, options, capture=False)
            return go

        def choose(round_s, left=len(schedules) - i):
            return settings.choose_repeats(round_s, settings.budget_s - (timer.clock() - t_start), left)

        rounds = alternate({lg: make(lg) for lg in logics}, settings.warmup, settings.repeats or choose,
                           timer.measure, log=calls, what=sched, tracker=tracker,
                           memory=meter.measure if settings.memory else None)
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


# -- output ---------------------------------------------------------------------------------------
def to_json(result: BenchResult, model_info: Optional[dict] = None) -> dict:
    """Everything, raw samples included (schema smearcli.bench/1). Times are in seconds."""
    s = result.settings
    out = {
        "schema": SCHEMA,
        "model": {**(model_info or {}), "config": result.config},
        "input": {"batch": result.batch, "seq_len": result.seq_len},
        "environment": result.env,
        "settings": {"warmup": s.warmup, "repeats": s.repeats, "budget_s": s.budget_s,
                     "min_repeats": s.min_repeats, "max_repeats": s.max_repeats,
                     "micro_repeats": s.micro_repeats, "micro_inner": s.micro_inner,
                     "order": "alternating, logics in this order every round",
                     "logics": list(dict.fromkeys(c.logic for c in result.cells)),
                     "schedule_options": {"chunks": result.options.chunks,
                                          "chunk_sizes": list(result.options.chunk_sizes) if result.options.chunk_sizes else None,
                                          "samples": result.options.samples, "gen_len": result.options.gen_len,
                                          "draft": result.options.draft}},
        "peak": None if result.peak is None else {
            "size": result.peak.size, "dtype": result.peak.dtype, "flops": result.peak.flops,
            "samples_s": result.peak.samples, "flops_per_s": result.peak.flops_per_s},
        "memory_kind": result.memory_kind,
        "cells": [{
            "schedule": c.schedule, "logic": c.logic, "steps": c.steps, "tokens": c.tokens,
            "flops": c.flops, "samples_s": c.samples, "summary_s": c.summary.to_json(),
            "tokens_per_s": c.tokens_per_s, "flops_per_s": c.flops_per_s,
            "peak_fraction": result.peak_fraction(c), "peak_mem_bytes": c.peak_mem,
        } for c in result.cells],
        "ratios": [{"schedule": r.name, "of": "fixed/old", "pairs": r.ratios, "summary": r.summary.to_json()}
                   for r in result.ratios],
        "smear_micro": [{
            "case": m.name, "shape": list(m.shape), "cached": m.cached, "with_prev": m.with_prev,
            "calls_per_sample": m.inner,
            "samples_s": m.samples, "summary_s": {lg: Summary.of(v).to_json() for lg, v in m.samples.items()},
            "ratio": None if m.ratio is None else {"of": "fixed/old", "pairs": m.ratio.ratios,
                                                   "summary": m.ratio.summary.to_json()},
        } for m in result.micro],
        "wall_s": result.wall_s,
    }
    return out


def _t(s: float) -> str:
    """A duration with a unit that keeps three significant digits."""
    for unit, scale in (("s", 1.0), ("ms", 1e-3), ("µs", 1e-6)):
        if s >= scale:
            return f"{s / scale:.3g} {unit}"
    return f"{s / 1e-9:.3g} ns"


def _bytes(n: Optional[int]) -> str:
    if n is None:
        return "-"
    for unit, scale in (("GiB", 2 ** 30), ("MiB", 2 ** 20), ("KiB", 2 ** 10)):
        if n >= scale:
            return f"{n / scale:.3g} {unit}"
    return f"{n} B"


def _ratio(r: Ratio) -> tuple[str, str]:
    s = r.summary
    return f"{s.median:.3f}", f"{s.q1:.3f}-{s.q3:.3f}"


def render(result: BenchResult, console, title: str = "") -> None:
    """Print the tables: per cell, per fixed/old pair, the smear micro-benchmark, the environment."""
    from rich import box
    from rich.table import Table

    env = result.env
    t = Table(title=title or None, title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False)
    cols = [("schedule", "left"), ("logic", "left"), ("steps", "right"), ("median", "right"),
            ("IQR", "right"), ("tok/s", "right"), ("GFLOP", "right"), ("GFLOP/s", "right")]
    if result.peak is not None:
        cols.append(("% peak", "right"))
    cols.append(("peak mem", "right"))
    for name, justify in cols:
        t.add_column(name, justify=justify, no_wrap=True)
    for c in result.cells:
        s = c.summary
        row = [c.schedule, c.logic, str(c.steps), _t(s.median), _t(s.iqr), f"{c.tokens_per_s:,.0f}",
               f"{c.flops / 1e9:.3g}", f"{c.flops_per_s / 1e9:.3g}"]
        if result.peak is not None:
            row.append(f"{100 * result.peak_fraction(c):.1f}%")
        row.append(_bytes(c.peak_mem))
        t.add_row(*row)
    console.print(t)

    if result.ratios or any(m.ratio for m in result.micro):
        rt = Table(title="fixed / old time, per alternated pair", title_justify="left",
                   box=box.SIMPLE_HEAD, pad_edge=False)
        for name, justify in [("what", "left"), ("median", "right"), ("IQR (q1-q3)", "right"),
                              ("min-max", "right"), ("pairs", "right"), ("old median", "right"),
                              ("fixed median", "right")]:
            rt.add_column(name, justify=justify, no_wrap=True)
        for r in result.ratios:
            s = r.summary
            rt.add_row(r.name, *_ratio(r), f"{s.min:.3f}-{s.max:.3f}", str(s.n),
                       _t(result.cell(r.name, "old").summary.median),
                       _t(result.cell(r.name, "fixed").summary.median))
        for m in result.micro:
            if m.ratio is None:
                continue
            s = m.ratio.summary
            B, T, C = m.shape
            rt.add_row(f"smear alone, {m.name} ({B}x{T}x{C})", *_ratio(m.ratio), f"{s.min:.3f}-{s.max:.3f}",
                       str(s.n), _t(Summary.of(m.samples["old"]).median), _t(Summary.of(m.samples["fixed"]).median))
        console.print(rt)
    elif result.micro:
        for m in result.micro:
            for lg, v in m.samples.items():
                console.print(f"smear alone, {m.name} {m.shape}, {lg}: {_t(Summary.of(v).median)} per call")

    where = env.get("device_name", env["device"])
    rounds = ", ".join(f"{r.name} {len(r.ratios)}" for r in result.ratios) or ", ".join(
        f"{c.schedule} {len(c.samples)}" for c in result.cells)
    line = (f"{env['device']} ({where}), {env['threads']} threads, torch {env['torch']}, {env['dtype']}, "
            f"{env.get('clock', 'wall')} clock; "
            f"{result.settings.warmup} warm-up round(s), then timed rounds ({rounds})"
            + (", logics alternating" if len({c.logic for c in result.cells}) > 1 else ""))
    if "loadavg" in env:
        line += f"; load average {env['loadavg'][0]:g} at the start"
    console.print(line)
    if result.peak is not None:
        p = result.peak
        console.print(f"matmul peak: {p.flops_per_s / 1e9:.4g} GFLOP/s ({p.size}x{p.size} {p.dtype}, best of "
                      f"{len(p.samples)}); % peak = achieved FLOP/s of the median run / that peak")
    console.print(f"peak mem: {result.memory_kind}, on one extra untimed run per cell. "
                  f"Total {result.wall_s:.1f} s.")
