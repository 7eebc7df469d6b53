"""The cache API of the installed transformers release, detected from the model, never assumed.

Releases from 5.0 on differ in how a causal LM takes its cache back, and smearcli supports every
one of them by asking the model, not the version number:

- the keyword (`cache_keyword`): `past_key_values` for attention models and `cache_params` for
  Mamba-style ones up to 5.x, one `cache` for every model in 5.24, `state` for RWKV in all of them.
  `KEYWORDS` is the one list, newest first; a model whose forward takes none of them keeps no
  cache we can pass (RecurrentGemma before the `cache` keyword holds its state inside the model);
- `cache_position` (`passes_cache_position`): the Mamba-style `cache_params` forwards of 5.0 need
  it on every cached step (they raise without it); attention models count positions from their
  cache, so it is never passed there;
- the cache a model returns (`out_cache`): the output field named like the keyword;
- the cache the caller makes when the first call returns none (`caller_cache`): `DynamicCache`,
  with the model's config where the release's `DynamicCache` takes one;
- `crop`: every 5.x `DynamicCache.crop` takes a negative count as "drop that many tokens" (5.0
  names the argument `max_length` and reads a negative one that way; 5.24 takes only that form),
  so smearcli always crops by a negative count;
- past recording (`generate_records`, `recording`): whether `generate` records a cache's past at
  all (5.14 on; up to 5.13 it crops to the length it keeps and records nothing), and what it passes
  `activate_past_recording`. Up to 5.24 it
  takes nothing; 5.25's assisted decoding passes `recurrent_states_to_keep=N`, N the tokens its
  candidate generator drafts per verify step (`num_drafting_tokens`), so a linear-attention layer
  keeps the last N recurrent states and `crop` can restore one (called bare, the model's forward
  compares an int with None and raises). Read from the signatures of the cache's method and, where
  that forwards `**kwargs`, of its layers' (or its self-attention cache's).

`cache_keyword`, `passes_cache_position`, `out_cache`, `caller_cache` and `recording` use nothing but
`KEYWORDS`, the standard library and transformers: `standalone()` is their source, which every
reproducer embeds (it runs without smearcli), so the census and its reproducers detect the cache
API with the same code.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Optional

KEYWORDS = ("cache", "past_key_values", "cache_params", "state")  # newest first; RWKV: state


def cache_keyword(model):
    """The keyword the model's forward takes its cache under (the first of KEYWORDS it takes), or None."""
    params = inspect.signature(model.forward).parameters
    return next((k for k in KEYWORDS if k in params), None)


def passes_cache_position(model, keyword):
    """Whether every cached call passes cache_position: Mamba-style `cache_params` forwards of 5.0
    refuse a cached step without it; attention models count positions from their cache."""
    return keyword == "cache_params" and "cache_position" in inspect.signature(model.forward).parameters


def out_cache(out):
    """The cache a model's output carries (the field named like one of KEYWORDS), or None."""
    return next((getattr(out, k) for k in KEYWORDS if getattr(out, k, None) is not None), None)


def caller_cache(model):
    """The cache a caller makes for a model whose first call returns none (RecurrentGemma in
    5.24): `DynamicCache(config=...)` where the release's DynamicCache takes a config (every 5.x
    so far), a bare `DynamicCache()` otherwise."""
    from transformers import DynamicCache

    if "config" in inspect.signature(DynamicCache.__init__).parameters:
        return DynamicCache(config=model.config)
    return DynamicCache()


def recording(cache, drafted):
    """The keywords `generate` passes `cache.activate_past_recording` when each verify step drafts
    `drafted` tokens: {"recurrent_states_to_keep": drafted} where the release's method (or, where it
    forwards **kwargs, one of its layers') names that parameter (5.25 on); {} where none does."""
    def takes(fn):  # True: names it; None: forwards **kwargs; False: neither
        try:
            params = inspect.signature(fn).parameters
        except (TypeError, ValueError):
            return False
        if "recurrent_states_to_keep" in params:
            return True
        return None if any(p.kind is p.VAR_KEYWORD for p in params.values()) else False

    said = takes(getattr(cache, "activate_past_recording", None))
    if said is None:  # DynamicCache forwards to its layers, EncoderDecoderCache to its self-attention cache
        inner = getattr(cache, "self_attention_cache", None)
        if inner is not None:
            return recording(inner, drafted)
        said = any(takes(getattr(layer, "activate_past_recording", None))
                   for layer in getattr(cache, "layers", None) or ())
    return {"recurrent_states_to_keep": int(drafted)} if said else {}


def generate_records():
    """Whether the installed release's `generate` records a cache's past before assisted decoding
    (5.14 on: its `Cache` has `activate_past_recording`, called before the prefill, then `crop(0)`
    after every verify step). Before that, generate records nothing and crops once per verify step
    to the length it keeps, so a crop of 0 tokens is no call at all (their `crop(0)` keeps 0)."""
    from transformers import cache_utils

    return callable(getattr(cache_utils.Cache, "activate_past_recording", None))


STANDALONE = (cache_keyword, passes_cache_position, out_cache, caller_cache, recording, generate_records)  # what a reproducer embeds


def standalone() -> str:
    """The detector as source a script can run without smearcli: KEYWORDS and `STANDALONE`."""
    return f"KEYWORDS = {KEYWORDS!r}\n\n\n" + "\n\n".join(inspect.getsource(f) for f in STANDALONE)


@dataclass(frozen=True)
class CacheAPI:
    """How one model takes its cache back, as detected (`detect`)."""

    keyword: str  # the forward keyword the cache is passed back under
    cache_position: bool  # pass cache_position=arange(pos, pos + n) on every cached call
    positions: bool  # the forward takes position_ids
    mask: bool  # the forward takes attention_mask


def detect(model) -> Optional[CacheAPI]:
    """The model's cache API, or None when its forward takes no cache under any of KEYWORDS."""
    keyword = cache_keyword(model)
    if keyword is None:
        return None
    params = inspect.signature(model.forward).parameters
    return CacheAPI(keyword, passes_cache_position(model, keyword), "position_ids" in params,
                    "attention_mask" in params)


def no_cache_reason(model) -> str:
    """Why a model has no cache API smearcli can drive, in words."""
    return f"{type(model).__name__}.forward takes no cache (none of {', '.join(KEYWORDS)})"
