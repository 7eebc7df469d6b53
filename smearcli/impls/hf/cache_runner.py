"""A transformers causal LM driven through its own cache, as `smearcli scan` and `compare --impl
hf` drive it:

- `CacheRunner`: a transformers causal LM as a `Runner` that also runs the models the plain
  adapter refuses: a cache passed under `state=` (RWKV), a cache the caller must create
  (RecurrentGemma: `DynamicCache(config=...)` when the first call returns none); optional explicit
  `position_ids` / attention mask (to tell "positions restart" and "mask wrong" apart), and a float64 twin
  (`float64()`, MoE experts made eager) for `smearcli.evidence`'s floor and confirmation.
- `croppable(runner, tokens)`: whether the model's cache can be cropped back after a rejected
  draft (a `crop`, attention keys and values only); `CacheRunner(..., crop=True)` then declares
  `CROP` and crops with it (a crop their API refuses raises `CropRefused`).
"""

from __future__ import annotations

import copy
import dataclasses
from typing import Optional, Sequence

import torch
from torch import Tensor

from ...state import KV, state_kinds
from ...precision import float64_model
from ...runner import COPY, CROP, PADDING, Described, Holder, Output, Runner
from ...schedules import RunResult, run_schedule
from . import api
from .api import KEYWORDS, cache_keyword, out_cache  # noqa: F401 - the one detector, re-exported


