"""The standard of evidence behind every verdict: the floor, power and confirmation.

Every surface (compare for every `--impl`, the boundaries, `smearcli scan`, `smearcli.testing`)
reaches its verdict through this module, by three rules:

1. **The floor** never comes from a schedule under test. `floor(runner, ref, tokens)` runs the
   reference again in float64 (`Runner.float64()`, a twin of the same weights) and takes the
   distance of the reference in its own precision from it, per layer, at least one ulp of each
   layer's scale. A runner with no float64 twin gets the ulp minimum alone, and the floor's
   `source` says which. Token-by-token decode is a schedule like any other.
2. **Power.** `power(runner, tokens, threshold)` zeroes each kind of state the cache carries
   (`state.cache_tensors`: attention keys and values, conv taps, every other recurrent state) after a
   prefill and measures how far the later logits move. An error in that state is flagged when it
   moves a logit past `threshold` (tolerance x floor), so the smallest error the check could have
   seen is `threshold / effect` of the state's whole effect: `Power.fraction(kind)`. OK needs
   every kind at `MIN_POWER` (1%) or better.
3. **Confirmation.** A run that departs in its own precision is a candidate, not a bug.
   `Confirmer` reruns it and the full pass with the model in float64 under `lifted()`, where
   every float32 request inside the model's code (a router, rotary, a softmax upcast) becomes
   float64 too. A logic error keeps its size when precision rises; rounding falls by the ratio of
   the two units (2^-29 from float32). So: `bug` when the lifted error is at least half the
   original; `rounding` when it falls to what float64 rounding of it could be; `unconfirmed`
   otherwise, or when the model cannot run lifted.

```python
from smearcli.judging import evidence
f64 = evidence.Float64(runner, tokens)            # the float64 twin and its full pass, made once
noise = evidence.floor(runner, ref, tokens, f64=f64)
check = evidence.Confirmer(runner, tokens, f64)    # check(rerun, original) -> Confirmation
check.schedule("chunked", options, original)       # a built-in schedule, measured step by step
```

The lift itself is `smearcli.measure.precision`; the carried state and its zeroing, `smearcli.measure.state`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
from dataclasses import dataclass, field
from typing import Callable, Optional

import torch
from torch import Tensor

from . import judge
from ..util.defaults import NOISE_MARGIN
from ..measure.precision import lifted
from ..measure.state import Zeroing, state_kinds
from .verdicts import UNCONFIRMED

MIN_POWER = 0.01  # OK needs an error of 1% of each kind of state's effect to show


# -- 1. the floor ---------------------------------------------------------------------------------
def _first_line(e: BaseException) -> str:
    return (str(e).splitlines() or [""])[0][:160]


class Float64:
    """One runner's float64 twin (`Runner.float64()`) and its full pass, made once on first use and
    shared by the floor and every confirmation of that runner: the full pass runs lifted
    (`lifted()`), or plainly where the lift fails (the floor can still use it; a confirmation
    cannot, and says so). `run` is None, and `why` says why, when there is no float64 form."""

    def __init__(self, runner, tokens: Tensor, capture: bool = True):
        self.runner, self.tokens, self.capture = runner, tokens, capture
        self.dtype = runner.dtype or torch.float32
        self._made = False
        self.twin = self.run = None
        self.lifted = False  # whether `run` ran under the lift
        self.why = ""
        self._scale: Optional[float] = None  # `scale()`, once read

    def make(self) -> "Float64":
        from ..measure.schedules import run_schedule

        if self._made:
            return self
        self._made = True
        make = getattr(self.runner, "float64", None)
        try:
            self.twin = make() if make is not None else None
        except Exception as e:  # their code may not run in float64 (a kernel, a dtype assert)
            self.why = f"it cannot be made float64 ({type(e).__name__}: {_first_line(e)})"
            return self
        if self.twin is None:
            self.why = self.why or "its runner has no float64 form"
            return self
        for lift in (lifted, contextlib.nullcontext):  # lifted first: float32 islands round too
            try:
                with lift():
                    self.run = run_schedule(self.twin, self.tokens, "full", capture=self.capture)
                self.lifted = lift is lifted
                return self
            except Exception as e:
                self.why = f"its full pass does not run in float64 ({type(e).__name__}: {_first_line(e)})"
        return self


    def scale(self) -> float:
        """max |logit| of the float64 full pass, read once for every confirmation that bounds its
        rounding by it (a pass over the whole logits each time, before)."""
        if self._scale is None:  # max |x| is the larger of |min| and |max|: one pass, no |x| copy
            lo, hi = torch.aminmax(self.run.logits)
            self._scale = max(abs(float(lo)), abs(float(hi)))
        return self._scale

    def sibling(self, runner) -> "Float64":
        """The same for another runner of the same model (a padded or cropping one): its own twin,
        this full pass (a full pass uses no cache, so the runner's cache settings cannot change it)."""
        other = Float64(runner, self.tokens, self.capture)
        self.make()
        other._made, other.run, other.lifted, other.why = True, self.run, self.lifted, self.why
        try:
            other.twin = runner.float64()
        except Exception as e:
            other.twin, other.why = None, f"it cannot be made float64 ({type(e).__name__}: {_first_line(e)})"
        return other


def floor(runner, ref, tokens: Tensor, dtype=None, f64: Optional[Float64] = None):
    """The noise floor of `ref` (the runner's full pass in its own precision): its distance from
    the same full pass in float64 (`Float64`, given or made), per capture point, at least one ulp of
    each layer's scale; the ulp minimum alone where the runner has no float64 form. A
    `metrics.NoiseFloor` whose `source` says which."""
    import dataclasses

    from ..measure.metrics import noise_floor

    dtype = dtype or ref.logits.dtype
    f64 = (f64 or Float64(runner, tokens, capture=ref.hiddens is not None)).make()
    run = f64.run
    if run is not None:
        hiddens = run.hiddens if ref.hiddens is not None and run.hiddens is not None \
            and len(run.hiddens) == len(ref.hiddens) else None  # layers it lacks: the ulp minimum
        run = dataclasses.replace(run, logits=run.logits.to(ref.logits.dtype),
                                  hiddens=ref.hiddens if hiddens is None else [h.to(ref.logits.dtype) for h in hiddens])
    noise = noise_floor(ref, ref if run is None else run, dtype)
    noise.source = (f"the full pass in float64 against {str(dtype).removeprefix('torch.')}, at least one ulp of "
                    "each layer's scale" if run is not None else f"one ulp of each layer's scale ({f64.why})")
    noise.float64 = run is not None
    return noise


def unusable(ref) -> Optional[str]:
    """Why nothing can be measured against a reference (its logits are not all finite), or None."""
    lo, hi = torch.aminmax(ref.logits)  # NaN propagates into both, an infinity into one of them
    if math.isfinite(float(lo)) and math.isfinite(float(hi)):
        return None  # the usual case in one reduction, without a (B, T, V) mask (0.45 s at d12 / 1024 tokens)
    bad = ~torch.isfinite(ref.logits).all(dim=-1)  # (B, T): positions with a non-finite logit
    if not bool(bad.any()):
        return None
    return (f"the full pass's logits are not finite at {int(bad.any(dim=0).sum())} of {bad.size(1)} positions "
            "(the model overflows on this input): nothing can be measured against it")


# -- 2. power -------------------------------------------------------------------------------------
@dataclass
class Power:
    """How small an error in each kind of carried state the check could have seen."""
    split: int  # the state was zeroed after a prefill of this many tokens
    threshold: float  # the smallest |dlogit| the check flags: tolerance x the logits floor
    effects: dict = field(default_factory=dict)  # kind -> max |dlogit| after the split, state zeroed
    why: str = ""  # why power was not measured (no state found), or ""

    @property
    def measured(self) -> bool:
        return bool(self.effects)

    def fraction(self, kind: str) -> float:
        """The smallest share of this state's effect an error must have to be seen (1.0: all of it)."""
        eff = self.effects.get(kind, 0.0)
        return self.threshold / eff if eff > 0 else float("inf")

    @property
    def weak(self) -> list[str]:
        """Kinds whose smallest detectable error is over `MIN_POWER` of their effect (a kind whose
        zeroing moves no logit at all among them: inert on this input, an error in it cannot show)."""
        return [k for k in self.effects if self.fraction(k) > MIN_POWER]

    @property
    def sufficient(self) -> bool:
        return self.measured and not self.weak

    @property
    def shortfall(self) -> str:
        """Why this power is not enough for OK, in words ("" when it is)."""
        if not self.measured:
            return self.why
        if self.weak:
            return (f"the check could not see {', '.join(self.phrase(k) for k in self.weak)} "
                    f"(OK needs {MIN_POWER:.0%})")
        return ""

    def phrase(self, kind: str) -> str:
        if self.effects.get(kind, 0.0) == 0.0:
            return f"any error in the {kind} state (zeroing it moves no logit)"
        return f"a {_pct(self.fraction(kind))} error in the {kind} state"

    def describe(self) -> str:
        if not self.measured:
            return f"power not measured: {self.why}"
        return "would see " + ", ".join(self.phrase(k) for k in self.effects)

    def to_json(self) -> dict:
        return {"split": self.split, "threshold": self.threshold,
                "effects": {k: float(v) for k, v in self.effects.items()},
                "detectable_fraction": {k: _finite(self.fraction(k)) for k in self.effects},
                "min_power": MIN_POWER, "sufficient": self.sufficient, "why": self.why or None}


def _finite(x: float) -> Optional[float]:
    return None if x != x or x in (float("inf"), float("-inf")) else float(f"{x:.6g}")


def _pct(f: float) -> str:
    if f >= 1:
        return f"{f:.3g}x"
    return f"{f * 100:.2g}%" if f >= 1e-4 else f"{f * 100:.1e}%"


def power(runner, tokens: Tensor, threshold: float, split: Optional[int] = None) -> Power:
    """Zero each kind of state the cache carries after a prefill of `split` tokens (default: half)
    and measure the later logits against the same steps unzeroed, both as one chunk and as a few
    single tokens then a chunk (the larger effect counts)."""
    from ..measure.schedules import run_steps

    T = tokens.size(1)
    split = split or max(1, T // 2)
    out = Power(split, float(threshold))
    probe = runner.new_cache(tokens.size(0), T)
    with torch.inference_mode():
        runner.step(tokens[:, :split], probe, False)
    kinds = state_kinds(probe)
    if not kinds:
        out.why = "the cache holds no floating-point tensor to perturb"
        return out
    tail = min(4, T - split)
    plans = ([split, T - split], [split] + [1] * tail + ([T - split - tail] if T - split > tail else []))
    for steps in plans:
        base = run_steps(runner, tokens, steps)
        for kind in kinds:
            moved = run_steps(Zeroing(runner, split, [kind]), tokens, steps)
            eff = float((moved.logits[:, split:].double() - base.logits[:, split:].double()).abs().max())
            if not math.isfinite(eff):  # the logits overflow: no effect can be read from them
                return Power(split, float(threshold), why=f"zeroing the {kind} state leaves non-finite logits")
            out.effects[kind] = max(out.effects.get(kind, 0.0), eff)
    return out


# -- 3. confirmation ------------------------------------------------------------------------------
@dataclass
class Confirmation:
    """A departure rerun in float64: its size in the runner's precision and in float64 with the
    float32 islands lifted, and what that makes it."""
    original: float  # max |dlogit| in the runner's own precision
    dtype: str  # that precision
    lifted: Optional[float] = None  # float64, lifted (None: could not run)
    bound: float = 0.0  # the largest error float64 rounding of this one could leave
    status: str = UNCONFIRMED  # BUG, ROUNDING or UNCONFIRMED (`judge.confirmed`; without a rerun, unconfirmed)
    why: str = ""

    def phrase(self) -> str:
        """"keeps its size in float64 (0.0438 -> 0.0438)" and the like."""
        nums = f"{self.original:.3g} in {self.dtype}"
        if self.lifted is not None:
            nums += f", {self.lifted:.3g} in float64 lifted"
        return f"{self.why} ({nums})"

    def to_json(self) -> dict:
        return {"status": str(self.status), "dtype": self.dtype, "original": _finite(self.original),
                "float64": None,  # a plain float64 cast: filled in where asked for (`Confirmer.plain`)
                "float64_lifted": None if self.lifted is None else _finite(self.lifted),
                "rounding_bound": _finite(self.bound), "why": self.why}


def rounding_bound(original: float, dtype, scale: float) -> float:
    """The largest error float64 rounding could leave of a departure of `original` in `dtype`:
    rounding shrinks by the ratio of the units (eps64 / eps), `NOISE_MARGIN` of room, and at least
    `NOISE_MARGIN` float64 ulps of the logits' scale."""
    ratio = torch.finfo(torch.float64).eps / torch.finfo(dtype).eps
    return NOISE_MARGIN * max(original * ratio, torch.finfo(torch.float64).eps * scale)


def departure(ref, run) -> float:
    """max |dlogit| of `run` against `ref` (RunResults; rows mapped as the metrics map them)."""
    import dataclasses

    from ..measure.metrics import abs_error

    a = dataclasses.replace(ref, hiddens=None)
    b = dataclasses.replace(run, hiddens=None)
    return float(abs_error(a, b, torch.float64)[-1].max())  # in float64 a block at a time: no double copies


class Confirmer:
    """Reruns departures of one runner in float64, on its `Float64` (the twin and the lifted full
    pass, made once: the floor's, when it is given)."""

    def __init__(self, runner, tokens: Tensor, f64: Optional[Float64] = None):
        self.runner, self.tokens = runner, tokens
        self.f64 = f64 or Float64(runner, tokens, capture=False)

    def plain(self, rerun: Callable) -> Optional[float]:
        """The departure in float64 without the lift (the number a plain `.double()` gives), or
        None when it does not run."""
        from ..measure.schedules import run_schedule

        f64 = self.f64.make()
        try:
            return _finite(departure(run_schedule(f64.twin, self.tokens, "full", capture=False), rerun(f64.twin)))
        except Exception:
            return None

    def __call__(self, rerun: Callable, original: float) -> Confirmation:
        """Rerun one departure of size `original`: `rerun(r)` runs the failing schedule on the
        runner `r` (the float64 twin) and returns its RunResult."""
        return self._confirm(lambda twin, ref: departure(ref, rerun(twin)), original)

    def schedule(self, schedule: str, options, original: float) -> Confirmation:
        """`self(rerun, original)` for a run of one of the built-in `schedule`s: a plain sequence
        of steps is measured against the float64 full pass a step at a time as it reruns
        (`schedules.stream_logits`), so no float64 tensor of the whole rerun is made (at d12 / 1024
        tokens 537 MB, which a compare's heap, at its fullest then, had to find anew: up to 2 s of
        page faults); any other schedule is rerun whole. The same number either way: a maximum."""
        from ..measure.schedules import run_schedule, stream_logits

        def measure(twin, ref) -> float:
            worst: list = []

            def receive(pos: int, logits: Tensor) -> None:
                n = logits.size(1)
                part = dataclasses.replace(ref, logits=ref.logits[:, pos:pos + n], hiddens=None)
                worst.append(departure(part, dataclasses.replace(part, logits=logits)))

            if stream_logits(twin, self.tokens, schedule, receive, options):
                return max(worst, key=lambda x: (math.isnan(x), x))  # a NaN step stands, as amax keeps it
            return departure(ref, run_schedule(twin, self.tokens, schedule, opts=options, capture=False))

        return self._confirm(measure, original)

    def _confirm(self, measure: Callable, original: float) -> Confirmation:
        """`measure(twin, full pass)`: the lifted rerun's departure from the float64 full pass."""
        f64 = self.f64.make()
        c = Confirmation(float(original), str(f64.dtype).removeprefix("torch."))
        if f64.twin is None or f64.run is None or not f64.lifted:
            c.why = "not confirmed: " + (f64.why if f64.twin is None or f64.run is None  # no rerun: unconfirmed
                                         else "it does not run in float64 lifted")
            return c
        try:
            with lifted():
                c.lifted = measure(f64.twin, f64.run)
        except Exception as e:
            c.why = f"not confirmed: it does not run in float64 lifted ({type(e).__name__}: {_first_line(e)})"
            return c
        c.bound = rounding_bound(c.original, f64.dtype, f64.scale())
        c.status, c.why = judge.confirmed(c.original, c.lifted, c.bound)
        return c
