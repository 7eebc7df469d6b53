"""Reachability: whether a finding shows through the library's public API.

A maintainer's first question is whether users hit it. `paths(model, tokens, threshold)` runs the
model through transformers' own `generate` (greedy, `output_logits=True`) the ways a user would:

- `generate`: the prompt, then one token at a time (what every user runs);
- `prefill_chunk_size`: the prompt prefilled in chunks (`generate(..., prefill_chunk_size=16)`);
- `left-padded batch`: the prompt beside a shorter copy of itself, left-padded, with its mask
  (batched generation as users run it);
- `prefill_chunk_size, left-padded batch`: the same batch prefilled in chunks, its pads ending
  inside the first chunk (two paths that meet: a chunk's conv or recurrent state takes in pads);
- `assistant model`: assisted decoding with a draft model of other weights (drafts rejected and
  taken back out of the cache inside `generate`); where that assistant's own greedy tokens are the
  model's, every draft would be accepted and no crop would run, so its output head is rolled by
  one token (`contrary`) and the run made again, its drafts now rejected (`assistant` says so);
- `static cache`: `generate(..., cache_implementation="static")` (the cache a compiled `generate`
  uses: preallocated, each layer's class chosen from the config), its tokens also against the
  dynamic-cache `generate`; `not run` where generate ignores the option (a model that makes its
  own cache: `_supports_default_dynamic_cache()` False, generate only warns);
- `beam search`: `num_beams=4` (`GENERATE_BEAMS`), greedy, cached, against the same search with `use_cache=False`
  step for step (the cache reordered to the beams generate keeps, against no cache at all);
- `left-padded batch of one`: ONE row, left-padded, with its mask (a code path may gate the
  padding mask on the batch holding more than one row), its pads an id whose embedding is not zero
  (`fill_id`), against the row's own unpadded `generate`.
- `static cache, early-initialized`: a `StaticCache` made from the config and initialized in
  advance with its public `early_initialization` (what the export recipes of
  `transformers.integrations.executorch` do before `torch.export`), then the prompt and NEW greedy
  tokens one at a time through the model's forward. Each layer is given the (heads, head_dim)
  that the same cache, initialized lazily by the same run, takes (`early_shapes`): so only the
  early initialization differs. `not run` where the lazily initialized cache raises or departs
  too (the `static cache` path's finding, not this one's), where the forward writes nothing to a
  StaticCache (a model that keeps its state another way), where a layer's keys and values differ
  in shape (multi-head latent attention: `early_initialization` takes one head_dim per layer, for
  both), or the release has no `early_initialization`.

A padded path's short row is also compared token for token with that row's own `generate`, alone
and unchunked (`tokens`: `same`, or the first step where they part): logits that agree with
tokens that part are a near tie, logits off are the finding. `gap`: at the first step where the
path's greedy token parts from the one its reference would pick (the full pass's argmax over the
same tokens; the uncached search's for beam search), the reference's top-2 logit gap there (None:
they never part); 0 is an exact tie, which decides that token by rounding alone.

Each path's logits are compared with the full pass (no cache) over the tokens it produced, and
(`numbered`) with that full pass given the position ids `generate` passes (0 to n-1 over the row,
from its mask): a forward that numbers its tokens otherwise by itself (RoBERTa's family counts from
`padding_idx + 1`, skipping pad ids) departs from `generate` on every path, a numbering of theirs,
not a cache's, and `numbered` says so. The prompt every path is fed holds no `pad_token_id`
(`without_pad`): such a forward numbers a prompt that holds it otherwise. Its
`result` is `silently wrong` (past `threshold`, with `max_abs`), `agrees`, `raises first` (an
exception inside transformers once generate accepted the call: the user sees their crash, which
`through_generate` makes the architecture's `crashed` where every cached schedule agrees),
`refused` (generate itself declines the use by a `raise` of its own, e.g. assisted decoding on a
stateful model: `refused`) or `not run` (no `generate`, no assistant, an option generate ignores,
beam search that raises without a cache as well), with `why`.

A leak (the full pass itself reads later tokens, `engines.transformers.causal`) has no cached path to compare
with the full pass: the question is who runs that full pass. `leak_paths(model, tokens, threshold)`
runs the three places it is run, each again with the last tokens removed and with them changed
(`causal.changed_tail`):

- `full pass`: the forward over a whole sequence, as scoring a text, a perplexity or training
  calls it: do the earlier positions' logits move;
- `generate's prompt pass`: the first forward inside `generate` (greedy, NEW tokens), caught as
  generate runs it (every position's logits kept): do the prompt's earlier positions' logits move
  (the pass the cache is built from);
- `generate`: the continuation's logits against the same `generate` with the prompt fed one token
  a step (`prefill_chunk_size=1`: each step sees only the tokens before it, a causal run).

Where the forward is bidirectional by its authors' design (`design`: what their code says, with
where, or a config that declares itself not causal), the `full pass` entry's `why` says so: a
maintainer may call it a design, not a bug.
"""

from __future__ import annotations

from typing import Optional

from ...census.record import ReachEntry
from ...util import frames  # torch is imported where a path runs: the report reads `words` without it
from ...util.defaults import (
    GENERATE_BEAMS as BEAMS, GENERATE_CHUNK as CHUNK, GENERATE_NEW as NEW, GENERATE_PADS_INSIDE as INSIDE, GENERATE_PATH as GENERATE,
)
from ...judging.verdicts import LEFT_UNSUPPORTED, NOT_RUN  # NOT_RUN: the model has no `generate`, or no assistant was given

