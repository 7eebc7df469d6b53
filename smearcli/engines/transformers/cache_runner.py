"""A transformers causal LM driven through its own cache, as `smearcli scan` and `compare --impl
hf` drive it:

- `CacheRunner`: a transformers causal LM as a `Runner` that also runs the models the plain
  adapter refuses: a cache passed under `state=` (RWKV), a cache the caller must create
  (RecurrentGemma: `DynamicCache(config=...)` when the first call returns none); optional explicit
  `position_ids` / attention mask (to tell "positions restart" and "mask wrong" apart), and a float64 twin
  (`float64()`, MoE experts made eager) for `smearcli.judging.evidence`'s floor and confirmation.
- `CacheRunner(..., crop=True)` declares `CROP` and takes a rejected draft back through the
  cache's own API the way assisted generation calls it (`_assisted_decoding`): the cache made as
  `generate()` makes it (`generation_cache`), `activate_past_recording(...)` before the prefill
  with what the installed release's `generate` passes it (`api.recording`: nothing up to 5.24,
  `recurrent_states_to_keep=` the tokens drafted per verify step from 5.25 on), `crop(-rejected)`
  after a verify step and `crop(0)` after every other forward (it shrinks recorded conv and
  sliding-window states back). Their API missing (no `crop`, no `activate_past_recording`) or
  refusing in so many words (`frames.declared_limit`: a NotImplementedError, a ValueError "not
  supported") raises `CropRefused`: a result of the check. Any other exception from their `crop`
  is their crash and propagates as it is, with its frame in transformers. `record(cache)` holds
  several forwards for one crop (no `crop(0)` between them), as an assistant model's cache keeps
  its drafts until the next round crops them.
- `step_padded`: a cached step of a padded batch, the mask over every position so far and the
  positions counted over its real tokens, as `generate()` passes them to a chunked prefill and to
  each decode step (the padded boundaries in combination).
- `assisted_refusal(runner, tokens)`: why `generate()` itself would refuse assisted decoding for
  the model, as far as the installed release declares it (a model flagged `_is_stateful` where
  the release has that flag, no cache it can make, a cache whose `is_croppable` is False after the
  prefill, with the property's docstring), or None.
"""

from __future__ import annotations

import copy
import dataclasses
from typing import Optional, Sequence

import torch
from torch import Tensor

from ...util import frames
from ...util.defaults import DRAFT
from ...measure.precision import float64_model
from ...measure.runner import COPY, CROP, PADDED_STEPS, PADDING, RECORD, Described, Holder, Output, Runner
from ...measure.schedules import run_schedule
from ...measure.steps import RunResult
from . import api
from .api import out_cache


