"""The standard of evidence behind every verdict: the floor, power and confirmation.

Every surface (compare for every `--impl`, the boundaries, `smearcli scan`, `smearcli.testing`)
reaches its verdict through this module, by three rules:

1. **The floor** never comes from a schedule under test. `floor(runner, ref, tokens)` runs the
   reference again in float64 (`Runner.float64()`, a twin of the same weights) and takes the
   distance of the reference in its own precision from it, per layer, at least one ulp of each
   layer's scale. A runner with no float64 twin gets the ulp minimum alone, and the floor's
   `source` says which. Token-by-token decode is a schedule like any other.
2. **Power.** `power(runner, tokens, threshold)` zeroes each kind of state the cache carries
   (`cache_tensors`: attention keys and values, conv taps, every other recurrent state) after a
   prefill and measures how far the later logits move. An error in that state is flagged when it
   moves a logit past `threshold` (tolerance x floor), so the smallest error the check could have
   seen is `threshold / effect` of the state's whole effect: `Power.fraction(kind)`. OK needs
   every kind at `MIN_POWER` (1%) or better.
3. **Confirmation.** A run that departs in its own precision is a candidate, not a bug.
   `confirm(...)` reruns it and the full pass with the model in float64 under `lifted()`, where
   every float32 request inside the model's code (a router, rotary, a softmax upcast) becomes
   float64 too. A logic error keeps its size when precision rises; rounding falls by the ratio of
   the two units (2^-29 from float32). So: `bug` when the lifted error is at least half the
   original; `rounding` when it falls to what float64 rounding of it could be; `unconfirmed`
   otherwise, or when the model cannot run lifted.

```python
from smearcli import evidence
with evidence.lifted():          # float32 requests inside become float64
    out = model_in_float64(ids)
```
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Callable, Optional

import torch
from torch import Tensor

from .names import NOISE_MARGIN
from .precision import float64_model, in_float64, lifted, modules_in  # noqa: F401 - part of this API
from .verdicts import BUG, ROUNDING, UNCONFIRMED

MIN_POWER = 0.01  # OK needs an error of 1% of each kind of state's effect to show
KEEPS = 0.5  # a confirmed bug's lifted error is at least this share of its error in its own precision

KV, CONV, STATE = "kv", "conv", "recurrent"  # attention keys/values, conv taps, every other carried state
KV_NAMES = ("keys", "values", "key_cache", "value_cache", "key", "value", "k_cache", "v_cache",
            "k", "v", "_k_layers", "_v_layers")  # the last four: smearcli's own KVCache


# -- the carried state ----------------------------------------------------------------------------
def cache_tensors(obj, path: str = "", depth: int = 0, seen=None) -> list[tuple[str, Tensor, str]]:
    """(path, tensor, kind) for every floating-point tensor reachable from a cache object
    (attributes, lists, tuples, dicts; four levels deep). Integer tensors (lengths, positions)
    are bookkeeping, not state."""
    seen = set() if seen is None else seen
    if id(obj) in seen or depth > 4:
        return []
    seen.add(id(obj))
    if isinstance(obj, Tensor):
        if not obj.is_floating_point():
            return []
        parts = path.split(".")
        kind = KV if any(p in KV_NAMES for p in parts) else CONV if "conv" in path.lower() else STATE
        return [(path, obj, kind)]
    items: list = []
    if isinstance(obj, dict):
        items = list(obj.items())
    elif isinstance(obj, (list, tuple)):
        items = list(enumerate(obj))
    elif hasattr(obj, "__dict__") and not isinstance(obj, (torch.nn.Module, type)):
        items = list(vars(obj).items())
    out = []
    for k, v in items:
        if isinstance(v, (torch.dtype, torch.device, str, int, float, bool)) or v is None:
            continue
        out += cache_tensors(v, f"{path}.{k}" if path else str(k), depth + 1, seen)
    return out


def state_of(cache):
    """The object a runner's cache holds its tensors in (a `runner.Holder`'s `inner`)."""
    return cache.inner if hasattr(cache, "inner") and hasattr(cache, "started") else cache


def state_kinds(cache) -> list[str]:
    return sorted({kind for _, t, kind in cache_tensors(state_of(cache)) if t.numel()})


# -- 1. the floor ---------------------------------------------------------------------------------
def float64_twin(runner):
    """`runner.float64()`, or (None, why) when it has none or it fails."""
    make = getattr(runner, "float64", None)
    if make is None:
        return None, "its runner has no float64 form"
    try:
        twin = make()
    except Exception as e:  # their code may not run in float64 (a kernel, a dtype assert)
        return None, f"it cannot be made float64 ({type(e).__name__}: {_first_line(e)})"
    return (twin, "") if twin is not None else (None, "its runner has no float64 form")


def _first_line(e: BaseException) -> str:
    return (str(e).splitlines() or [""])[0][:160]


def floor(runner, ref, tokens: Tensor, dtype=None):
    """The noise floor of `ref` (the runner's full pass in its own precision): its distance from
    the same full pass in float64 (lifted, or plain where the lift fails), per capture point, at
    least one ulp of each layer's scale; where
    the runner has no float64 twin (or it fails), the ulp minimum alone. A `metrics.NoiseFloor`
    whose `source` says which."""
    from .metrics import noise_floor
    from .schedules import run_schedule

    dtype = dtype or ref.logits.dtype
    name = str(dtype).removeprefix("torch.")
    twin, why = float64_twin(runner)
    run = None
    if twin is not None:
        for lift in (lifted, contextlib.nullcontext):  # lifted first: float32 islands round too
            try:
                with lift():
                    run = run_schedule(twin, tokens, "full", capture=ref.hiddens is not None)
                break
            except Exception as e:
                why = f"its full pass does not run in float64 ({type(e).__name__}: {_first_line(e)})"
    if run is not None and (ref.hiddens is None or run.hiddens is None or len(run.hiddens) != len(ref.hiddens)):
        run = _logits_of(run, ref)
    noise = noise_floor(ref, ref if run is None else _as(run, ref.logits.dtype), dtype)
    noise.measured_logits = 0.0  # decode is a schedule: its distance is its own metric
    noise.source = (f"the full pass in float64 against {name}, at least one ulp of each layer's scale"
                    if run is not None else f"one ulp of each layer's scale ({why})")
    noise.float64 = run is not None
    return noise


def _as(run, dtype):
    import dataclasses

    return dataclasses.replace(run, logits=run.logits.to(dtype),
                               hiddens=None if run.hiddens is None else [h.to(dtype) for h in run.hiddens])


def _logits_of(run, ref):
    """`run` with the reference's hidden states: layers the float64 run lacks get the ulp minimum."""
    import dataclasses

    return dataclasses.replace(run, hiddens=ref.hiddens)


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
    def unread(self) -> list[str]:
        """Kinds whose zeroing moves no logit at all, one chunk or one token at a time: the model
        never reads them (a tensor kept for a layer kind it does not have), so there is nothing in
        them to get wrong."""
        return [k for k, v in self.effects.items() if v == 0.0]

    @property
    def weak(self) -> list[str]:
        """Kinds read but whose smallest detectable error is over `MIN_POWER` of their effect."""
        return [k for k in self.effects if k not in self.unread and self.fraction(k) > MIN_POWER]

    @property
    def sufficient(self) -> bool:
        return self.measured and len(self.unread) < len(self.effects) and not self.weak

    def phrase(self, kind: str) -> str:
        if kind in self.unread:
            return f"nothing in the {kind} state, which is never read (zeroing it moves no logit)"
        return f"a {_pct(self.fraction(kind))} error in the {kind} state"

    def describe(self) -> str:
        if not self.measured:
            return f"power not measured: {self.why}"
        return "would see " + ", ".join(self.phrase(k) for k in self.effects)

    def to_json(self) -> dict:
        return {"split": self.split, "threshold": self.threshold,
                "effects": {k: float(v) for k, v in self.effects.items()},
                "detectable_fraction": {k: _finite(self.fraction(k)) for k in self.effects},
                "unread": self.unread,
                "min_power": MIN_POWER, "sufficient": self.sufficient, "why": self.why or None}


def _finite(x: float) -> Optional[float]:
    return None if x != x or x in (float("inf"), float("-inf")) else float(f"{x:.6g}")


def _pct(f: float) -> str:
    if f >= 1:
        return f"{f:.3g}x"
    return f"{f * 100:.2g}%" if f >= 1e-4 else f"{f * 100:.1e}%"


class Zeroing:
    """`inner` with each kind of state in `kinds` zeroed after the step that ends at `at` (a
    `Runner` in all but name: run_steps needs new_cache, step and label)."""

    def __init__(self, inner, at: int, kinds):
        self.inner, self.at, self.kinds = inner, at, set(kinds)
        self.label, self.layers = inner.label, inner.layers
        self.capabilities, self._pos = frozenset(), {}

    def can(self, capability):
        return False

    def forward(self, tokens, capture):
        return self.inner.forward(tokens, capture)

    def new_cache(self, batch, max_len):
        return self.inner.new_cache(batch, max_len)

    def run(self, schedule, tokens, options):
        return None

    def step(self, tokens, cache, capture):
        out = self.inner.step(tokens, cache, capture)
        pos = self._pos[id(cache)] = self._pos.get(id(cache), 0) + tokens.size(1)
        if pos == self.at:
            with torch.no_grad():
                for _, t, kind in cache_tensors(state_of(cache)):
                    if kind in self.kinds:
                        t.zero_()
        return out


def power(runner, tokens: Tensor, threshold: float, split: Optional[int] = None) -> Power:
    """Zero each kind of state the cache carries after a prefill of `split` tokens (default: half)
    and measure the later logits against the same steps unzeroed, both as one chunk and as a few
    single tokens then a chunk (the larger effect counts)."""
    from .schedules import run_steps

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
            out.effects[kind] = max(out.effects.get(kind, 0.0), eff)
    return out


# -- 3. confirmation ------------------------------------------------------------------------------
@dataclass
class Confirmation:
    """A departure rerun in float64: its size in the runner's precision, in a plain float64 cast,
    and in float64 with the float32 islands lifted, and what that makes it."""
    original: float  # max |dlogit| in the runner's own precision
    dtype: str  # that precision
    lifted: Optional[float] = None  # float64, lifted (None: could not run)
    plain: Optional[float] = None  # float64 cast alone (None: not run or could not run)
    bound: float = 0.0  # the largest error float64 rounding of this one could leave
    status: str = UNCONFIRMED  # BUG, ROUNDING or UNCONFIRMED
    why: str = ""

    @property
    def is_bug(self) -> bool:
        return self.status == BUG

    def phrase(self) -> str:
        """"keeps its size in float64 (0.0438 -> 0.0438)" and the like."""
        nums = f"{self.original:.3g} in {self.dtype}"
        if self.plain is not None:
            nums += f", {self.plain:.3g} in float64"
        if self.lifted is not None:
            nums += f", {self.lifted:.3g} in float64 lifted"
        return f"{self.why} ({nums})"

    def to_json(self) -> dict:
        return {"status": str(self.status), "dtype": self.dtype, "original": _finite(self.original),
                "float64": None if self.plain is None else _finite(self.plain),
                "float64_lifted": None if self.lifted is None else _finite(self.lifted),
                "rounding_bound": _finite(self.bound), "why": self.why}


def rounding_bound(original: float, dtype, scale: float) -> float:
    """The largest error float64 rounding could leave of a departure of `original` in `dtype`:
    rounding shrinks by the ratio of the units (eps64 / eps), `NOISE_MARGIN` of room, and at least
    `NOISE_MARGIN` float64 ulps of the logits' scale."""
    ratio = torch.finfo(torch.float64).eps / torch.finfo(dtype).eps
    return NOISE_MARGIN * max(original * ratio, torch.finfo(torch.float64).eps * scale)


def classify(original: float, lifted: Optional[float], bound: float) -> tuple[str, str]:
    """(status, why) of a departure from its lifted float64 size."""
    if lifted is None:
        return UNCONFIRMED, "not confirmed: the model does not run in float64"
    if lifted >= KEEPS * original:
        return BUG, "keeps its size in float64"
    if lifted <= bound:
        return ROUNDING, "float32 rounding, gone in float64"
    return UNCONFIRMED, "shrinks in float64 without vanishing: neither a logic error nor rounding shown"


def departure(ref, run) -> float:
    """max |dlogit| of `run` against `ref` (RunResults; rows mapped as the metrics map them)."""
    import dataclasses

    from .metrics import abs_error

    a = dataclasses.replace(ref, hiddens=None, logits=ref.logits.double())
    b = dataclasses.replace(run, hiddens=None, logits=run.logits.double())
    return float(abs_error(a, b)[-1].max())


class Confirmer:
    """Reruns departures of one runner in float64: its twin and its lifted full pass are made once
    and shared by every departure confirmed (a census confirms several schedules of one model)."""

    def __init__(self, runner, tokens: Tensor):
        self.runner, self.tokens = runner, tokens
        self.dtype = runner.dtype or torch.float32
        self._twin, self._why, self._ref, self._ref_error = None, "", None, None
        self._made = False

    def _reference(self):
        """(twin, its lifted full pass) or raises; made on first use."""
        from .schedules import run_schedule

        if not self._made:
            self._made = True
            self._twin, self._why = float64_twin(self.runner)
            if self._twin is not None:
                try:
                    with lifted():
                        self._ref = run_schedule(self._twin, self.tokens, "full", capture=False)
                except Exception as e:
                    self._ref_error = e
        return self._twin

    def __call__(self, rerun: Callable, original: float, plain: bool = False) -> Confirmation:
        """Rerun one departure of size `original`: `rerun(r)` runs the failing schedule on the
        runner `r` (the float64 twin) and returns its RunResult. With `plain`, the same again
        without the lift (the number a plain `.double()` gives)."""
        from .schedules import run_schedule

        c = Confirmation(float(original), str(self.dtype).removeprefix("torch."))
        twin = self._reference()
        if twin is None:
            c.status, c.why = UNCONFIRMED, f"not confirmed: {self._why}"
            return c
        try:
            if self._ref_error is not None:
                raise self._ref_error
            with lifted():
                run64 = rerun(twin)
            c.lifted = departure(self._ref, run64)
        except Exception as e:
            c.status, c.why = UNCONFIRMED, (f"not confirmed: it does not run in float64 lifted "
                                            f"({type(e).__name__}: {_first_line(e)})")
            return c
        if plain:
            try:
                c.plain = departure(run_schedule(twin, self.tokens, "full", capture=False), rerun(twin))
            except Exception:
                c.plain = None
        c.bound = rounding_bound(c.original, self.dtype, float(self._ref.logits.abs().max()))
        c.status, c.why = classify(c.original, c.lifted, c.bound)
        return c


def confirm(runner, tokens: Tensor, rerun: Callable, original: float, plain: bool = False) -> Confirmation:
    """One departure rerun in float64 (`Confirmer`, for a single one)."""
    return Confirmer(runner, tokens)(rerun, original, plain)