SILENT, AGREES, RAISES, REFUSED = "silently wrong", "agrees", "raises first", "refused"
PATHS = ("generate", "prefill_chunk_size", "left-padded batch", "prefill_chunk_size, left-padded batch",
         "assistant model", "static cache", "beam search", "left-padded batch of one",
         "static cache, early-initialized")
# the paths with left padding: not judged where the model cannot number past pads
PADDED_PATHS = ("left-padded batch", "prefill_chunk_size, left-padded batch", "left-padded batch of one")
LEAK_PATHS = ("full pass", "generate's prompt pass", "generate")


def design(model_type: str, config) -> Optional[str]:
    """What the model's code or config declares about a full pass that reads later tokens (None
    when nothing does): `DESIGN`'s reading of their code, or a config's `causal` set to False."""
    if model_type in DESIGN:
        return DESIGN[model_type]
    if getattr(config, "causal", None) is False:
        return (f"by configuration: {type(config).__name__}.causal is False (its default here), and the model "
                "makes its attention mask triangular only when it is True: a bidirectional (masked-LM) reading")
    return None


# model_type -> what its code declares about a full pass that reads later tokens, and where
DESIGN = {
    "cpmant": "by construction: CpmAntModel.forward sets `context` to all ones (every input token is "
              "context) and `_prepare_attention_mask` lets a context token attend to every other, so the "
              "full pass over the input is bidirectional (a prefix-LM reading; modeling_cpmant.py)",
}


def quiet():
    """transformers' warnings off while generate runs (`load.quiet`): how the census calls generate
    (a generation config and its options together) makes it warn on every call, which `scan
    --quiet` would print once per path and architecture."""
    import transformers

    from .loading import quiet as off

    return off(transformers)


def greedy(model, ids, mask=None, **kw):
    """(sequences, logits (B, NEW, V)) of a greedy `generate` that makes exactly NEW tokens."""
    import torch

    cfg = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    pad = getattr(cfg, "pad_token_id", None)
    with quiet():  # generate's warnings about how it was called are not the census's lines
        out = model.generate(input_ids=ids, attention_mask=mask if mask is not None else torch.ones_like(ids),
                             max_new_tokens=NEW, min_new_tokens=NEW, do_sample=False, output_logits=True,
                             return_dict_in_generate=True, pad_token_id=pad if isinstance(pad, int) else 0, **kw)
    return out.sequences, torch.stack(list(out.logits), 1).float()


def without_pad(model, tokens):
    """`tokens` with every `pad_token_id` replaced by the next id up (the same prompt each time: the
    seeded draw, changed where it drew the pad id). Why: RoBERTa's family numbers positions from the
    input ids and skips its pad id (`create_position_ids_from_input_ids`), while `generate` numbers
    from the mask, so a prompt holding the pad id is numbered two ways, an artifact of the prompt.
    bos and eos are kept: no forward numbers by them, and `greedy` makes exactly NEW tokens
    (min_new_tokens = max_new_tokens), so a generated eos stops no row and a prompt's eos stops
    nothing."""
    from .causal import vocab_of

    cfg = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    pad, vocab = getattr(cfg, "pad_token_id", None), vocab_of(model, tokens)
    if not isinstance(pad, int) or not 0 <= pad < vocab or vocab < 2:
        return tokens  # a pad id the draw cannot reach (or none): the prompt is already clean
    return tokens.masked_fill(tokens == pad, (pad + 1) % vocab)


def takes_positions(model) -> bool:
    """Whether `generate` passes the model position ids it makes from the mask (a forward that
    takes `position_ids`, not an encoder-decoder: `GenerationMixin._prepare_position_ids_for_generation`)."""
    import inspect

    try:
        return "position_ids" in inspect.signature(model.forward).parameters and not model.config.is_encoder_decoder
    except (TypeError, ValueError, AttributeError):
        return False


def against_full(model, seq, logits, prompt: int) -> dict:
    """{max_abs, numbered, gap} of generated `logits` (1, NEW, V) against the full pass over `seq`
    (1, prompt+NEW, a row without pads): `max_abs` with the forward numbering positions itself,
    `numbered` given the position ids `generate` passed it (0 to n-1: the row is unpadded, its
    mask all ones), None where generate passes none. The two part only where the forward's own
    numbering is not generate's (RoBERTa's family starts at `padding_idx + 1`). `gap`: the full
    pass's top-2 gap where its greedy token first differs from the one the path made (`tie_gap`)."""
    import torch

    n = logits.size(1)
    full = full_pass(model, seq, prompt, n)
    own = {"max_abs": float((full - logits).abs().max()), "gap": tie_gap(full, seq[:, prompt:prompt + n])}
    if not takes_positions(model):
        return {**own, "numbered": None}
    at = torch.arange(seq.size(1) - 1, device=seq.device)[None].expand(seq.size(0), -1)
    return {**own, "numbered": float((full_pass(model, seq, prompt, n, position_ids=at) - logits).abs().max())}


def full_pass(model, seq, prompt: int, n: int, **kw):
    """The full pass over `seq` without a cache: its logits (B, n, V) at the `n` steps after `prompt`
    that a path generated."""
    import torch

    with torch.inference_mode():
        return model(input_ids=seq[:, :-1], use_cache=False, **kw).logits.float()[:, prompt - 1:prompt - 1 + n]


