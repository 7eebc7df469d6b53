"""The one interface every implementation meets: a `Runner`.

`smearcli.measure.schedules` feeds tokens to a runner, `smearcli.measure.compare` measures what it returns, and
the renderers draw the result; none of them knows whose code ran. A runner is one series of a
comparison: our GPT under one smear logic, a user's nanochat checkout, a Hugging Face model, or
anything else that can run a forward pass without a cache and one cached step.

```python
class Toy(Runner):
    label = "toy"
    layers = ("logits",)
    def forward(self, tokens, capture):            # (B, T) -> logits (B, T, V), no hiddens
        return Output(self.net(tokens), None)
    def new_cache(self, batch, max_len):
        return {"pos": 0}
    def step(self, tokens, cache, capture):        # the cache advances in place
        ...
```

What a runner is (`describe()`), stored on every result, so nothing reads a live model after a
run. Optional capabilities are declared in `capabilities`, never probed:

- `EXPAND`: `expand(cache, rows, max_len)` copies a one-row cache into `rows` rows (the engine
  schedule);
- `CROP`: `crop(cache, length)` drops every position from `length` on (rolled-back drafts);
- `COPY`: `copy(cache)` an independent copy (rolled-back drafts restore one where a cache cannot
  be cropped);
- `SMEAR_TERMS`: `smear_terms(tokens)` gives (pre-smear embedding, gate, scale) for the analytic
  check at chunk starts;
- `DOCUMENT_MASK`: `forward_documents(tokens, lengths, capture)`, the forward pass of a packed row
  whose attention stays inside each document (the packed schedule's split of a leak); a runner
  that finds, while running, that it could not keep attention inside the documents raises
  `NoDocumentMask` with the reason (the split is then reported as not measured, never as zero);
- `PADDING`: `forward_padded(tokens, attention_mask, capture)`, one cached prefill of a padded
  batch, positions counted over the mask's real tokens (the padded schedule).
- `PADDED_STEPS`: `step_padded(tokens, attention_mask, cache, capture)`, one cached step of a
  padded batch: `attention_mask` (B, past + n) covers every position fed so far, positions are
  counted over its real tokens, and the tokens are fed as given (the schedules in combination,
  `boundaries.padded_chunked` and `padded_decode`, choose the pad ids themselves).
- `RECORD`: `record(cache)`, from now until the next `crop`, lets the cache keep every forward
  uncropped, as an assistant model's cache keeps its drafts before the one crop of the next round
  (a `CROP` runner that crops after every forward by itself, as generate's verify loop does,
  declares it; `boundaries.rollback_window`).
- `PREFIX_CACHE`: the runner's own `run()` does the prefix schedule (a second request reading the
  blocks a first one cached), as only an engine with a prefix cache can.
- `BOS_DOCUMENTS`: the model starts a document at its BOS token, as nanochat's BOS-aligned loader
  packs rows (the packed schedule feeds each document alone against the packed row).

`schedules.runnable(runner, name)` reads these (on a runner or on its class) and nothing else:
an engine whose `run()` does whole schedules itself names them in `runs_itself`.

`LogProbs(runner)` is a runner's log-probabilities (log_softmax of its logits) and no hidden
states: the form an engine that returns log-probabilities is compared in.

An engine that chunks by itself (and may return log-probabilities and no hidden states) overrides
`run(schedule, tokens, options)` instead of `step`: the schedules call it first and fall back to
their own step plan when it returns None. `one_token_step` is a key: runners with the same non-None
key run the same computation for a one-token cached step, so `compare` runs decode once for them.
`thread_safe = True` says two runs on different caches may go on at once from two threads: the
CLI's `compare` then runs decode (the longest run) beside the other runs (`runplan.run_planned`).
`fresh_outputs = True` says every tensor a call returns is new, and nothing (the runner, its cache,
a later call) writes into it afterwards: `owned.Owned` then receives float32 outputs as they are,
where it copies any other runner's (a copy of a d12 full pass's logits is 256 MB).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Hashable, NamedTuple, Optional

EXPAND = "expand"
CROP = "crop"
SMEAR_TERMS = "smear_terms"
COPY = "copy"
DOCUMENT_MASK = "document_mask"
PADDING = "padding"
PREFIX_CACHE = "prefix_cache"
PADDED_STEPS = "padded_steps"
RECORD = "record"
BOS_DOCUMENTS = "bos_documents"


class NoDocumentMask(Exception):
    """`forward_documents` could not keep attention inside each document; the message says why
    (one phrase: "its attention does not go through ...")."""


class Output(NamedTuple):
    """What one call returns: logits (B, T, V) and, when captured, one (B, T, C) tensor per capture
    point before the logits (lowest first), or None."""
    logits: Any
    hiddens: Optional[list]


@dataclass(frozen=True)
class Described:
    """What ran, as a result stores it: enough for a title, a legend and a JSON document."""
    label: str  # the series name in tables, JSON ("logic") and figures: old, fixed, yours, hf, ...
    series: str  # the legend's words for it: "old logic (upstream)"
    name: str = "model"  # the model: "tiny@500", a directory, a built-in config's name
    shape: str = ""  # "d4 n_embd 256", "LlamaForCausalLM"
    dtype: str = "float32"
    device: str = "cpu"
    config: Optional[dict] = None  # the model's configuration, for JSON documents
    smear_lambda: Optional[float] = None  # None: no smear to speak of; 0.0: a smear that is off
    notes: tuple[str, ...] = ()  # what ran, one sentence each (cache keyword, attention, ...)


class Runner:
    """Base class of every implementation (see the module docstring for the contract)."""

    label: str = "model"
    series: str = ""
    layers: tuple[str, ...] = ("logits",)  # capture-point names, "logits" last
    capabilities: frozenset = frozenset()
    # an engine that runs whole schedules by itself (`run()`): the ones it runs; None: it is driven
    # step by step, and its capabilities alone decide
    runs_itself: Optional[frozenset] = None
    one_token_step: Optional[Hashable] = None
    name: str = "model"
    dtype: Any = None  # torch.dtype of the computation (its one ulp bounds the noise floor)
    device: Any = "cpu"
    # True: two runs on different caches may go on at once, from two threads (`compare`'s
    # `overlap`); only a runner whose forward keeps no state of its own between calls may say so
    thread_safe: bool = False
    # True: every output tensor is allocated anew by the call and written by nothing after it (`owned`)
    fresh_outputs: bool = False
    # the positions a sliding-window (or chunked-attention) layer sees, where the model has one:
    # the rollback in combination sizes its prompt so the drafts cross it (None: no window)
    window: Optional[int] = None
    # the id padding holds, where the model has its own pad token (None: the schedule's own)
    pad_id: Optional[int] = None

    def describe(self) -> Described:
        return Described(self.label, self.series or self.label, self.name, "",
                         "" if self.dtype is None else str(self.dtype).removeprefix("torch."), str(self.device))

    def can(self, capability: str) -> bool:
        return capability in self.capabilities

    # -- what every runner implements ------------------------------------------------------------
    def forward(self, tokens, capture: bool) -> Output:
        """One call over all of `tokens` (B, T), without a cache: the reference."""
        raise NotImplementedError

    def new_cache(self, batch: int, max_len: int):
        raise NotImplementedError

    def step(self, tokens, cache, capture: bool) -> Output:
        """One cached step over `tokens` (B, n) at the cache's position; the cache advances."""
        raise NotImplementedError

    # -- optional: declared in `capabilities` ----------------------------------------------------
    def expand(self, cache, rows: int, max_len: int):
        raise NotImplementedError(f"{self.label}: cannot copy a cache into more rows")

    def crop(self, cache, length: int) -> None:
        raise NotImplementedError(f"{self.label}: cannot crop a cache")

    def copy(self, cache):
        raise NotImplementedError(f"{self.label}: cannot copy a cache")

    def smear_terms(self, tokens):
        return None

    def forward_documents(self, tokens, lengths, capture: bool) -> Output:
        raise NotImplementedError(f"{self.label}: cannot mask attention to documents")

    def forward_padded(self, tokens, attention_mask, capture: bool) -> Output:
        raise NotImplementedError(f"{self.label}: cannot run a padded batch")

    def step_padded(self, tokens, attention_mask, cache, capture: bool, prefill: bool = True) -> Output:
        raise NotImplementedError(f"{self.label}: cannot run a padded batch step by step")

    def record(self, cache) -> None:
        raise NotImplementedError(f"{self.label}: cannot hold several forwards for one crop")

    def nonzero_pad(self, avoid: int, vocab: int) -> int:
        """An id for padding other than `avoid`, whose input embedding is not zero where the runner
        can read its embeddings (pads that embed to zero hide a state that takes them in); here, not
        knowing the embeddings, the next id below `vocab`."""
        return (avoid + 1) % max(vocab, 2)

    def run(self, schedule: str, tokens, options) -> Optional[Any]:
        """A whole run of `schedule` done by the implementation itself (a `schedules.RunResult`),
        or None to be driven step by step."""
        return None

    def float64(self) -> Optional["Runner"]:
        """The same computation on the same weights in float64, or None when the implementation
        has no such form. `smearcli.judging.evidence` measures the noise floor against its full pass and
        reruns a departure on it (under `precision.lifted()`) before calling it a bug."""
        return None


