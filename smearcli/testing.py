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

The full pass (one call with cache None over all tokens, or `full`) is the reference; every
schedule, token-by-token decode and chunked prefill by default, is measured against it by
`smearcli.measure.compare` itself (the step becomes a `runner.StepRunner`), so the result is the same
`Comparison` the CLI renders, judged by `smearcli.judging.evidence` like every other surface:

- **the floor** is the reference against itself in float64: the torch modules the callables reach
  (a bound method's model, a closure's, a global's) are switched to float64 for one call and back
  to the very tensors they were. Where none is found the floor is one ulp of each layer's scale,
  and the table's first line says which. No schedule under test sets it, decode included: a step
  that is wrong one token at a time fails like any other.
- **power**: the tensors of the cache the step returns are zeroed after half the tokens; a kind
  of state whose zeroing moves the later logits by less than 100x the tolerance makes the result
  INCONCLUSIVE. A cache whose tensors cannot be found leaves the power unmeasured, which is
  INCONCLUSIVE too.
- **confirmation**: a run that leaves the tolerance is rerun in float64 with float32 requests
  lifted (`evidence.Confirmer`): a bug keeps its size, rounding vanishes.

`assert_cache_consistent` passes an `ok` verdict only. What a step returns is copied as it is
received (`smearcli.measure.owned`), so a step may hand back views of a buffer it writes again; logits
that cannot be measured (not (batch, tokens, vocab) for the ids given, an empty vocabulary, one
that changes between calls or differs from the full pass's) are a ValueError naming the call, the
shape expected and the shape returned.
"""

from __future__ import annotations

import math
import numbers
from typing import Any, Callable, Optional, Sequence

import torch
from torch import Tensor

from .measure.compare import Comparison, compare
from .util.defaults import NOISE_MARGIN
from .measure.runner import StepRunner
from .measure.schedules import plan_steps
from .measure.steps import ScheduleOptions

Step = Callable[[Tensor, Any], tuple]
DEFAULT_SCHEDULES = ("decode", "chunked")


def as_batch(tokens) -> Tensor:
    """Token ids as a (B, T) long tensor; a flat list or (T,) tensor is one row."""
    t = tokens if isinstance(tokens, Tensor) else torch.tensor(list(tokens))
    if t.is_floating_point() or t.is_complex() or t.dtype == torch.bool:
        raise TypeError(f"tokens must be integer token ids, got {str(t.dtype).removeprefix('torch.')}")
    if t.dim() == 1:
        t = t.unsqueeze(0)
    if t.dim() != 2 or t.size(1) < 2:
        raise ValueError(f"tokens must be (batch, seq_len) with at least 2 tokens, got shape {tuple(t.shape)}")
    return t.long()


def _check_arguments(chunk_sizes, chunks, tolerance, T: int) -> None:
    """TypeError or ValueError naming the argument that cannot mean anything."""
    if chunk_sizes is not None:
        sizes = list(chunk_sizes)
        bad = [c for c in sizes if isinstance(c, bool) or not isinstance(c, numbers.Integral)]
        if bad:
            raise TypeError(f"chunk_sizes must be whole numbers of tokens, got {bad[0]!r}")
        if not sizes or min(sizes) < 1 or sum(sizes) != T:
            raise ValueError(f"chunk_sizes must be positive and sum to the {T} tokens, got "
                             f"{', '.join(map(str, sizes)) or 'none'} (sum {sum(sizes)})")
    if isinstance(chunks, bool) or not isinstance(chunks, numbers.Integral) or chunks < 1:
        raise ValueError(f"chunks must be a whole number >= 1, got {chunks!r}")
    if isinstance(tolerance, bool) or not isinstance(tolerance, numbers.Real) \
            or not math.isfinite(tolerance) or tolerance <= 0:
        raise ValueError(f"tolerance must be a finite number > 0 (a multiple of the noise floor), got {tolerance!r}")


def checked(fn: Callable, name: str, cached: bool) -> Callable:
    """`fn` (the step or the full pass) with what it returns checked on every call: the structure
    (`runner.unpack`), then logits that are floating point, (batch, tokens, vocab) for the ids
    given, and finite. A wrong answer is a TypeError or ValueError naming `name`, not an error
    from deep inside the comparison; an exception `fn` raises goes through as it is."""
    from .measure.runner import unpack

    def call(ids, *cache):
        out = fn(ids, *cache)
        logits = unpack(out, cached)[0].logits
        if not logits.is_floating_point():
            raise TypeError(f"{name} returned {str(logits.dtype).removeprefix('torch.')} logits; they must be "
                            "floating point")
        if tuple(logits.shape[:2]) != tuple(ids.shape):
            raise ValueError(f"{name} returned logits of shape {tuple(logits.shape)} for ids of shape "
                             f"{tuple(ids.shape)}: they must be (batch, tokens, vocab)")
        finite = torch.isfinite(logits)
        if not bool(finite.all()):
            raise ValueError(f"{name} returned non-finite logits (NaN or infinite at {int((~finite).sum())} of "
                             f"{finite.numel()} entries) for a call over {ids.size(1)} tokens")
        return out
    return call


def default_layer_names(n_hidden: int) -> list[str]:
    return [f"h{i}" for i in range(n_hidden)] + ["logits"]


def _probe_layers(step: Step, full: Optional[Callable], tokens: Tensor) -> int:
    """How many capture points (hidden states + logits) one call returns, from two tokens."""
    from .measure.runner import unpack

    with torch.inference_mode():
        out = unpack(full(tokens[:, :2]), cached=False)[0] if full is not None else \
            unpack(step(tokens[:, :2], None), cached=True)[0]
    return len(out.hiddens or []) + 1


def check_cache_consistency(step: Step, tokens, chunk_sizes: Optional[Sequence[int]] = None, *,
                            chunks: int = 3, schedules: Sequence[str] = DEFAULT_SCHEDULES,
                            options: Optional[ScheduleOptions] = None, tolerance: float = NOISE_MARGIN,
                            layer_names: Optional[Sequence[str]] = None, full: Optional[Callable] = None,
                            dtype: Optional[torch.dtype] = None, logic: str = "model") -> Comparison:
    """Run the full pass and every schedule in `schedules` (prefill, decode, chunked,
    speculative) through `step`; measure each against the full pass (see the module docstring).

    `chunk_sizes` (summing to the sequence length) or `chunks` (near-equal chunks) set the chunked
    run; `options` sets the rest (speculative: gen_len, draft) and wins over both. `full`, if
    given, is the reference instead of one cached call: `full(ids) -> (logits[, hidden_states])`
    (e.g. the model without a cache). `dtype` sets the one-ulp minimum of the noise floor (default:
    the reference logits' dtype); `logic` labels the runs. Never raises on a mismatch; see
    `assert_cache_consistent`."""
    tokens = as_batch(tokens)
    _check_arguments(chunk_sizes, chunks, tolerance, tokens.size(1))
    T = tokens.size(1)
    if options is None:
        options = ScheduleOptions(chunks=chunks, chunk_sizes=None if chunk_sizes is None else tuple(chunk_sizes))
    names = list(dict.fromkeys(schedules))
    if not names:
        raise ValueError("schedules is empty: name at least one of prefill, decode, chunked, speculative")
    for s in names:
        plan_steps(s, T, options)  # validates names and sizes up front
    step = checked(step, "step", cached=True)
    full = None if full is None else checked(full, "full", cached=False)
    n_layers = _probe_layers(step, full, tokens)
    if layer_names is None:
        layer_names = default_layer_names(n_layers - 1)
    if len(layer_names) != n_layers:
        raise ValueError(f"{len(layer_names)} layer names for {n_layers} capture points (hidden states + logits)")
    runner = StepRunner(fn=step, full=full, label=logic, layers=tuple(layer_names), dtype=dtype)
    return compare(runner, tokens, names, options=options, tolerance=tolerance)


def assert_cache_consistent(step: Step, tokens, chunk_sizes: Optional[Sequence[int]] = None, *,
                            tolerance: float = NOISE_MARGIN, **kwargs) -> Comparison:
    """`check_cache_consistency`, raising AssertionError with the table unless the verdict is ok
    (a bug, an unconfirmed departure, an inconclusive check or a crash all raise)."""
    check = check_cache_consistency(step, tokens, chunk_sizes, tolerance=tolerance, **kwargs)
    if not check.passed:
        raise AssertionError("cache inconsistency\n" + check.table())
    return check


def gpt_step(model, logic: Optional[str] = None, max_len: Optional[int] = None) -> Step:
    """Our GPT (smearcli.gpt.model) as a `step`, with its KVCache and every captured hidden state."""
    def step(ids: Tensor, cache):
        if cache is None:
            cache = model.new_cache(ids.size(0), max_len or model.config.sequence_len)
        cap: list = []
        logits = model(ids.to(model.device), cache=cache, smear=logic, capture=cap)
        return logits, cap, cache
    return step