def tie_gap(ref, made) -> Optional[float]:
    """The reference's top-2 logit gap (smallest over rows) at the first step where the tokens
    `made` (B, n) part from its own greedy pick (`ref` (B, n, V): the logits that step is chosen
    from); None where they never part. A gap of 0 is an exact tie: which token wins is rounding,
    and every later step departs for that reason alone."""
    pick = ref.argmax(-1)
    parted = (pick != made).any(0).nonzero()
    if parted.numel() == 0:
        return None
    top = ref[:, int(parted[0])].topk(2, dim=-1).values
    return float((top[:, 0] - top[:, 1]).min())


def parting(mine, theirs) -> str:
    """`same`, or `part at step N`: the first step where two rows of generated tokens differ."""
    parted = next((i for i, (a, b) in enumerate(zip(mine, theirs)) if a != b), None)
    return "same" if parted is None else f"part at step {parted}"


class NotRun(Exception):
    """A path this model's `generate` would not take as asked (it ignores the option): why."""


def plain(model, ids, assistant=None) -> dict:
    seq, logits = greedy(model, ids)
    return against_full(model, seq, logits, ids.size(1))


def chunked(model, ids, assistant=None) -> dict:
    seq, logits = greedy(model, ids, prefill_chunk_size=CHUNK)
    return against_full(model, seq, logits, ids.size(1))


def padded(model, ids, assistant=None, pads: int = 0, alone: bool = False, **kw) -> dict:
    """The prompt beside itself less its first `pads` tokens (default a quarter), left-padded with
    id 0 (a random embedding on the tiny config: pads that reach a state move it), with the mask:
    the short row's logits against the full pass over its own tokens, and its tokens against its
    own `generate`, alone and unchunked. `alone`: the short row only, a batch of one, padded with
    `fill_id` (id 0 may be the pad id, whose embedding is zero: pads that embed to zero move no
    state, and would hide the very leak this batch is for). `kw`: more of generate's options
    (prefill_chunk_size)."""
    import torch

    k = pads or max(1, ids.size(1) // 4)
    short = ids[:, k:]
    row = torch.cat([torch.full_like(ids[:, :k], fill_id(model, ids) if alone else 0), short], 1)
    batch = row if alone else torch.cat([ids, row], 0)
    mask = torch.ones_like(batch)
    mask[-1, :k] = 0
    seq, logits = greedy(model, batch, mask, **kw)
    own, _ = greedy(model, short)
    return {**against_full(model, seq[-1:, k:], logits[-1:], short.size(1)),
            "tokens": parting(seq[-1, ids.size(1):].tolist(), own[0, short.size(1):].tolist())}


def fill_id(model, tokens) -> int:
    """The pad id of a batch of one: the lowest id that is not the config's `pad_token_id` and
    whose input embedding is not zero (a padding_idx row is zero at init), so that pads a state
    takes in move it. 0 where the embedding cannot be read."""
    from .causal import vocab_of

    cfg = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    pad = getattr(cfg, "pad_token_id", None)
    try:
        table = model.get_input_embeddings().weight
    except Exception:
        table = None
    for i in range(min(vocab_of(model, tokens), 64)):
        if i != pad and (table is None or i >= table.size(0) or bool(table[i].any())):
            return i
    return 0


def padded_one(model, ids, assistant=None) -> dict:
    return padded(model, ids, alone=True)


def chunked_padded(model, ids, assistant=None) -> dict:
    return padded(model, ids, pads=INSIDE, prefill_chunk_size=CHUNK)


def contrary(assistant):
    """A copy of `assistant` whose output head is rolled by one token (untied from its input
    embedding, which stays): its greedy draft is the token after its own pick, so a draft it would
    share with the model is wrong."""
    import copy

    import torch

    other = copy.deepcopy(assistant)
    head = other.get_output_embeddings()
    with torch.no_grad():
        head.weight = torch.nn.Parameter(head.weight.detach().roll(1, 0).clone())
        if getattr(head, "bias", None) is not None:
            head.bias = torch.nn.Parameter(head.bias.detach().roll(1, 0).clone())
    return other


def assisted(model, ids, assistant=None) -> dict:
    """Assisted decoding against the full pass over its tokens. An assistant whose own greedy
    tokens are the model's (a tiny model at its default init often repeats one token) has every
    draft accepted, and no crop runs: an `agrees` then would say nothing of the rollback. Such a
    run is done again with `contrary(assistant)`, whose drafts are rejected; `assistant` says so."""
    import torch

    seq, logits = greedy(model, ids, assistant_model=assistant)
    own, _ = greedy(assistant, ids)
    if not torch.equal(own[:, ids.size(1):], seq[:, ids.size(1):]):
        return against_full(model, seq, logits, ids.size(1))
    seq, logits = greedy(model, ids, assistant_model=contrary(assistant))
    return {**against_full(model, seq, logits, ids.size(1)),
            "assistant": "its head rolled by one token: the assistant's own drafts were all accepted"}


def static(model, ids, assistant=None) -> dict:
    """generate with `cache_implementation="static"` against the full pass over its tokens, and
    its tokens against the dynamic-cache generate's. Not run where generate would ignore it: a
    model that makes its own cache (`_supports_default_dynamic_cache()` False) gets only a
    warning, and the run would be the dynamic path again."""
    supports = getattr(model, "_supports_default_dynamic_cache", None)
    if callable(supports) and not supports():
        raise NotRun(f"{type(model).__name__} makes its own cache: generate ignores cache_implementation "
                     "(a warning, no StaticCache)")
    seq, logits = greedy(model, ids, cache_implementation="static")
    dynamic, _ = greedy(model, ids)
    return {**against_full(model, seq, logits, ids.size(1)),
            "tokens": parting(seq[0, ids.size(1):].tolist(), dynamic[0, ids.size(1):].tolist())}


def beam(model, ids, assistant=None) -> dict:
    """Beam search (BEAMS beams, greedy), cached, against the same search with `use_cache=False`:
    every step's logits of every beam (generate reorders the cache to the beams it keeps; without a
    cache each step is a full pass over the beam's tokens, so there is nothing to reorder). Both
    runs are generate's, numbered alike, so `numbered` is `max_abs`; `gap` is the uncached
    search's (`tie_gap` over its beams) where the best sequences part."""
    import torch

    def search(use_cache: bool):
        cfg = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
        pad = getattr(cfg, "pad_token_id", None)
        with quiet():
            out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), num_beams=BEAMS, do_sample=False,
                                 max_new_tokens=NEW, min_new_tokens=NEW, output_logits=True,
                                 return_dict_in_generate=True, use_cache=use_cache,
                                 pad_token_id=pad if isinstance(pad, int) else 0)
        return out.sequences[:, ids.size(1):], torch.stack(list(out.logits), 1).float()  # (BEAMS, NEW, V)
    def uncached():
        try:
            return search(False)
        except Exception as e:  # the search raises without a cache too: nothing a cache did
            raise NotRun(f"beam search raises without a cache as well ({frames.describe(e, 'transformers')[:160]})") from e
    try:
        seq, got = search(True)
    except Exception as cached:
        uncached()  # a crash is the cache's only where the same search runs without one
        raise cached
    ref_seq, ref = uncached()
    err = float((got - ref).abs().max())
    step = next((i for i, (a, b) in enumerate(zip(seq[0].tolist(), ref_seq[0].tolist())) if a != b), None)
    gap = None
    if step is not None:
        top = ref[:, step].topk(2, dim=-1).values
        gap = float((top[:, 0] - top[:, 1]).min())
    return {"max_abs": err, "numbered": err, "gap": gap, "tokens": parting(seq[0].tolist(), ref_seq[0].tolist())}


