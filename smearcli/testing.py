"""Check any model's cache the way smearcli checks nanochat's: one line in a pytest suite.

```python
from smearcli.testing import assert_cache_consistent

def test_cache(my_model):
    assert_cache_consistent(my_step, tokens, chunk_sizes=(16, 16, 16))
```

`step` is any callable `step(ids, cache) -> (logits, new_cache)` or
`(logits, hidden_states, new_cache)`:

- `ids`: (B, T_chunk) token ids, the next chunk of the sequence;
- `cache`: None on the first call of a run, then whatever the previous call returned;
- `logits`: (B, T_chunk, V) for that chunk;
- `hidden_states` (optional): a sequence of per-layer tensors (B, T_chunk, C) for that chunk,
  lowest layer first; with them the report says in which layer the error is born.

Three kinds of run feed the same tokens: the full pass (one call with cache None over all tokens,
the reference), token-by-token decode (one token per call: its distance from the full pass is the
noise floor, what rounding alone costs), and chunked prefill (the given chunk sizes). Every run is
measured with the same metrics as `smearcli compare` (smearcli.metrics): per position and layer,
as multiples of the measured noise floor. A run passes when its logits stay within `tolerance`
times the floor.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Optional, Sequence

import torch
from torch import Tensor

from .names import NOISE_MARGIN
from .metrics import NoiseFloor, RunMetrics, measure, noise_floor
from .schedules import RunResult, ScheduleOptions, plan_steps
from .units import sci, times

Step = Callable[[Tensor, Any], tuple]
REFERENCE_NAME = "full"
NOISE_SCHEDULE = "decode"
DEFAULT_SCHEDULES = ("decode", "chunked")
# token-by-token decode this many ulps (of the dtype, at the logits' scale) off the full pass is
# no longer rounding: the floor measured from it would hide real errors, so the report says so
SUSPECT_NOISE_ULPS = 1e3


def _unpack(out) -> tuple[Tensor, Optional[list[Tensor]], Any]:
    if not isinstance(out, (tuple, list)) or len(out) not in (2, 3):
        raise TypeError("a step must return (logits, cache) or (logits, hidden_states, cache)")
    if len(out) == 2:
        logits, cache = out
        hiddens = None
    else:
        logits, hiddens, cache = out
    if not isinstance(logits, Tensor) or logits.dim() != 3:
        raise TypeError("a step's logits must be a (batch, tokens, vocab) tensor")
    if hiddens is not None:
        hiddens = list(hiddens)
        for h in hiddens:
            if not isinstance(h, Tensor) or h.dim() != 3:
                raise TypeError("a step's hidden states must be (batch, tokens, channels) tensors")
    return logits, hiddens, cache


def as_batch(tokens) -> Tensor:
    """Token ids as a (B, T) long tensor; a flat list or (T,) tensor is one row."""
    t = tokens if isinstance(tokens, Tensor) else torch.tensor(list(tokens))
    if t.dim() == 1:
        t = t.unsqueeze(0)
    if t.dim() != 2 or t.size(1) < 2:
        raise ValueError("tokens must be (batch, seq_len) with at least 2 tokens")
    return t.long()


def run_steps(step: Step, tokens: Tensor, steps: Sequence[int], schedule: str, logic: str = "-") -> RunResult:
    """Feed `tokens` (B, T) through `step` in chunks of `steps`, a fresh cache first; outputs
    stitched back along T as if the whole sequence had run at once."""
    tokens = as_batch(tokens)
    B, T = tokens.shape
    if sum(steps) != T or any(n < 1 for n in steps):
        raise ValueError(f"steps {list(steps)} do not cover {T} tokens")
    cache, logits, hiddens, pos = None, [], [], 0
    with torch.inference_mode():
        for n in steps:
            lg, hs, cache = _unpack(step(tokens[:, pos:pos + n], cache))
            if lg.shape[:2] != (B, n):
                raise ValueError(f"a step over {n} tokens returned logits of shape {tuple(lg.shape)}")
            logits.append(lg.float())
            hiddens.append(None if hs is None else [h.float() for h in hs])
            pos += n
    if any(h is None for h in hiddens):
        stacked = None
    else:
        depth = {len(h) for h in hiddens}
        if len(depth) != 1:
            raise ValueError("steps returned different numbers of hidden states")
        stacked = [torch.cat([h[i] for h in hiddens], dim=1) for i in range(depth.pop())]
    return RunResult(schedule, logic, torch.cat(logits, dim=1), stacked, list(steps), list(range(B)))


def default_layer_names(n_hidden: int) -> list[str]:
    return [f"h{i}" for i in range(n_hidden)] + ["logits"]


def _fmt_steps(steps: list[int]) -> str:
    runs: list[list[int]] = []
    for n in steps:
        if runs and runs[-1][0] == n:
            runs[-1][1] += 1
        else:
            runs.append([n, 1])
    return ",".join(str(n) if k == 1 else f"{k}x{n}" for n, k in runs)  # 3x16: three steps of 16


@dataclass
class CacheCheck:
    """What `check_cache_consistency` measured; `passed`, `verdict` and `table()` read it."""
    tokens: Tensor
    layers: list[str]  # capture-point names, "logits" last
    noise: NoiseFloor
    reference: RunResult
    runs: list[RunResult]
    metrics: list[RunMetrics]  # one per run, same order
    tolerance: float
    dtype: torch.dtype  # sets the one-ulp minimum of the noise floor
    notes: list[str] = field(default_factory=list)  # what ran (adapters add theirs)

    def get(self, schedule: str) -> RunMetrics:
        for m in self.metrics:
            if m.schedule == schedule:
                return m
        raise KeyError(schedule)

    @property
    def failures(self) -> list[RunMetrics]:
        return [m for m in self.metrics if not m.passed]

    @property
    def passed(self) -> bool:
        return not self.failures

    def born_at(self, m: RunMetrics) -> Optional[tuple[str, int]]:
        """(layer name, position) where the run first leaves `tolerance` x the floor."""
        fd = m.first_departure
        return None if fd is None else (self.layers[fd[0]], fd[1])

    def start_share(self, m: RunMetrics) -> Optional[float]:
        """Share of the error at the layer where it is born that sits on chunk starts."""
        fd = m.first_departure
        return None if fd is None else m.chunk_start_share_at(fd[0])

    @property
    def decode_ulps(self) -> float:
        """Token-by-token decode's logits distance from the full pass, in ulps at the logits' scale."""
        scale = float(self.reference.logits.abs().max()) * torch.finfo(self.dtype).eps
        d = self.get(NOISE_SCHEDULE).max_abs_logits
        return d / scale if scale > 0 else (0.0 if d == 0 else float("inf"))

    @property
    def noise_suspect(self) -> bool:
        return self.decode_ulps > SUSPECT_NOISE_ULPS

    def describe(self, m: RunMetrics) -> str:
        """One sentence for one failing run: where born, how big, how far it spreads."""
        T = self.tokens.size(1)
        born = self.born_at(m)
        first = m.chunk_starts[0] if m.chunk_starts else None
        msg = f"{m.schedule} (steps {_fmt_steps(m.steps)}) diverges from the full pass"
        if born is not None:
            layer, pos = born
            msg += f": born at {layer}@{pos}"
            if first is not None:
                if pos in m.chunk_starts:
                    which = "the first chunk start" if pos == first else "a chunk start"
                    msg += f", {which} ({pos})"
                else:
                    msg += f", not on a chunk start (first chunk start: {first})"
        elif first is not None:
            msg += f" (first chunk start: {first})"
        msg += (f"; max |dlogit| {m.max_abs_logits:.3g} ({times(m.logits_multiple)}x noise); "
                f"{m.positions_above_noise}/{T} positions above {NOISE_MARGIN:g}x noise")
        share = self.start_share(m)
        if share is not None and born is not None:
            msg += f"; {share:.0%} of the error at {born[0]} sits on chunk starts"
        return msg

    @property
    def verdict(self) -> str:
        tail = ""
        if self.noise_suspect:
            tail = (f" (note: token-by-token decode itself is {self.decode_ulps:.3g} ulps off the full pass, "
                    f"so the noise floor it sets may hide errors)")
        bad = self.failures
        if not bad:
            return (f"OK: every schedule matches the full pass within {self.tolerance:g}x the noise floor"
                    + tail)
        return "BUG: " + "; ".join(self.describe(m) for m in bad) + tail

    def table(self) -> str:
        """A plain-text table, one row per run, and the verdict."""
        T = self.tokens.size(1)
        head = ["schedule", "steps", "max|dlogit|", "xnoise", "KL max", "top-1", "@starts", "born at", "spread", ""]
        rows = []
        for m in self.metrics:
            born = self.born_at(m)
            share = self.start_share(m)
            rows.append([m.schedule, _fmt_steps(m.steps), sci(m.max_abs_logits), times(m.logits_multiple),
                         sci(m.kl_max), f"{m.top1_agreement:.1%}",
                         "-" if share is None else f"{share:.0%}",
                         "-" if born is None else f"{born[0]}@{born[1]}",
                         f"{m.positions_above_noise}/{T}", "ok" if m.passed else "BUG"])
        widths = [max(len(r[i]) for r in [head] + rows) for i in range(len(head))]
        line = lambda r: "  ".join(c.ljust(w) if i < 2 or i >= 7 else c.rjust(w)
                                   for i, (c, w) in enumerate(zip(r, widths))).rstrip()
        out = [f"{self.tokens.size(0)} x {T} tokens; noise floor (logits) {sci(self.noise.per_layer[-1])} "
               f"from token-by-token decode; a run passes within {self.tolerance:g}x",
               line(head)] + [line(r) for r in rows]
        out += self.notes
        if self.passed:
            out.append(self.verdict)
        else:
            out += ["BUG: " + self.describe(m) for m in self.failures]
            if self.noise_suspect:
                out.append(self.verdict[self.verdict.rindex(" (note: ") + 2:-1])
        return "\n".join(out)


def check_cache_consistency(step: Step, tokens, chunk_sizes: Optional[Sequence[int]] = None, *,
                            chunks: int = 3, schedules: Sequence[str] = DEFAULT_SCHEDULES,
                            options: Optional[ScheduleOptions] = None, tolerance: float = NOISE_MARGIN,
                            layer_names: Optional[Sequence[str]] = None, full: Optional[Callable] = None,
                            dtype: Optional[torch.dtype] = None, logic: str = "-") -> CacheCheck:
    """Run the full pass, token-by-token decode and every schedule in `schedules` (prefill,
    decode, chunked, speculative) through `step`; measure each against the full pass.

    `chunk_sizes` (summing to the sequence length) or `chunks` (near-equal chunks) set the chunked
    run; `options` sets the rest (speculative: gen_len, draft) and wins over both. `full`, if
    given, is the reference instead of one cached call: `full(ids) -> (logits[, hidden_states])`
    (e.g. the model without a cache). `dtype` sets the one-ulp minimum of the noise floor (default:
    the reference logits' dtype). Never raises on a mismatch; see `assert_cache_consistent`."""
    tokens = as_batch(tokens)
    T = tokens.size(1)
    if options is None:
        options = ScheduleOptions(chunks=chunks, chunk_sizes=None if chunk_sizes is None else tuple(chunk_sizes))
    names = list(schedules)
    if NOISE_SCHEDULE not in names:
        names.insert(0, NOISE_SCHEDULE)
    plans = {s: plan_steps(s, T, options) for s in names}  # validates names and sizes up front
    if full is not None:
        def once(ids, cache):
            out = full(ids)
            return (out, None) if isinstance(out, Tensor) else (*out, None)
        ref = run_steps(once, tokens, [T], REFERENCE_NAME, logic)
    else:
        ref = run_steps(step, tokens, [T], REFERENCE_NAME, logic)
    runs = [run_steps(step, tokens, plans[s], s, logic) for s in names]
    n_layers = len(ref.hiddens or []) + 1
    for r in runs:
        if len(r.hiddens or []) + 1 != n_layers:
            raise ValueError("the cached steps return a different number of hidden states than the full pass")
    if layer_names is None:
        layer_names = default_layer_names(n_layers - 1)
    if len(layer_names) != n_layers:
        raise ValueError(f"{len(layer_names)} layer names for {n_layers} capture points (hidden states + logits)")
    if dtype is None:
        dtype = ref.logits.dtype if ref.logits.is_floating_point() else torch.float32
    decode = runs[names.index(NOISE_SCHEDULE)]
    noise = noise_floor(ref, decode, dtype)
    metrics = [measure(ref, r, noise, tolerance) for r in runs]
    return CacheCheck(tokens, list(layer_names), noise, ref, runs, metrics, tolerance, dtype)


def assert_cache_consistent(step: Step, tokens, chunk_sizes: Optional[Sequence[int]] = None, *,
                            tolerance: float = NOISE_MARGIN, **kwargs) -> CacheCheck:
    """`check_cache_consistency`, raising AssertionError with the table when any run fails."""
    check = check_cache_consistency(step, tokens, chunk_sizes, tolerance=tolerance, **kwargs)
    if not check.passed:
        raise AssertionError("cache inconsistency\n" + check.table())
    return check


def gpt_step(model, logic: Optional[str] = None, max_len: Optional[int] = None) -> Step:
    """Our GPT (smearcli.model) as a `step`, with its KVCache and every captured hidden state."""
    def step(ids: Tensor, cache):
        if cache is None:
            cache = model.new_cache(ids.size(0), max_len or model.config.sequence_len)
        cap: list = []
        logits = model(ids.to(model.device), cache=cache, smear=logic, capture=cap)
        return logits, cap, cache
    return step