class CacheRunner(Runner):
    """A transformers causal LM behind `Runner`, through its own cache, under whichever keyword
    its forward takes (see the module docstring)."""

    label = "hf"
    series = "the model's own cache"
    capabilities = frozenset({COPY, PADDING})  # rolled-back drafts and padded batches

    def __init__(self, model, layers: Sequence[str] = ("logits",), name: str = "model",
                 positions: bool = False, mask: bool = False, crop: bool = False):
        self.model, self.layers, self.name = model, tuple(layers), name
        found = api.detect(model)  # the release's cache API, read from the model's forward
        if found is None:
            raise TypeError(api.no_cache_reason(model))
        self.keyword, self.cache_position = found.keyword, found.cache_position
        self.takes_positions, self.takes_mask = found.positions, found.mask
        # rolled-back drafts through their cache API, as assisted generation calls it (several
        # forwards held for one crop, as its assistant's cache); padded steps need the forward's mask
        self.capabilities = (type(self).capabilities | ({CROP, RECORD} if crop else set())
                             | ({PADDED_STEPS} if found.mask else set()))
        self.positions, self.mask = positions and self.takes_positions, mask and self.takes_mask
        self.dtype = next(model.parameters()).dtype
        self.device = next(model.parameters()).device
        self.pad_id: Optional[int] = None  # padded batches: the id padding holds (None: as given)
        self.pad_positions = True  # padded batches: explicit position_ids where the forward takes them
        self.caller_cache = False  # set when the model returned no cache and the caller made one
        self.drafted = DRAFT - 1  # tokens drafted per verify step, as generate counts them (the rest: the last accepted one)

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
        return Recorded() if self.can(CROP) else Holder()

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
        return self._step(tokens, cache, capture, {})

    def step_padded(self, tokens, attention_mask, cache: Holder, capture, prefill: bool = True):
        """One cached step of a padded batch (`PADDED_STEPS`): `attention_mask` (B, past + n) over
        every position so far, passed as `generate()` passes it (a decode step of a model whose
        `prepare_inputs_for_generation` drops the mask there, Mamba's, gets none: `decode_mask`);
        where the forward takes position ids (and `pad_positions`), they count the real tokens
        only, as `generate()` counts them. The tokens are fed as given."""
        n = tokens.size(1)
        mask = attention_mask.to(self.device)
        over: dict = {"attention_mask": mask if prefill or not cache.started else self.decode_mask(tokens, mask, cache)}
        if self.takes_positions and self.pad_positions:
            over["position_ids"] = (mask.cumsum(-1) - 1).clamp_min(0)[:, -n:]
        if over["attention_mask"] is None:
            del over["attention_mask"]
        return self._step(tokens, cache, capture, over)

    def decode_mask(self, tokens, mask, cache: Holder):
        """The mask `generate()` hands a decode step: what the model's own
        `prepare_inputs_for_generation` keeps of it after the first iteration (None where it drops
        it); the mask as given where that cannot be asked."""
        prepare = getattr(self.model, "prepare_inputs_for_generation", None)
        if not callable(prepare):
            return mask
        try:
            got = prepare(tokens.to(self.device), attention_mask=mask, use_cache=True, is_first_iteration=False,
                          **{self.keyword: cache.inner})
        except Exception:
            return mask
        return got.get("attention_mask", mask) if isinstance(got, dict) else mask

    def _step(self, tokens, cache: Holder, capture, over: dict):
        """One cached step; `over`: keywords that replace the plain step's (a padded step's mask
        and positions)."""
        if isinstance(cache, Recorded):
            self._as_generate(cache)
        B, n = tokens.shape
        kw = {**self._kw(cache, B, n), **over}
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
        if out.logits.dim() != 3 or tuple(out.logits.shape[:2]) != (B, n):
            raise ModelOutputError(self.model, f"a cached step over {n} token{'s' * (n != 1)} returned logits of "
                                               f"shape {tuple(out.logits.shape)}, not ({B}, {n}, vocab)")
        cache.inner, cache.started, cache.pos = got, True, cache.pos + n
        if isinstance(cache, Recorded):
            if not cache.recording:  # a cache the model made itself: recorded from the prefill on
                record(cache.inner, self.drafted)
                cache.recording = True
            # generate crops after every forward; `crop` or the next step does it, unless the
            # forwards are held for one crop (`record`)
            cache.due = not cache.holding
        return Output(out.logits, hs)

    def record(self, cache: Holder) -> None:
        """Hold every forward from now until the next `crop` (`RECORD`): no `crop(0)` between
        them, as an assistant's cache keeps its drafts until the next round crops them once."""
        if isinstance(cache, Recorded):
            cache.holding, cache.due = True, False

    def nonzero_pad(self, avoid: int, vocab: int) -> int:
        """The lowest id below `vocab`, other than `avoid`, whose row of the input embedding is not
        zero (the config's pad id often embeds to zero: `padding_idx`); the next id when the
        embedding cannot be read."""
        try:
            w = self.model.get_input_embeddings().weight[:vocab]
        except Exception:
            return super().nonzero_pad(avoid, vocab)
        live = [i for i in (w.detach().abs().amax(dim=-1) > 0).nonzero().flatten().tolist() if i != avoid]
        return live[0] if live else super().nonzero_pad(avoid, vocab)

    def _as_generate(self, cache: "Recorded") -> None:
        """What assisted generation does to the cache before this forward: before the prefill, the
        cache `generate()` makes, recording its past; after a forward nobody cropped (a draft
        accepted whole, the prefill), the `crop(0)` it calls after every verify step."""
        if not cache.started:
            made = generation_cache(self.model)
            if made is not None:
                record(made, self.drafted)
                cache.inner, cache.started, cache.recording = made, True, True
        elif cache.due:
            self._crop(cache.inner, 0)
            cache.due = False

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
        """The model's own `cache.crop`, back to `length` positions, by a negative count (the
        tokens to drop) as generate passes it. A crop their API refuses raises `CropRefused`."""
        self._crop(cache.inner, length - cache.pos)
        cache.pos = length
        if isinstance(cache, Recorded):
            cache.due = cache.holding = False

    @staticmethod
    def _crop(inner, count: int) -> None:
        """Their `crop(count)`: missing, or refusing in so many words, is `CropRefused`; any other
        exception is their crash and propagates unchanged."""
        if not callable(getattr(inner, "crop", None)):
            raise CropRefused(f"{type(inner).__name__} has no crop")
        if count == 0 and not api.generate_records():  # up to 5.13 crop(0) keeps 0 tokens, and
            return  # generate, cropping to the length it keeps, never asks for it
        try:
            inner.crop(count)
        except Exception as e:
            limit = frames.declared_limit(e, "transformers")
            if limit is None:
                raise
            raise CropRefused(f"{type(inner).__name__}.crop refused a count of {count}: {limit}") from e

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