def cache_keyword(model) -> str:
    """The name the model's forward takes its cache by: `cache` where it has it (5.24 renames
    `past_key_values` to it, the old name warning), else `past_key_values`."""
    import inspect

    try:
        return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"
    except (TypeError, ValueError):
        return "past_key_values"


def cached_greedy(model, ids, cache):
    """(sequences, logits (1, NEW, V)): the prompt in one forward through `cache`, then NEW - 1
    greedy tokens one forward each, as generate's loop feeds them (positions from the cache)."""
    import torch

    kw = {cache_keyword(model): cache, "use_cache": True}
    out = model(input_ids=ids, **kw)
    logits, seq = [out.logits[:, -1].float()], ids
    for _ in range(NEW - 1):
        nxt = logits[-1].argmax(-1, keepdim=True)
        seq = torch.cat([seq, nxt], 1)
        logits.append(model(input_ids=nxt, **kw).logits[:, -1].float())
    return torch.cat([seq, logits[-1].argmax(-1, keepdim=True)], 1), torch.stack(logits, 1)


def early_shapes(cache, config) -> tuple[list, list]:
    """Per layer, the (heads, head_dim) a lazily initialized `cache` took (its keys' shape), for the
    layers that hold none (a conv or recurrent state) what the export recipes pass
    (`integrations.executorch.get_head_shapes` where the release has it). NotRun where a layer's
    keys and values differ in shape: `early_initialization` takes one shape for both."""
    import torch

    try:
        from transformers.integrations.executorch import get_head_shapes
        heads, dims = get_head_shapes(config)
    except Exception:
        try:
            heads = getattr(config, "num_key_value_heads", None) or config.num_attention_heads
            dims = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        except (AttributeError, TypeError, ZeroDivisionError):
            heads = dims = None
    out_h, out_d = [], []
    for i, layer in enumerate(cache.layers):
        k, v = getattr(layer, "keys", None), getattr(layer, "values", None)
        if isinstance(k, torch.Tensor) and k.dim() == 4:
            if not isinstance(v, torch.Tensor) or v.shape != k.shape:
                raise NotRun(f"layer {i}'s keys and values differ in shape ({tuple(k.shape)} and "
                             f"{tuple(getattr(v, 'shape', ()))}): early_initialization takes one head_dim for both")
            out_h.append(int(k.size(1)))
            out_d.append(int(k.size(-1)))
        elif heads is None or dims is None:
            raise NotRun(f"layer {i} holds no keys and the config names no head shape to initialize it with")
        else:
            out_h.append(heads if isinstance(heads, int) else heads[i])
            out_d.append(dims if isinstance(dims, int) else dims[i])
    return out_h, out_d


