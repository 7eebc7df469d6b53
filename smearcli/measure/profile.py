"""Where a run's wall time goes: model building, the model's forwards, metrics and the rest.

A `session` accumulates wall time per named section while it is active; outside one, `section`
and the forward hooks cost one attribute check. Sections nest and each second is counted once,
in the innermost section open at that moment (a forward run inside the metrics is a forward).
The rest is the session's wall time outside every section: imports, input, cache copies,
captures' stitching, rendering. Forwards are timed by forward pre/post hooks on the model
(`watch_forwards`), so a model's own code is timed from its first line to its last.

    with profile.session(True):   # or SMEARCLI_PROFILE=1 in the environment
        with profile.section("build"):
            model = ...
        profile.watch_forwards(model)
        ...                         # the table goes to stderr when the session ends

Pure Python: torch is never imported here.
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
from dataclasses import dataclass, field
from typing import Optional

ENV = "SMEARCLI_PROFILE"  # "1" (anything but "" and "0") profiles every compare
FORWARDS = "forwards"
# The table's rows in the order a compare meets them, then any other section, then the rest. The
# sections outside the forwards (each forward inside one is counted as a forward, not as it):
#   imports        torch and the library, imported once by the command
#   build          the model (random weights, a checkpoint, their code)
#   runs           the schedules' steps around their forwards: caches, captures, stitching
#   float64 floor  the float64 copy of the model and the floor computed from its full pass
#   metrics        every run measured against the reference
#   analytic       the smear terms checked where a run departs
#   confirmation   a departing run's float64 rerun, lifted
#   power          the cache's state zeroed, to show the check could see it
#   table / json / save   what the command prints or writes
ORDER = ("imports", "build", "runs", FORWARDS, "float64 floor", "metrics", "analytic", "confirmation", "power",
         "table", "json", "save")


def env_enabled() -> bool:
    return os.environ.get(ENV, "") not in ("", "0")


@dataclass
class Profile:
    """Exclusive wall seconds and entries per section since `started`."""
    started: float = field(default_factory=lambda: time.perf_counter())
    seconds: dict = field(default_factory=dict)
    calls: dict = field(default_factory=dict)
    stack: list = field(default_factory=list)  # open sections: [name, entered at, seconds of children]
    ended: Optional[float] = None

    def enter(self, name: str) -> None:
        self.stack.append([name, time.perf_counter(), 0.0])

    def exit(self, name: str) -> None:
        if not self.stack or self.stack[-1][0] != name:
            return  # a hook whose pre-hook ran before the session began: nothing to close
        _, t0, children = self.stack.pop()
        spent = time.perf_counter() - t0
        self.seconds[name] = self.seconds.get(name, 0.0) + spent - children
        self.calls[name] = self.calls.get(name, 0) + 1
        if self.stack:
            self.stack[-1][2] += spent

    @property
    def total(self) -> float:
        return (self.ended if self.ended is not None else time.perf_counter()) - self.started

    def rows(self) -> list[tuple[str, float, int]]:
        """(section, seconds, entries) in table order, the rest last (entries 0)."""
        names = [n for n in ORDER if n in self.seconds] + sorted(set(self.seconds) - set(ORDER))
        out = [(n, self.seconds[n], self.calls[n]) for n in names]
        return out + [("rest", self.total - sum(self.seconds.values()), 0)]

    def table(self) -> str:
        total = self.total
        rows = self.rows()
        w = max(10, *(len(name) for name, _, _ in rows))
        lines = [f"profile: {total:.2f} s wall", f"  {'section':<{w}} {'seconds':>9} {'share':>7} {'calls':>7}"]
        for name, s, n in rows:
            share = s / total if total > 0 else 0.0
            lines.append(f"  {name:<{w}} {s:>9.2f} {share:>7.1%} {n if n else '':>7}")
        outside = 1 - self.seconds.get(FORWARDS, 0.0) / total if total > 0 else 0.0
        lines.append(f"  outside forwards: {outside:.1%}")
        return "\n".join(lines) + "\n"


_active: list = []  # the open session's Profile (at most one)


def active() -> Optional[Profile]:
    return _active[-1] if _active else None


@contextlib.contextmanager
def section(name: str):
    """Count the time inside as `name`'s (nothing happens without an active session)."""
    prof = active()
    if prof is None:
        yield
        return
    prof.enter(name)
    try:
        yield
    finally:
        prof.exit(name)


@contextlib.contextmanager
def session(enabled: bool = False, out=None):
    """Profile the block when `enabled` or SMEARCLI_PROFILE is set; the table goes to `out`
    (default stderr) when the block ends, also when it raises. Yields the Profile, or None."""
    if not (enabled or env_enabled()) or _active:
        yield None
        return
    prof = Profile()
    _active.append(prof)
    try:
        yield prof
    finally:
        _active.remove(prof)
        while prof.stack:  # a section left open by an exception: close it where it stands
            prof.exit(prof.stack[-1][0])
        prof.ended = time.perf_counter()
        (out or sys.stderr).write(prof.table())


def _pre(module, args) -> None:
    prof = active()
    if prof is not None:
        prof.enter(FORWARDS)


def _post(module, args, output) -> None:
    prof = active()
    if prof is not None:
        prof.exit(FORWARDS)


def watch_forwards(model) -> list:
    """Time every forward of `model` (a torch module, or an object that runs one as `.net`) as
    the forwards section, whenever a session is active. Returns the hook handles (empty if there
    is no module to hook, or when no session is active: hooks are only added for a session)."""
    if active() is None:
        return []
    module = model if hasattr(model, "register_forward_pre_hook") else getattr(model, "net", None)
    if not hasattr(module, "register_forward_pre_hook") or getattr(module, "_smearcli_profiled", False):
        return []
    module._smearcli_profiled = True
    return [module.register_forward_pre_hook(_pre), module.register_forward_hook(_post, always_call=True)]