class CacheRunner(Runner):
    """A transformers causal LM behind `Runner`, through its own cache, under whichever keyword
    its forward takes (see the module docstring)."""

    label = "hf"
    series = "the model's own cache"
    capabilities = frozenset({COPY, PADDING})  # rolled-back drafts and padded batches

    def __init__(self, model, layers: Sequence[str] = ("logits",), name: str = "model",
                 positions: bool = False, mask: bool = False, crop: bool = False):
        self.model, self.layers, self.name = model, tuple(layers), name
        if crop:  # the caller found the cache croppable (`croppable`): rolled-back drafts crop it
            self.capabilities = type(self).capabilities | {CROP}
        found = api.detect(model)  # the release's cache API, read from the model's forward
        if found is None:
            raise TypeError(api.no_cache_reason(model))
        self.keyword, self.cache_position = found.keyword, found.cache_position
        self.takes_positions, self.takes_mask = found.positions, found.mask
        self.positions, self.mask = positions and self.takes_positions, mask and self.takes_mask
        self.dtype = next(model.parameters()).dtype
        self.device = next(model.parameters()).device
        self.pad_id: Optional[int] = None  # padded batches: the id padding holds (None: as given)
        self.pad_positions = True  # padded batches: explicit position_ids where the forward takes them
        self.caller_cache = False  # set when the model returned no cache and the caller made one

    def notes(self) -> list[str]:
        out = [f"cache passed back as {self.keyword}="]
        if self.caller_cache:
            out.append("the model returned no cache: the caller creates DynamicCache(config=...)")
        if self.positions:
            out.append("explicit position_ids")
        if self.mask:
            out.append("explicit attention_mask")
        return out

    def describe(self) -> Described:
        return Described(self.label, self.series, self.name, type(self.model).__name__,
                         str(self.dtype).removeprefix("torch."), str(self.device), None, None,
                         tuple(self.notes()[1:]))

    def _call(self, tokens, capture, **kw):
        out = self.model(input_ids=tokens.to(self.device), output_hidden_states=capture, return_dict=True, **kw)
        hs = getattr(out, "hidden_states", None)
        if not (capture and hs):
            return out, None
        hs = list(hs)
        T = tokens.size(1)
        if not all(isinstance(h, Tensor) and h.dim() == 3 and h.size(1) == T for h in hs):
            return out, None  # not one (B, T, C) tensor per layer: compare the logits alone
        return out, hs

    def forward(self, tokens, capture):
        out, hs = self._call(tokens, capture, use_cache=False)
        return Output(out.logits, hs)

    def new_cache(self, batch, max_len):
        return Holder()

    def _kw(self, cache: Holder, B: int, n: int) -> dict:
        kw: dict = {"use_cache": True}
        if cache.started:
            kw[self.keyword] = cache.inner
        pos = torch.arange(cache.pos, cache.pos + n, device=self.device)
        if self.positions:
            kw["position_ids"] = pos.unsqueeze(0).expand(B, -1)
        if self.mask:
            kw["attention_mask"] = torch.ones(B, cache.pos + n, dtype=torch.long, device=self.device)
        if self.cache_position:  # `api.passes_cache_position`: Mamba-style forwards of 5.0
            kw["cache_position"] = pos
        return kw

    def make_cache(self):
        return api.caller_cache(self.model)

    def step(self, tokens, cache: Holder, capture):
        B, n = tokens.shape
        kw = self._kw(cache, B, n)
        out, hs = self._call(tokens, capture, **kw)
        got = out_cache(out)
        if got is None and not cache.started:  # the caller must create the cache (RecurrentGemma)
            made = self.make_cache()
            kw[self.keyword] = made
            out, hs = self._call(tokens, capture, **kw)
            got = out_cache(out) or made
            self.caller_cache = True
        elif got is None:
            got = cache.inner  # updated in place
        cache.inner, cache.started, cache.pos = got, True, cache.pos + n
        return Output(out.logits, hs)

    def float64(self) -> "CacheRunner":
        """This runner (its settings: crop, padding) on the model's float64 copy
        (`precision.float64_model`: made once per model, shared by every runner of it)."""
        m64 = float64_model(self.model)
        twin = type(self).__new__(type(self))
        twin.__dict__.update(self.__dict__)
        twin.model, twin.dtype = m64, torch.float64
        return twin

    def copy(self, cache: Holder) -> Holder:
        """A deep copy of the model's own cache object (rolled-back drafts restore it)."""
        return Holder(copy.deepcopy(cache.inner), cache.started, cache.pos)

    def crop(self, cache: Holder, length: int) -> None:
        """The model's own `cache.crop`, back to `length` positions (transformers 5.24 crops by a
        negative count: the tokens to drop). A crop their API refuses raises `CropRefused`."""
        try:
            if cache.pos > length:
                cache.inner.crop(length - cache.pos)
        except Exception as e:
            raise CropRefused(f"{type(cache.inner).__name__}.crop refused: {type(e).__name__}: "
                              f"{(str(e).splitlines() or [''])[0][:160]}") from e
        cache.pos = length

    def forward_padded(self, tokens, attention_mask, capture):
        """One cached prefill of a padded batch with its attention mask; where the forward takes
        position ids (and `pad_positions`), they count the real tokens only (as `generate()`
        passes them); with `pad_id`, padding holds that id."""
        kw: dict = dict(attention_mask=attention_mask.to(self.device), use_cache=True)
        if self.pad_id is not None:  # the model's own pad token (it may number positions by it)
            tokens = tokens.masked_fill(attention_mask.to(tokens.device) == 0, self.pad_id)
        if self.takes_positions and self.pad_positions:
            kw["position_ids"] = (attention_mask.cumsum(-1) - 1).clamp_min(0).to(self.device)
        out, hs = self._call(tokens, capture, **kw)
        return Output(out.logits, hs)


class CropRefused(RuntimeError):
    """The cache's own `crop` raised: our call into their API, not the model's result."""


def croppable(runner: CacheRunner, tokens: Tensor) -> Optional[str]:
    """None when the model's cache can be cropped back (it has `crop` and carries attention keys
    and values only: a crop cannot roll back a recurrent or conv state); else why not."""
    probe = runner.new_cache(tokens.size(0), tokens.size(1))
    with torch.inference_mode():
        runner.step(tokens[:, :2], probe, False)
    if not hasattr(probe.inner, "crop"):
        return f"{type(probe.inner).__name__} has no crop"
    other = [k for k in state_kinds(probe.inner) if k != KV]
    if other:
        return f"{type(probe.inner).__name__} carries {' and '.join(other)} state, which a crop cannot roll back"
    return None


def full_run(runner: Runner, tokens: Tensor, capture: bool = False, schedule: str = "full") -> RunResult:
    """The runner's full pass (the `full` schedule), named `schedule`."""
    return dataclasses.replace(run_schedule(runner, tokens, "full", capture=capture), schedule=schedule)