class ModelOutputError(ValueError):
    """The model's forward returned what a causal LM does not (logits of no position for a cached
    step: CPM-Ant): the model's failure, named at the model's forward (`where`), not at the
    runner's line that noticed it."""

    def __init__(self, model, message: str):
        import inspect

        fn = inspect.unwrap(type(model).forward)
        try:
            at = f"{frames.short_path(inspect.getsourcefile(fn) or '?')}:{inspect.getsourcelines(fn)[1]}"
        except (OSError, TypeError):
            at = "?"
        self.where = f"{at} in {type(model).__name__}.forward"
        super().__init__(f"{type(model).__name__}.forward: {message}")


class CropRefused(RuntimeError):
    """The cache's own API (`crop`, `activate_past_recording`) refused or is missing: our call into
    their API, not the model's result."""


@dataclasses.dataclass
class Recorded(Holder):
    """A crop-mode runner's cache: whether its past is recorded, and whether the last forward still
    waits for the crop generate calls after each one."""

    recording: bool = False
    due: bool = False
    holding: bool = False  # forwards held for one crop (`CacheRunner.record`): no crop(0) between them


def generation_cache(model):
    """The cache `generate()` makes before the prefill (`_prepare_cache_for_generation`): a
    `DynamicCache` of the text config (beside a cross-attention one for an encoder-decoder), or
    None where it makes none (`_supports_default_dynamic_cache()` is False: RWKV, xLSTM, ...)."""
    from transformers import DynamicCache, EncoderDecoderCache

    supports = getattr(model, "_supports_default_dynamic_cache", None)
    if supports is None or not supports():
        return None
    cfg = model.config.get_text_config(decoder=True)
    if getattr(model.config, "is_encoder_decoder", False):
        return EncoderDecoderCache(DynamicCache(config=cfg), DynamicCache(config=cfg))
    return DynamicCache(config=cfg)


def record(inner, drafted: int) -> None:
    """`activate_past_recording(...)`, as assisted generation calls it before the prefill, with
    what the release's `generate` passes (`api.recording`): layers that keep a fixed window (conv
    taps, sliding windows) keep their past until the next `crop`, and from 5.25 on, layers with a
    recurrent state keep the last `drafted` of them. Missing or refusing in so many words:
    `CropRefused`; any other exception is their crash and propagates."""
    if not api.generate_records():  # up to 5.13: generate records nothing, so neither does this
        return
    activate = getattr(inner, "activate_past_recording", None)
    if not callable(activate):
        raise CropRefused(f"{type(inner).__name__} has no activate_past_recording")
    kw = api.recording(inner, drafted)
    try:
        activate(**kw)
    except Exception as e:
        limit = frames.declared_limit(e, "transformers")
        if limit is None:
            raise
        args = ", ".join(f"{k}={v}" for k, v in kw.items())
        raise CropRefused(f"{type(inner).__name__}.activate_past_recording({args}) refused: {limit}") from e


def assisted_refusal(runner: CacheRunner, tokens: Tensor) -> Optional[str]:
    """Why `generate()` refuses assisted decoding for the model, as the installed release declares
    it, in the order it checks: a model flagged `_is_stateful` (the flag exists up to 5.24; 5.25
    has none), no cache made for it, a cache with no recording API, a cache whose `is_croppable` is
    False after the prefill (quoted with the property's docstring); None when it declares nothing.
    A prefill that raises on that cache is no refusal (the crop run reports it as a crash)."""
    model, why = runner.model, []
    if getattr(model, "_is_stateful", False):
        why.append(f"{type(model).__name__}._is_stateful (\"not supported with stateful models\")")
    if generation_cache(model) is None:
        why.append("generate makes no cache for it (\"Assisted decoding requires a cache\")")
    probe = CacheRunner(model, crop=True)
    held = probe.new_cache(tokens.size(0), tokens.size(1))
    try:
        with torch.inference_mode():
            probe.step(tokens[:, :2], held, False)
    except CropRefused as e:  # generate calls activate_past_recording() on whatever cache it has
        why.append(f"its cache has no recording API ({e})")
    except Exception:
        pass  # their crash, not their declaration: the crop run meets it again and reports it
    else:
        if getattr(held.inner, "is_croppable", True) is False:
            why.append(f"its {type(held.inner).__name__}.is_croppable is False after the prefill"
                       f"{uncroppable(held.inner)}")
    return "; ".join(why) or None