def early_static(model, ids, assistant=None) -> dict:
    """A StaticCache initialized in advance with the shapes its lazy twin took (`early_shapes`),
    the prompt and NEW tokens through the model's forward, against the full pass over its tokens;
    `lazy`: the same run on the lazily initialized cache, against the same full pass. No generate
    passes position ids here: the forward numbers both runs itself, so `numbered` is `max_abs`."""
    import torch
    import transformers

    supports = getattr(model, "_supports_default_dynamic_cache", None)
    static = getattr(transformers, "StaticCache", None)
    if callable(supports) and not supports() or static is None or model.config.is_encoder_decoder:
        raise NotRun(f"{type(model).__name__} makes its own cache: no StaticCache reaches its forward")
    if not hasattr(static, "early_initialization"):
        raise NotRun(f"transformers {transformers.__version__}'s StaticCache has no early_initialization")
    config = model.config.get_text_config(decoder=True)
    length = ids.size(1) + NEW
    try:
        lazy = static(config=config, max_cache_len=length)
        lazy_seq, lazy_logits = cached_greedy(model, ids, lazy)
        held = lazy.get_seq_length()
    except Exception as e:
        raise NotRun("the lazily initialized static cache raises as well "
                     f"({frames.describe(e, 'transformers')[:160]})") from e
    if not held:
        raise NotRun(f"{type(model).__name__}'s forward wrote nothing to the StaticCache it was given "
                     "(it keeps its state another way)")
    heads, dims = early_shapes(lazy, config)
    early = static(config=config, max_cache_len=length)
    one = len(set(heads)) == 1 and len(set(dims)) == 1  # one shape for all: ints, as every release takes
    try:
        early.early_initialization(ids.size(0), heads[0] if one else heads, dims[0] if one else dims,
                                   getattr(model, "dtype", torch.float32), ids.device)
    except TypeError as e:
        if one:
            raise
        raise NotRun(f"its layers differ in shape, and transformers {transformers.__version__}'s "
                     f"early_initialization takes one shape for all ({e})"[:300]) from e
    seq, logits = cached_greedy(model, ids, early)
    # both sides number positions by the forward: one full pass per token row (the lazy twin's
    # tokens are the same row unless it departs)
    prompt, n = ids.size(1), logits.size(1)
    full = full_pass(model, seq, prompt, n)
    lazy_full = full if torch.equal(lazy_seq, seq) else full_pass(model, lazy_seq, prompt, n)
    err = float((full - logits).abs().max())
    return {"max_abs": err, "numbered": err, "gap": tie_gap(full, seq[:, prompt:prompt + n]),
            "lazy": float((lazy_full - lazy_logits).abs().max())}


RUNS = dict(zip(PATHS, (plain, chunked, padded, chunked_padded, assisted, static, beam, padded_one, early_static)))


def measure(run, model, tokens, assistant=None) -> dict:
    """{max_abs, numbered[, tokens]} of one path (a path gives a number, or a dict), on `without_pad`'s
    tokens: the one place every path and every rerun of one is fed its prompt."""
    got = run(model, without_pad(model, tokens), assistant)
    return got if isinstance(got, dict) else {"max_abs": got}


def refused(e: BaseException) -> bool:
    """Whether `generate` itself declined the use: the exception was raised by a `raise` statement of
    transformers' generation code (its checks of what it is asked: assisted decoding on a stateful
    model, beam search on a cache it cannot reorder). Anything else raised once generate accepted
    the call (an operation failing in generate's code, a model's or a cache's code it called, even
    a cache's own "cannot crop" that generate did not check first) is a crash in their code."""
    tb = frames.frames(e)
    last = tb[-1] if tb else None
    return (last is not None and "transformers/generation/" in last.filename.replace("\\", "/")
            and (last.line or "").lstrip().startswith("raise"))


def paths(model, tokens, threshold: float, assistant=None) -> dict[str, ReachEntry]:
    """path -> what it gave (result, max_abs, why; module docstring); `assistant`: the draft model."""
    import torch

    out = {}
    for name, run in RUNS.items():
        if not callable(getattr(model, "generate", None)) or (run is assisted and assistant is None):
            out[name] = {"result": NOT_RUN, "max_abs": None,
                         "why": "no assistant model" if callable(getattr(model, "generate", None))
                         else f"{type(model).__name__} has no generate"}
            continue
        try:
            with torch.inference_mode():
                got = measure(run, model, tokens, assistant)
        except NotRun as e:
            out[name] = {"result": NOT_RUN, "max_abs": None, "why": str(e)}
            continue
        except Exception as e:
            out[name] = {"result": REFUSED if refused(e) else RAISES, "max_abs": None,
                         "why": frames.describe(e, "transformers")[:300]}
            continue
        if (got.get("lazy") or 0.0) > threshold:  # early_static: the cache departs however it is initialized
            out[name] = {"result": NOT_RUN, **got, "why": f"the lazily initialized static cache departs as well "
                         f"(by {got['lazy']:.3g}): nothing early initialization does; the static cache's own path"}
            continue
        out[name] = {"result": SILENT if got["max_abs"] > threshold else AGREES, **got, "why": None}
    return entries(out)


def entries(out: dict) -> dict[str, ReachEntry]:
    """Each path's result as the record holds it."""
    return {name: ReachEntry.from_json(e) for name, e in out.items()}


def _run(path, *args):
    """{result, max_abs, why} of one leak path: `path(*args)` gives max |dlogit|, or raises."""
    import torch

    try:
        with torch.inference_mode():
            return path(*args)
    except Exception as e:
        return {"result": REFUSED if refused(e) else RAISES, "max_abs": None,
                "why": frames.describe(e, "transformers")[:300]}


