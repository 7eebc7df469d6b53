"""The runs a `compare` makes, and how they are made: `plan` lists them (the reference, each
(schedule, runner), decode shared by runners whose one-token step is the same computation),
`run_planned` makes them, one after another or with the decode on a second thread beside the
others (`overlap`).

Pure planning and threading: torch is not imported here.
"""

from __future__ import annotations

import dataclasses
import threading
from dataclasses import dataclass
from typing import Callable, Optional, Sequence

from ..util.defaults import REFERENCE
from .runner import Runner

SHARED_SCHEDULE = "decode"  # run once for runners that share a one-token step (and the side run)


@dataclass(frozen=True)
class PlannedRun:
    """One forward run `compare` makes: `runner` on `schedule`, or a copy of an earlier run of
    `same_as` (a runner whose one-token step is the same computation)."""
    schedule: str
    runner: Runner
    label: str  # what the progress bar shows
    same_as: Optional[Runner] = None
    measured: bool = True  # False: the reference (the yardstick, not a schedule under test)


def plan(runners: Sequence[Runner], schedules: Sequence[str], reference: Optional[Runner] = None) -> list[PlannedRun]:
    """Every run `compare` makes, in order: the reference, then each (schedule, runner) (decode
    once per group of runners sharing a one-token step). No run is made for the noise floor: it
    comes from the reference in float64 (`smearcli.judging.evidence.floor`), never from a schedule under
    test. The CLI's progress totals come from here."""
    ref = reference or runners[0]
    several = len(runners) > 1
    out = [PlannedRun(REFERENCE, ref, "full (reference)", measured=False)]
    decoded: dict = {}
    for sched in schedules:
        for r in runners:
            label = f"{sched} / {r.label}" if several else sched
            if sched == SHARED_SCHEDULE and r.one_token_step is not None and r.one_token_step in decoded:
                out.append(PlannedRun(sched, r, label, same_as=decoded[r.one_token_step]))
                continue
            out.append(PlannedRun(sched, r, label))
            if sched == SHARED_SCHEDULE and r.one_token_step is not None:
                decoded[r.one_token_step] = r
    return out


def forward_runs(planned: Sequence[PlannedRun]) -> int:
    """How many of the planned runs call the model (the rest copy a shared decode)."""
    return sum(p.same_as is None for p in planned)


def side_run(planned: Sequence[PlannedRun]) -> Optional[int]:
    """The planned run `overlap` starts on a second thread: the first decode run that calls the
    model, on a CPU runner that allows it (`Runner.thread_safe`); None when there is none.

    Decode is the longest run, one chain of one-token steps whose small ops keep about one core
    busy however many threads torch has, so on two cores the other runs fit beside it (a d12
    compare of 256 tokens took 19-22 s so, against 27-29 s one run after another)."""
    for i, p in enumerate(planned):
        if p.schedule == SHARED_SCHEDULE and p.same_as is None:
            ok = p.runner.thread_safe and str(p.runner.device).startswith("cpu")
            return i if ok else None
    return None


class Cancelled(Exception):
    """The side run stops at its next step: the runs beside it failed or were interrupted."""


def run_planned(planned: Sequence[PlannedRun], run: Callable, overlap: bool = False) -> list:
    """`run(i, p, stop)` for each planned run that calls the model, in plan order; the results in
    plan order (None for copies). With `overlap`, the `side_run` goes on a second thread while
    the others run here. Each run computes exactly what it computes alone (its own cache, the
    same kernels and thread count), so the results are bit for bit those of running one after
    another. Each run calls `stop()` at every step: it raises `Cancelled` once a run here has
    failed, which stops the side run."""
    results: list = [None] * len(planned)
    side = side_run(planned) if overlap else None
    cancel = threading.Event()

    def stop() -> None:
        if cancel.is_set():
            raise Cancelled()

    worker, failed = None, []
    if side is not None:
        def work() -> None:
            try:
                results[side] = run(side, planned[side], stop)
            except BaseException as e:  # handed to the caller's thread at the join
                failed.append(e)
        worker = threading.Thread(target=work, name="smearcli-decode", daemon=True)
        worker.start()
    try:
        for i, p in enumerate(planned):
            if p.same_as is None and i != side:
                results[i] = run(i, p, stop)
    except BaseException:
        cancel.set()  # the side run stops at its next step; its result is not wanted
        raise
    finally:
        if worker is not None:
            try:
                worker.join()
            except BaseException:  # interrupted while waiting: stop the side run, then go on
                cancel.set()
                worker.join()
                raise
    if failed:  # (a Cancelled side run only follows a failure here, already raised)
        raise failed[0]
    return results


def run_all(planned, tokens, options, step, tokens_progress, overlap: bool, run_schedule=None) -> list:
    """Every planned run, its progress reported (`run_planned` may put decode on a second thread)."""
    if run_schedule is None:
        from .schedules import run_schedule  # torch: only once there is something to run
    total = forward_runs(planned) * tokens.size(1)
    fed = [0] * len(planned)  # positions fed so far by each planned run
    lock = threading.Lock()  # the side run reports progress from its own thread

    def run(i: int, p: PlannedRun, stop: Callable[[], None]):
        def on_step(n, _T):
            stop()
            with lock:
                fed[i] = n
                if tokens_progress is not None:
                    tokens_progress(sum(fed), total)
        step(p.label)
        r = run_schedule(p.runner, tokens, p.schedule, opts=options, progress=on_step)
        fed[i] = tokens.size(1)
        return r

    return run_planned(planned, run, overlap)


def collect(planned, results) -> tuple:
    """(the reference, the measured runs): a decode shared by several runners stands for each."""
    ref, runs, by_runner = None, [], {}
    for p, r in zip(planned, results):
        if p.same_as is not None:
            r = dataclasses.replace(by_runner[(id(p.same_as), p.schedule)], logic=p.runner.label)
        by_runner[(id(p.runner), p.schedule)] = r
        if p.schedule == REFERENCE:
            ref = r
        elif p.measured:
            runs.append(r)
    return ref, runs


def common_layers(ref, runs: list, layers: list[str]):
    """The capture points every run has: all of them, or the logits alone when one has none. Each
    run's logits must have the reference's vocabulary, each capture point its channels
    (`owned.BadOutput` otherwise: within one run, `owned` checked that as each call returned)."""
    from .owned import BadOutput

    for r in [ref] + runs:
        got = len(r.hiddens or []) + 1
        if got != len(layers) and r.hiddens is not None:
            raise ValueError(f"{r.logic} returned {got} capture points on {r.schedule}; its runner "
                             f"declares {len(layers)} ({', '.join(layers)})")
    for r in runs:
        pairs = [("logits", ref.logits, r.logits)] + list(zip(layers, ref.hiddens or [], r.hiddens or []))
        for name, a, b in pairs:
            if a.shape[2:] != b.shape[2:]:
                raise BadOutput(f"{r.logic}: its {r.schedule} run returned {name} of shape {tuple(b.shape)}; "
                                f"expected {tuple(b.shape[:2]) + tuple(a.shape[2:])}, the width of the "
                                f"reference's ({ref.logic}, {ref.schedule}) {tuple(a.shape)}")
    if ref.hiddens is None or any(r.hiddens is None for r in runs):
        return (dataclasses.replace(ref, hiddens=None), [dataclasses.replace(r, hiddens=None) for r in runs],
                ["logits"])
    return ref, runs, layers
