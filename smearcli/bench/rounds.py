"""The A B A B rounds every bench measurement runs in: warm-up rounds, timed rounds whose count
may follow from the first round's time, an optional untimed memory run, and a progress tracker.
Used by `bench.harness` for schedules, the smear micro-benchmark and sampled decodes."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Optional, Union

Progress = Optional[Callable[[str, int, int], None]]


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
              memory: Optional[Callable[[Callable[[], object]], Optional[int]]] = None,
              memory_extra: Optional[Callable[[float], bool]] = None) -> Rounds:
    """Run every fn once per round, in dict order (A B A B ...): `warmup` rounds whose times are
    discarded, then the timed rounds.

    `repeats` is the number of timed rounds, or a function of one round's duration (the last
    warm-up round, or the first timed round without warm-up) that returns it. With `memory`, each
    fn runs once more after the timed rounds, untimed, through it: a steady-state run (a first run
    pays one-off allocations), and no memory bookkeeping inside a timed run. With `memory_extra`
    as well, memory is first taken on the last warm-up round (its times are discarded anyway),
    and the extra run is made only when `memory_extra(round seconds)` says it fits the budget. Every call is appended to `log` as
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
            if memory is not None and memory_extra is not None and r == warmup - 1:
                t = measure(lambda fn=fn, name=name: mem.__setitem__(name, memory(fn)))
            else:
                t = measure(fn)
            round_s += t
            if phase == "timed":
                samples[name].append(t)
        last_round = round_s
        r += 1
        if n_timed is None and r == max(warmup, 1):
            n_timed = max(1, int(repeats(round_s)))
            tracker.add(len(fns) * (n_timed - guess))
    if extra and memory_extra is not None and mem and not memory_extra(last_round):  # taken in warm-up
        extra = 0
        tracker.add(-len(fns))
    if extra:
        for name, fn in fns.items():
            tracker.tick(f"{what} {name} (memory)")
            if log is not None:
                log.append(("memory", what, name, r))
            mem[name] = memory(fn)
    return Rounds(samples, mem)
