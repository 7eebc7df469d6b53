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
`smearcli.compare` itself (the step becomes a `runner.StepRunner`), so the result is the same
`Comparison` the CLI renders, judged by `smearcli.evidence` like every other surface:

- **the floor** is the reference against itself in float64: the torch modules the callables reach
  (a bound method's model, a closure's, a global's) are switched to float64 for one call and back
  to the very tensors they were. Where none is found the floor is one ulp of each layer's scale,
  and the table's first line says which. No schedule under test sets it, decode included: a step
  that is wrong one token at a time fails like any other.
- **power**: the tensors of the cache the step returns are zeroed after half the tokens; a kind
  of state whose zeroing moves the later logits by less than 100x the tolerance makes the result
  INCONCLUSIVE. A cache whose tensors cannot be found is said to be unmeasured, and the check
  judges on the floor alone.
- **confirmation**: a run that leaves the tolerance is rerun in float64 with float32 requests
  lifted (`evidence.Confirmer`): a bug keeps its size, rounding vanishes.

`assert_cache_consistent` passes an `ok` verdict only.
"""

from __future__ import annotations

from typing import Any, Callable, Optional, Sequence

import torch
from torch import Tensor

from .compare import Comparison, compare
from .names import NOISE_MARGIN
from .runner import StepRunner
from .schedules import ScheduleOptions, plan_steps

Step = Callable[[Tensor, Any], tuple]
CacheCheck = Comparison  # the name this module's result had before there was one result type
DEFAULT_SCHEDULES = ("decode", "chunked")


def as_batch(tokens) -> Tensor:
    """Token ids as a (B, T) long tensor; a flat list or (T,) tensor is one row."""
    t = tokens if isinstance(tokens, Tensor) else torch.tensor(list(tokens))
    if t.dim() == 1:
        t = t.unsqueeze(0)
    if t.dim() != 2 or t.size(1) < 2:
        raise ValueError("tokens must be (batch, seq_len) with at least 2 tokens")
    return t.long()


def default_layer_names(n_hidden: int) -> list[str]:
    return [f"h{i}" for i in range(n_hidden)] + ["logits"]


def _probe_layers(step: Step, full: Optional[Callable], tokens: Tensor) -> int:
    """How many capture points (hidden states + logits) one call returns, from two tokens."""
    from .runner import unpack

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
    T = tokens.size(1)
    if options is None:
        options = ScheduleOptions(chunks=chunks, chunk_sizes=None if chunk_sizes is None else tuple(chunk_sizes))
    names = list(dict.fromkeys(schedules))
    if not names:
        raise ValueError("schedules is empty: name at least one of prefill, decode, chunked, speculative")
    for s in names:
        plan_steps(s, T, options)  # validates names and sizes up front
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
    """Our GPT (smearcli.model) as a `step`, with its KVCache and every captured hidden state."""
    def step(ids: Tensor, cache):
        if cache is None:
            cache = model.new_cache(ids.size(0), max_len or model.config.sequence_len)
        cap: list = []
        logits = model(ids.to(model.device), cache=cache, smear=logic, capture=cap)
        return logits, cap, cache
    return step