def _moved(ref, probes: dict, cut: int, threshold: float, design=None) -> dict:
    """The entry of full-pass logits `ref` (1, T, V) against each probe's (how -> logits over the
    tokens with the last ones removed or changed): the positions before `cut` must agree."""
    errs = {how: float((ref[:, :cut].double() - b[:, :cut].double()).abs().max()) for how, b in probes.items()}
    how, err = max(errs.items(), key=lambda kv: kv[1])
    said = "; ".join(f"last tokens {h}: {e:.2g}" for h, e in errs.items())
    if err > threshold and any(e <= threshold for e in errs.values()):
        said += " (the earlier positions depend on " + ("how many tokens follow, not on which" if how == "removed"
                                                         else "which tokens follow") + ")"
    return {"result": SILENT if err > threshold else AGREES, "max_abs": err,
            "why": f"{design}; {said}" if design else said}


def prompt_pass(model, ids):
    """The logits (1, T, V) of the first forward `generate` runs on `ids` (its prompt pass), every
    position's kept (generate asks for the last one only: `logits_to_keep` 0 where it passes one)."""
    seen = []

    def every(m, args, kw):
        if not seen and "logits_to_keep" in kw:
            kw = {**kw, "logits_to_keep": 0}
        return args, kw
    pre = model.register_forward_pre_hook(every, with_kwargs=True)
    hook = model.register_forward_hook(lambda m, a, out: seen.append(out.logits.float()) if not seen else None)
    try:
        greedy(model, ids)
    finally:
        pre.remove()
        hook.remove()
    return seen[0]


def stepwise(model, ids, new: int = NEW):
    """The logits (1, new, V) of a greedy continuation of `ids` through the model's own forward, the
    prompt fed one token a call onto the cache it returns (causal by construction)."""
    import torch

    from . import api

    key, cache, out, got = api.cache_keyword(model), None, None, []
    for t in range(ids.size(1) + new):
        step = ids[:, t:t + 1] if t < ids.size(1) else out.logits[:, -1:].argmax(-1)
        if t >= ids.size(1):
            got.append(out.logits[:, -1].float())
        out = model(input_ids=step, use_cache=True, **({key: cache} if cache is not None else {}))
        cache = api.out_cache(out)
        if out.logits.size(1) == 0:
            raise NoLogits(f"a one-token call onto a cache of {t} tokens returns logits of shape "
                           f"{tuple(out.logits.shape)}: no position")
    return torch.stack(got, 1)


class NoLogits(ValueError):
    """A cached call of the model's own forward returned no position's logits."""


def leak_paths(model, tokens, threshold: float, model_type: str = "") -> dict[str, ReachEntry]:
    """path -> what it gave (result, max_abs, why) for a full pass that reads later tokens (module
    docstring)."""
    from .causal import changed_tail, probe_width, vocab_of

    n = probe_width(tokens.size(1))
    cut = tokens.size(1) - n
    probes = {"removed": tokens[:, :cut], "changed": changed_tail(tokens, vocab_of(model, tokens), n)}

    def full():
        run = lambda t: model(input_ids=t, use_cache=False).logits.float()
        return _moved(run(tokens), {h: run(t) for h, t in probes.items()}, cut, threshold,
                      design(model_type, getattr(model, "config", None)))

    def prompt():
        return _moved(prompt_pass(model, tokens), {h: prompt_pass(model, t) for h, t in probes.items()}, cut, threshold)

    def continuation():
        _, got = greedy(model, tokens)
        try:
            _, causal = greedy(model, tokens, prefill_chunk_size=1)
            how = "generate with prefill_chunk_size=1"
        except Exception as e:
            first = frames.describe(e, "transformers")[:160]
            try:
                causal, how = stepwise(model, tokens), f"the forward one token a call (prefill_chunk_size=1 raises: {first})"
            except Exception as e2:
                return {"result": NOT_RUN, "max_abs": None,
                        "why": f"no causal run to compare with: prefill_chunk_size=1 raises ({first}); one token a "
                               f"call: " + (str(e2) if isinstance(e2, NoLogits) else
                                            f"raises ({frames.describe(e2, 'transformers')[:160]})")}
        err = float((got - causal).abs().max())
        return {"result": SILENT if err > threshold else AGREES, "max_abs": err,
                "why": f"the continuation against the prompt fed one token a step: {how}"}
    out = {"full pass": _run(full)}
    if not callable(getattr(model, "generate", None)):
        why = f"{type(model).__name__} has no generate"
        return {**out, **{k: {"result": NOT_RUN, "max_abs": None, "why": why} for k in LEAK_PATHS[1:]}}
    out["generate's prompt pass"] = _run(prompt)
    out["generate"] = _run(continuation)
    return entries(out)


def words(reach: Optional[dict]) -> str:
    """"generate: silently wrong (0.13); prefill_chunk_size: raises first; ..." ("" without one):
    a record's `reach` (path -> its `census.record.ReachEntry`)."""
    if not isinstance(reach, dict):
        return ""
    parts = []
    for name in [k for k in dict.fromkeys(PATHS + LEAK_PATHS) if reach.get(k) is not None]:
        e = reach[name]
        num = f" ({e.max_abs:.2g})" if e.result == SILENT and e.max_abs is not None else ""
        parts.append(f"{name}: {e.result}{num}")
    return "; ".join(parts)


