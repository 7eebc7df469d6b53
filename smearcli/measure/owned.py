"""What a runner returns, received once and owned by the comparison: the one seam every schedule
runs a runner through (`schedules.run_schedule` and `schedules.run_steps` wrap it in `Owned`).

An implementation may hand back a view of a buffer it writes again on its next call (an engine's
reused output tensor, a fork whose forward returns slices of one preallocated array): a schedule
that kept that view would measure logits the next call overwrote, and a buggy cache could read as
consistent. So every output (`Output` of `forward`, `step`, `forward_documents`,
`forward_padded`; a whole `RunResult` of `run`) is copied into float32 tensors of the comparison's
own as soon as it is received, before the runner is called again: the values every schedule
measured already (each converted it to float32), bit for bit, now in storage no runner holds.
A runner that declares `fresh_outputs` (each call allocates its outputs anew and nothing writes
them afterwards, as our GPT's do) is believed: its float32 outputs are received as they are.

The same place checks that what came back can be measured at all, and says so in the caller's
terms: logits that are a (batch, tokens, vocab) floating-point tensor for the ids given, a
vocabulary that is not empty and keeps the width of the run's first call, hidden states of one
shape per capture point. A runner that breaks this raises `BadOutput` (a `ValueError`, and, through
the CLI, the runner's failure with exit status 1) naming the call, the shape expected and the shape
returned, never an error from deep inside a schedule or a metric.
"""

from __future__ import annotations

from typing import Any, Optional

import torch
from torch import Tensor

from ..util.errors import UserCodeError
from .runner import Output


class BadOutput(UserCodeError, ValueError):
    """A runner returned what no comparison can measure: the message names the call, the shape
    expected and the shape returned. A ValueError for the library's callers; the CLI reports it as
    the implementation's failure (exit status 1), not as smearcli's."""


def _shape(t) -> str:
    return str(tuple(t.shape)) if isinstance(t, Tensor) else f"a {type(t).__name__}"


def _own(t: Tensor, fresh: bool = False) -> Tensor:
    """A float32 copy of `t` in storage of its own (float32 is what every RunResult holds); `t`
    itself when it is float32 and `fresh` (nothing writes it after the call)."""
    return t.to(torch.float32, copy=not fresh)


class Owned:
    """`runner` as a schedule drives it, every output checked and copied as it is received.
    Anything else (its label, capabilities, caches) is the runner's own."""

    def __init__(self, runner, schedule: str = "run"):
        self.inner, self.schedule = runner, schedule
        self.fresh = bool(getattr(runner, "fresh_outputs", False))
        self.calls = 0
        self.vocab: Optional[tuple] = None  # (width, the call that set it)
        self.widths: Optional[list[int]] = None  # the channels of each capture point, from the first call with them

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    # -- the calls whose outputs are received here ---------------------------------------------------
    def forward(self, tokens, capture):
        return self._received(self.inner.forward(tokens, capture), tokens, "its forward pass without a cache")

    def step(self, tokens, cache, capture, keep: bool = True):
        """`keep=False`: checked, not copied, for a caller that copies the output into buffers of its
        own before its next call (the step loop, `schedules`): one copy, not two."""
        return self._received(self.inner.step(tokens, cache, capture), tokens, "a cached step", keep)

    def forward_documents(self, tokens, lengths, capture):
        return self._received(self.inner.forward_documents(tokens, lengths, capture), tokens,
                              "its forward pass masked to documents")

    def forward_padded(self, tokens, attention_mask, capture):
        return self._received(self.inner.forward_padded(tokens, attention_mask, capture), tokens,
                              "its padded batch")

    def run(self, schedule, tokens, options):
        whole = self.inner.run(schedule, tokens, options)
        if whole is None or whole.outcome is not None:  # driven step by step, or nothing measured
            return whole
        import dataclasses

        self.calls += 1
        what = f"its own run of the {schedule} schedule"
        # an engine may return more rows than it was given (samples): any count of rows, then T
        rows = whole.logits.size(0) if isinstance(whole.logits, Tensor) and whole.logits.dim() == 3 else "rows"
        self._check(whole.logits, whole.hiddens, (rows, tokens.size(1)), what)
        return dataclasses.replace(whole, logits=_own(whole.logits, self.fresh),
                                   hiddens=None if whole.hiddens is None else [_own(h, self.fresh) for h in whole.hiddens])

    # -- receiving -------------------------------------------------------------------------------
    def _received(self, out, tokens: Tensor, what: str, keep: bool = True) -> Output:
        self.calls += 1
        n = tokens.size(1)
        what = f"{what} over {n} token{'s' * (n != 1)} (call {self.calls} of the {self.schedule} run)"
        if not isinstance(out, Output) and not (isinstance(out, tuple) and len(out) == 2):
            raise BadOutput(f"{self._label()}: {what} returned {_shape(out)}, not an Output(logits, hiddens)")
        logits, hiddens = out
        if hiddens is not None and not isinstance(hiddens, (list, tuple)):
            raise BadOutput(f"{self._label()}: {what} returned hidden states as {_shape(hiddens)}, not a list "
                            "of (batch, tokens, channels) tensors")
        self._check(logits, hiddens, tuple(tokens.shape), what)
        if not keep:
            return Output(logits, None if hiddens is None else list(hiddens))
        return Output(_own(logits, self.fresh), None if hiddens is None else [_own(h, self.fresh) for h in hiddens])

    def _label(self) -> str:
        return str(getattr(self.inner, "label", "runner"))

    def _check(self, logits, hiddens, rows_tokens: tuple, what: str) -> None:
        """BadOutput unless `logits` are (rows, tokens, V) floating point with the run's V > 0 and
        each hidden state (rows, tokens, C) with the run's C for its capture point."""
        who = f"{self._label()}: {what}"
        width = None if self.vocab is None else self.vocab[0]
        expected = rows_tokens + ((width,) if width is not None else ("vocab",))
        shown = "(" + ", ".join(str(x) for x in expected) + ")"
        if not isinstance(logits, Tensor) or logits.dim() != 3 or tuple(logits.shape[:2]) != rows_tokens:
            raise BadOutput(f"{who} returned logits of shape {_shape(logits)}; expected {shown}")
        if not logits.is_floating_point():
            raise BadOutput(f"{who} returned {str(logits.dtype).removeprefix('torch.')} logits of shape "
                            f"{_shape(logits)}; expected floating point {shown}")
        V = logits.size(2)
        if V == 0:
            raise BadOutput(f"{who} returned logits of shape {_shape(logits)}, an empty vocabulary; expected "
                            f"{shown}")
        if width is None:
            self.vocab = (V, self.calls)
        elif V != width:
            raise BadOutput(f"{who} returned logits of shape {_shape(logits)}; expected {shown}: the "
                            f"vocabulary of {width} that its call {self.vocab[1]} returned")
        if not hiddens:  # none captured (a run with one such call has none)
            return
        got = []
        for i, h in enumerate(hiddens):
            if not isinstance(h, Tensor) or h.dim() != 3 or tuple(h.shape[:2]) != rows_tokens \
                    or not h.is_floating_point():
                raise BadOutput(f"{who} returned hidden state {i} as {_shape(h)}; expected floating point "
                                f"({', '.join(map(str, rows_tokens))}, channels)")
            got.append(h.size(2))
        if self.widths is None:
            self.widths = got
        elif got != self.widths:
            raise BadOutput(f"{who} returned hidden states of widths {got}; its earlier calls in this run "
                            f"returned {self.widths}")