def chunked_prefill_refusal(model) -> Optional[str]:
    """Why `generate(prefill_chunk_size=...)` refuses a chunked prefill for the model, in its own
    words: a ValueError or NotImplementedError raised in transformers' code on a tiny prompt (a
    cache of linear-attention layers only: "`get_seq_length` can only be called on Attention
    layers, ..."); None where it runs, or fails in another way (that is no declaration)."""
    vocab = int(getattr(model.config.get_text_config(), "vocab_size", 8) or 8)
    ids = torch.arange(1, 7, device=next(model.parameters()).device).unsqueeze(0) % max(vocab, 2)
    try:
        with torch.inference_mode():
            model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=1, do_sample=False,
                           prefill_chunk_size=2, pad_token_id=0)
    except (ValueError, NotImplementedError) as e:
        if frames.raised_in(e, "transformers", through=()) is not None:
            return f"{type(e).__name__}: {(str(e).strip().splitlines() or [''])[0]}"
    except Exception:
        return None
    return None


def crop_site(runner: CacheRunner, tokens: Tensor) -> Optional[str]:
    """"transformers/cache_utils.py:1178 in LinearAttentionCacheLayerMixin.crop": the code their
    crop runs for the layers that declare themselves uncroppable after a prefill on the cache
    generate makes (the cache's own `crop` where none does), by the class that defines it; None
    when the prefill raises or the source cannot be found. One API's code, shared by every
    architecture whose cache holds such a layer."""
    import inspect

    probe = CacheRunner(runner.model, crop=True)
    held = probe.new_cache(tokens.size(0), tokens.size(1))
    try:
        with torch.inference_mode():
            probe.step(tokens[:, :2], held, False)
    except Exception:
        return None
    stuck = [l for l in getattr(held.inner, "layers", None) or [] if getattr(l, "is_croppable", True) is False]
    target = type(stuck[0]) if stuck else type(held.inner)
    owner = next((k for k in target.__mro__ if "crop" in vars(k)), None)
    if owner is None:
        return None
    try:
        fn = inspect.unwrap(vars(owner)["crop"])
        line = inspect.getsourcelines(fn)[1]
        path = frames.short_path(inspect.getsourcefile(fn) or "?")
    except (OSError, TypeError):
        return None
    return f"{path}:{line} in {owner.__qualname__}.crop"


def uncroppable(cache) -> str:
    """" (LinearAttentionLayer: a recurrent state; "Whether `crop` can put ...")": the layers whose
    `is_croppable` is False, whether one holds a recurrent state (which a crop leaves as the draft
    left it), and the docstring of their `is_croppable`, where it has one (the declaration)."""
    stuck = [l for l in getattr(cache, "layers", None) or [] if getattr(l, "is_croppable", True) is False]
    if not stuck:
        return ""
    names = ", ".join(sorted({type(l).__name__ for l in stuck}))
    recurrent = any(any((getattr(l, "is_recurrent_states_initialized", None) or {}).values()) for l in stuck)
    doc = croppable_doc(stuck[0])
    return f" ({names}{': a recurrent state' if recurrent else ''}{f'; {doc}' if doc else ''})"


def croppable_doc(layer) -> Optional[str]:
    """The docstring of the layer class's `is_croppable` property, on one line and quoted, or None
    (a plain class attribute has none)."""
    import inspect

    prop = inspect.getattr_static(type(layer), "is_croppable", None)
    doc = inspect.getdoc(prop) if isinstance(prop, property) else None
    return f'"{" ".join(doc.split())}"' if doc else None


def full_run(runner: Runner, tokens: Tensor, capture: bool = False, schedule: str = "full") -> RunResult:
    """The runner's full pass (the `full` schedule), named `schedule`."""
    return dataclasses.replace(run_schedule(runner, tokens, "full", capture=capture), schedule=schedule)
