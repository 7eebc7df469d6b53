"""Reachability: whether a finding shows through the library's public API.

A maintainer's first question is whether users hit it. `paths(model, tokens, threshold)` runs the
model through transformers' own `generate` (greedy, `output_logits=True`) the ways a user would:

- `generate`: the prompt, then one token at a time (what every user runs);
- `prefill_chunk_size`: the prompt prefilled in chunks (`generate(..., prefill_chunk_size=16)`);
- `left-padded batch`: the prompt beside a shorter copy of itself, left-padded, with its mask;
- `assistant model`: assisted decoding with a draft model of other weights (drafts rejected and
  taken back out of the cache).

Each path's logits are compared with the full pass (no cache) over the tokens it produced. Its
`result` is `silently wrong` (past `threshold`, with `max_abs`), `agrees`, `raises first` (an
exception inside the model: the user sees an error, not a wrong answer), `refused` (generate
itself declines the use, e.g. assisted decoding on a stateful model) or `not run` (no `generate`,
no assistant), with `why`.
"""

from __future__ import annotations

from typing import Optional

from .. import frames  # torch is imported where a path runs: the report reads `words` without it

SILENT, AGREES, RAISES, REFUSED = "silently wrong", "agrees", "raises first", "refused"
NOT_RUN = "not run"  # the model has no `generate`, or no assistant was given
NEW = 6  # tokens generated per path
CHUNK = 16  # prefill_chunk_size
PATHS = ("generate", "prefill_chunk_size", "left-padded batch", "assistant model")


def greedy(model, ids, mask=None, **kw):
    """(sequences, logits (B, NEW, V)) of a greedy `generate` that makes exactly NEW tokens."""
    import torch

    cfg = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    pad = getattr(cfg, "pad_token_id", None)
    out = model.generate(input_ids=ids, attention_mask=mask if mask is not None else torch.ones_like(ids),
                         max_new_tokens=NEW, min_new_tokens=NEW, do_sample=False, output_logits=True,
                         return_dict_in_generate=True, pad_token_id=pad if isinstance(pad, int) else 0, **kw)
    return out.sequences, torch.stack(list(out.logits), 1).float()


def against_full(model, seq, logits, prompt: int) -> float:
    """max |dlogit| of generated `logits` (1, NEW, V) against the full pass over `seq` (1, prompt+NEW)."""
    import torch

    with torch.inference_mode():
        full = model(input_ids=seq[:, :-1], use_cache=False).logits.float()
    n = logits.size(1)
    return float((full[:, prompt - 1:prompt - 1 + n] - logits).abs().max())


def plain(model, ids, assistant=None) -> float:
    seq, logits = greedy(model, ids)
    return against_full(model, seq, logits, ids.size(1))


def chunked(model, ids, assistant=None) -> float:
    seq, logits = greedy(model, ids, prefill_chunk_size=CHUNK)
    return against_full(model, seq, logits, ids.size(1))


def padded(model, ids, assistant=None) -> float:
    import torch

    k = max(1, ids.size(1) // 4)
    short = ids[:, k:]
    batch = torch.cat([ids, torch.cat([torch.zeros_like(ids[:, :k]), short], 1)], 0)
    mask = torch.ones_like(batch)
    mask[1, :k] = 0
    seq, logits = greedy(model, batch, mask)
    return against_full(model, seq[1:, k:], logits[1:], short.size(1))


def assisted(model, ids, assistant=None) -> float:
    seq, logits = greedy(model, ids, assistant_model=assistant)
    return against_full(model, seq, logits, ids.size(1))


RUNS = dict(zip(PATHS, (plain, chunked, padded, assisted)))


def refused(e: BaseException) -> bool:
    """Whether `generate` itself declined (its frame is transformers' generation code, not a model's)."""
    return "transformers/generation/" in frames.describe(e, "transformers").split(" ")[0]


def paths(model, tokens, threshold: float, assistant=None) -> dict:
    """path -> {result, max_abs, why} (module docstring); `assistant`: the draft model."""
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
                err = run(model, tokens, assistant)
        except Exception as e:
            out[name] = {"result": REFUSED if refused(e) else RAISES, "max_abs": None,
                         "why": frames.describe(e, "transformers")[:300]}
            continue
        out[name] = {"result": SILENT if err > threshold else AGREES, "max_abs": err, "why": None}
    return out


def words(reach: Optional[dict]) -> str:
    """"generate: silently wrong (0.13); prefill_chunk_size: raises first; ..." ("" without one)."""
    if not isinstance(reach, dict):
        return ""
    parts = []
    for name in PATHS:
        e = reach.get(name)
        if isinstance(e, dict):
            num = f" ({e['max_abs']:.2g})" if e.get("result") == SILENT and e.get("max_abs") is not None else ""
            parts.append(f"{name}: {e.get('result')}{num}")
    return "; ".join(parts)


def summary(reach: Optional[dict]) -> str:
    """The one word a table shows: `silently wrong` if any path is, else `raises first`, `refused`
    or `agrees` (in that order), "-" without reachability."""
    if not isinstance(reach, dict) or not reach:
        return "-"
    got = {e.get("result") for e in reach.values() if isinstance(e, dict)}
    return next((w for w in (SILENT, RAISES, REFUSED, AGREES) if w in got), "-")