def summary(reach: Optional[dict]) -> str:
    """The one word a table shows: `silently wrong` if any path is, else `raises first`, `refused`
    or `agrees` (in that order), "-" without reachability."""
    if not isinstance(reach, dict) or not reach:
        return "-"
    got = {e.result for e in reach.values() if e is not None}
    return next((w for w in (SILENT, RAISES, REFUSED, AGREES) if w in got), "-")


from ...measure.shapes import THROUGH_GENERATE as THROUGH  # its shape: every cached schedule of the census agrees


def judged(path: str, boundaries: Optional[dict]) -> bool:
    """Whether a silently wrong `path` can be the architecture's finding: a left-padded path only
    where the census's own padded boundary ran and did not find left padding unsupported (a forward
    that cannot number past its pads is the model's declared API, `verdicts.LEFT_UNSUPPORTED`)."""

    if path not in PADDED_PATHS:
        return True
    e = (boundaries or {}).get("padded")
    return e is not None and getattr(e, "status", None) not in (LEFT_UNSUPPORTED, NOT_RUN)


def through_generate(rec, make, tokens_of, tolerance: float, seed: int = 0) -> None:
    """An architecture whose cached schedules all agree, run through generate's own paths
    (`paths`, into `rec.reach`). The worst path silently wrong that `judged` lets count is held to
    what confirms every finding (`confirm`): `bug` (`worst_schedule` GENERATE + the path, shape
    THROUGH) only where every condition holds, else `unconfirmed` with a note naming the conditions
    that failed; a departure gone in float64 is rounding, said in a note, the verdict left as it
    was. `make(s)` builds the model of the check's seed + s, `tokens_of(s)` its prompt (`measure`
    takes the pad id out of it); `seed`: the check's seed, which the reproducer rebuilds;
    `rec.floor` is the float32 floor."""
    threshold = tolerance * (rec.floor or 0.0)
    model = make(0)
    if not callable(getattr(model, "generate", None)) or threshold <= 0:
        return
    assistant = make(1)
    rec.reach = found = paths(model, tokens_of(0), threshold, assistant)
    silent = {p: e for p, e in found.items() if e.result == SILENT and judged(p, rec.boundaries)}
    if silent:
        name = max(silent, key=lambda p: silent[p].max_abs)
        confirm(rec, name, model, assistant, make, tokens_of, threshold, tolerance, seed)
    raised = [p for p, e in found.items() if e.result == RAISES and judged(p, rec.boundaries)]
    if raised:
        crash(rec, raised, make, tokens_of)


def crash(rec, raised: list, make, tokens_of) -> None:
    """generate's paths `raised` raised inside transformers after generate accepted the call (`refused`
    is False), where every cached schedule of the census agrees and the full pass runs: their
    crash on a public path, the judge's `crashed` (which a confirmed bug outranks and which
    outranks an unconfirmed departure), named as the path (`worst_schedule` GENERATE + the first,
    shape THROUGH), its `reason` the frame that raised. Each is run again on the next seed's weights
    and prompt, said in a note. A message their code words as a declared limit
    (`frames.says_limit`: a cache's "cannot crop", "not supported") is quoted as what it is: a
    limit of an internal call that generate did not check before it accepted the public one."""
    import torch

    from ...judging.judge import RAISED, Run, judge
    from ...judging.verdicts import worst

    word = judge([Run(GENERATE + p, outcome=RAISED) for p in raised]).word
    if worst([rec.verdict, word]) != word:  # a confirmed bug stands
        return
    again, model, assistant = {}, make(1), make(2)  # the next seed's weights, as `confirm` reruns a departure
    for p in raised:
        try:
            with torch.inference_mode():
                measure(RUNS[p], model, tokens_of(1), assistant)
            again[p] = "not on the next seed"
        except NotRun as e:
            again[p] = f"not run on the next seed ({e})"
        except Exception as e:
            again[p] = "again on the next seed" if not refused(e) else "refused on the next seed"
    name = raised[0]
    rec.verdict = str(word)
    rec.worst_schedule, rec.shape, rec.reason = GENERATE + name, THROUGH, rec.reach[name].why
    rec.max_abs = rec.multiple = rec.confirmation = None  # a crash measures nothing (an unconfirmed path's numbers stay in its note)
    rec.notes.append(f"{GENERATE}{name} raised; the full pass runs")
    for p in raised:
        why = rec.reach[p].why or ""
        limit = frames.says_limit(why)
        rec.notes.append(f"every cached schedule of the census agrees; generate's {p} raises inside transformers "
                         f"after generate accepted the call ({again[p]}): {why}"
                         + (" (a limit their code declares for an internal call, which generate did not check "
                            "before it accepted the public one)" if limit else ""))