class ModelRunner(Runner):
    """A runner over one torch model it holds as `self.model`, whose dtype and device are the run's."""

    model: Any

    @property
    def dtype(self):
        return self.model.dtype

    @property
    def device(self):
        return self.model.device


@dataclass
class StepRunner(Runner):
    """A runner around one callable `step(ids, cache) -> (logits, cache)` or `(logits,
    hidden_states, cache)`, where `cache` is None on a run's first call (`smearcli.testing`).
    `full(ids) -> logits | (logits, hidden_states)`, if given, is the reference instead of one
    cached call over every token."""
    fn: Any = None
    full: Any = None
    label: str = "model"
    layers: tuple = ("logits",)
    dtype: Any = None
    device: Any = "cpu"
    name: str = "model"
    notes: tuple = field(default_factory=tuple)

    def describe(self) -> Described:
        d = super().describe()
        return Described(d.label, d.series, d.name, d.shape, d.dtype, d.device, notes=tuple(self.notes))

    def float64(self):
        """The same callables with every torch module they reach (`precision.modules_in`) switched
        to float64 for the duration of each call, and back to the very tensors it had after it."""
        from .precision import modules_in

        mods = modules_in(self.fn) + modules_in(self.full)
        if not mods:
            return None
        return Float64Calls(self, mods)

    def forward(self, tokens, capture):
        if self.full is None:
            out = self.step(tokens, self.new_cache(tokens.size(0), tokens.size(1)), capture)
            return out
        return unpack(self.full(tokens), cached=False)[0]

    def new_cache(self, batch, max_len):
        return Holder()

    def step(self, tokens, cache, capture):
        out, inner = unpack(self.fn(tokens, cache.inner if cache.started else None), cached=True)
        cache.inner, cache.started = inner, True
        return out