def confirm(rec, name: str, model, assistant, make, tokens_of, threshold: float, tolerance: float, seed: int) -> None:
    """Hold generate's path `name` (silently wrong in `rec.reach`) to what makes a finding a bug,
    each condition as the rest of smearcli words it:

    1. float64: the same path rerun with the model and its assistant in float64 under the lift
       (`precision.float64_model`, `precision.lifted`), judged by `judge.confirmed`: it keeps at
       least `judge.KEEPS` of its size (rounding would fall by the ratio of the units);
    2. the second seed: the next seed's weights and prompt depart again (`judge.replicated`);
    3. `numbered`: the path departs from the full pass given the position ids generate passes as
       well (where it agrees there, the departure is the forward numbering positions otherwise by
       itself, RoBERTa's family from padding_idx + 1: a numbering of theirs, not a cache);
    4. no exact tie: where the path's greedy token parts from its reference's, the reference's
       top-2 gap there is not 0 (`gap`; an exact tie is decided by rounding, and every later step
       departs for that alone);
    5. the standalone reproducer (`repro.write_generate`, torch and transformers only, run in an
       isolated Python) exits 1: the finding is there without smearcli. Run last, only where 1-4
       hold (it costs a Python start and an import of transformers).

    Gone in float64 (`judge.confirmed` says rounding, or the float64 rerun falls within the
    threshold): a note, no verdict. Otherwise `rec` becomes the finding: `bug` where all five hold,
    `unconfirmed` where any fails, the note saying which."""
    import torch

    from ...judging import evidence, judge
    from ...judging.judge import SECOND_SEED, replicated, withstood
    from ...measure.precision import float64_model, lifted
    from ...judging.verdicts import BUG, ROUNDING

    e = rec.reach[name]
    err, run = e.max_abs, RUNS[name]

    def again(m, a, t, lift=False) -> Optional[dict]:
        try:
            with torch.inference_mode():
                if not lift:
                    return measure(run, m, t, a)
                with lifted():
                    return measure(run, m, t, a)
        except Exception:
            return None
    try:
        wide_m, wide_a = float64_model(model), float64_model(assistant)
    except Exception:
        wide_m = wide_a = None
    wide = (again(wide_m, wide_a, tokens_of(0), lift=True) or {}).get("max_abs") if wide_m is not None else None
    with torch.inference_mode():
        scale = float(model(input_ids=tokens_of(0), use_cache=False).logits.float().abs().max())
    c = evidence.Confirmation(err, "float32", wide)
    c.bound = evidence.rounding_bound(err, torch.float32, scale)
    c.status, c.why = judge.confirmed(err, wide, c.bound)
    if c.status == ROUNDING or (wide is not None and wide <= threshold):
        rec.notes.append(f"generate's {name} is off by {err:.3g} in float32 and {wide:.3g} in float64: rounding")
        return
    other = again(make(1), make(2), tokens_of(1))
    departs = other is not None and other["max_abs"] > threshold
    numbered, gap = e.numbered, e.gap
    failed = []
    if c.status != BUG:
        failed.append(f"float64: {c.why}" + (f" ({wide:.3g})" if wide is not None else ""))
    if replicated(SECOND_SEED, judge.read_again(departs, BUG), ties=False) is not None:
        failed.append("second seed: " + ("the path raises" if other is None else
                                         f"within the threshold ({other['max_abs']:.3g})"))
    if numbered is not None and numbered <= threshold:
        failed.append(f"numbered: agrees ({numbered:.3g}) with the full pass given the position ids generate "
                      "passes (0 to n-1, from the mask): the departure is the forward numbering positions "
                      "otherwise by itself (e.g. from padding_idx + 1), not a cache")
    if gap is not None and gap <= 0:
        failed.append("tie: an exact tie (top-2 gap 0) in the reference decides the token where the path parts")
    rec.worst_schedule, rec.shape = GENERATE + name, THROUGH
    rec.max_abs, rec.multiple = err, err / rec.floor
    rec.confirmation = c.to_json()
    if not failed:
        status, said = reproduce(rec, tolerance, tokens_of(0), seed)
        if status != 1:
            failed.append(f"reproducer: {said}")
    rec.verdict = str(withstood(failed))
    rec.notes.append(f"every cached schedule of the census agrees; generate's {name} is off by {err:.3g} "
                     f"({err / rec.floor:.3g}x the float32 floor), "
                     + (f"{wide:.3g} in float64 lifted" if wide is not None else "float64 raises")
                     + (f", {other['max_abs']:.3g} on the next seed" if other is not None else ", the next seed raises")
                     + (f", top-2 gap {gap:.3g} where its tokens part" if gap is not None else "")
                     + ("" if numbered is None else f", {numbered:.3g} numbered as generate numbers"))
    rec.notes.append("through generate only, confirmed: kept in float64, on the next seed, numbered as generate "
                     "numbers, no exact tie, and its reproducer exits 1 without smearcli" if not failed else
                     "through generate only, unconfirmed: " + "; ".join(failed))


def reproduce(rec, tolerance: float, tokens, seed: int) -> tuple[Optional[int], str]:
    """(exit status, why) of the finding's standalone reproducer (`repro.write_generate`), written
    to a temporary folder and run once in an isolated Python (`repro.run`); (None, why) where it
    cannot be written (no config to rebuild)."""
    import tempfile
    from pathlib import Path

    from . import repro

    if rec.built_from is None:
        return None, "no config to rebuild, no reproducer written"
    with tempfile.TemporaryDirectory(prefix="smearcli-generate-") as d:
        path = repro.write(rec, rec.built_from, Path(d) / f"{rec.model_type}.py", seed=seed,
                           vocab=rec.vocab or 256, margin=tolerance, total=tokens.size(1))
        status, line = run_reproducer(path)
    return status, f"exits {status}" + (f" ({line})" if line else "")


def run_reproducer(path):
    """`repro.run` (a seam: a test may run it with a library it broke on purpose)."""
    from . import repro

    return repro.run(path, timeout=REPRO_TIMEOUT)


REPRO_TIMEOUT = 180.0  # seconds: the reproducer builds the tiny model twice and generates a few tokens