class Float64Calls(Runner):
    """A `StepRunner` whose calls run with its modules in float64 (`StepRunner.float64`)."""

    def __init__(self, inner: StepRunner, modules):
        self.inner, self.modules = inner, modules
        self.label, self.layers, self.name = inner.label, inner.layers, inner.name
        import torch

        self.dtype, self.device = torch.float64, inner.device

    def _call(self, method, *args):
        from .precision import in_float64

        with in_float64(self.modules):
            return method(*args)

    def forward(self, tokens, capture):
        return self._call(self.inner.forward, tokens, capture)

    def new_cache(self, batch, max_len):
        return self.inner.new_cache(batch, max_len)

    def step(self, tokens, cache, capture):
        return self._call(self.inner.step, tokens, cache, capture)


class LogProbs(Runner):
    """`inner`'s log-probabilities (log_softmax over the vocabulary, in float32) on every call,
    and no hidden states: compares a runner with an engine that returns only log-probabilities."""

    layers = ("logits",)

    def __init__(self, inner: Runner):
        self.inner = inner
        self.label, self.series, self.name = inner.label, inner.series, inner.name
        self.dtype, self.device = inner.dtype, inner.device

    def describe(self) -> Described:
        d = self.inner.describe()
        return Described(d.label, d.series, d.name, d.shape, d.dtype, d.device, d.config, d.smear_lambda,
                         d.notes + ("compared as log-probabilities (log_softmax of the logits)",))

    @staticmethod
    def _lp(out: Output) -> Output:
        return Output(out.logits.float().log_softmax(dim=-1), None)

    def forward(self, tokens, capture):
        return self._lp(self.inner.forward(tokens, False))

    def new_cache(self, batch, max_len):
        return self.inner.new_cache(batch, max_len)

    def step(self, tokens, cache, capture):
        return self._lp(self.inner.step(tokens, cache, False))

    def float64(self):
        twin = self.inner.float64()
        return None if twin is None else LogProbs(twin)


@dataclass
class Holder:
    """A cache whose implementation returns a new object each step: the latest one."""
    inner: Any = None
    started: bool = False
    pos: int = 0


def unpack(out, cached: bool) -> tuple[Output, Any]:
    """(Output, cache) from what a step or full callable returned; TypeError when it is neither
    `(logits, cache)` nor `(logits, hidden_states, cache)` (a full call: logits or `(logits,
    hidden_states)`)."""
    from torch import Tensor

    cache = None
    if cached:
        if not isinstance(out, (tuple, list)) or len(out) not in (2, 3):
            raise TypeError("a step must return (logits, cache) or (logits, hidden_states, cache)")
        *out, cache = out
        out = out[0] if len(out) == 1 else tuple(out)
    logits, hiddens = (out, None) if isinstance(out, Tensor) else (tuple(out) + (None,))[:2]
    if not isinstance(logits, Tensor) or logits.dim() != 3:
        raise TypeError("a step's logits must be a (batch, tokens, vocab) tensor")
    if hiddens is not None:
        hiddens = list(hiddens)
        for h in hiddens:
            if not isinstance(h, Tensor) or h.dim() != 3:
                raise TypeError("a step's hidden states must be (batch, tokens, channels) tensors")
    return Output(logits, hiddens), cache
