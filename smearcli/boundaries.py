"""The schedules of boundaries other than chunk starts: packed documents, padded rows, rolled-back
drafts. `smearcli.schedules` registers them; each returns (logits, hiddens, steps, marks, extra)
where `extra` holds what `RunResult` needs beyond the plain schedules (chunk starts that are not
the steps' running sums, notes on what ran).

- packed: the input row holds documents back to back, each beginning with BOS, as nanochat's
  BOS-aligned loader packs them for training; the run feeds each document alone, from position 0,
  as inference sees it. Measured against the packed row's full pass, the error at each document's
  BOS is what leaks across documents (`smearcli.packed` splits it into the smear's and
  attention's parts).
- padded: for each input row, one padded batch of three rows: the row itself, a shorter prefix
  right-padded, and the same prefix left-padded, with the attention mask (`Runner.forward_padded`);
  every position that is not padding is laid back where that row alone has it.
- rollback: a prefill, then verify steps of `draft` tokens whose last `reject` are wrong guesses;
  the cache is cropped back before them (`Runner.crop`) or, where a runner cannot crop, restored
  from a copy taken before the draft (`Runner.copy`), and the next step feeds the right tokens.
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

from .names import DOCUMENT_START, PADDING, ROLLBACK  # the kinds of boundary recorded here
from .runner import COPY, CROP, Runner

# the shape each schedule's failure has, for verdicts and scans
SHAPES = {"packed": "leak across documents", "padded": "padding leaks into a row",
          "rollback": "state not rolled back"}
PAD_ID = 0  # what a padding position holds (its outputs are never compared)


def split_on_bos(row: Tensor, bos: int) -> list[int]:
    """Lengths of the documents of one row (T,) that begin at each BOS; the row must start with BOS."""
    ids = row.tolist()
    if not ids or ids[0] != bos:
        raise ValueError(f"a packed row starts with BOS (id {bos}); this one starts with {ids[:1]}")
    starts = [i for i, t in enumerate(ids) if t == bos] + [len(ids)]
    return [b - a for a, b in zip(starts, starts[1:])]


def document_starts(lengths) -> list[int]:
    out, pos = [], 0
    for n in lengths:
        out.append(pos)
        pos += n
    return out


def _cat(parts: list, dim: int) -> Optional[list[Tensor]]:
    if not parts or any(p is None for p in parts):
        return None
    return [torch.cat([p[i].float() for p in parts], dim=dim) for i in range(len(parts[0]))]


def packed(runner: Runner, tokens: Tensor, opts, capture, on_step=None, lengths=None):
    """Each document alone, stitched back along T."""
    lengths = list(lengths)
    if sum(lengths) != tokens.size(1) or any(n < 1 for n in lengths):
        raise ValueError(f"documents of lengths {','.join(map(str, lengths))} do not cover the row's "
                         f"{tokens.size(1)} tokens")
    logits, caps = [], []
    for s, n in zip(document_starts(lengths), lengths):
        out = runner.forward(tokens[:, s:s + n], capture)
        logits.append(out.logits.float())
        caps.append(out.hiddens if capture else None)
        if on_step is not None:
            on_step(n)
    starts = document_starts(lengths)[1:]
    return (torch.cat(logits, dim=1), _cat(caps, 1) if capture else None, lengths,
            {DOCUMENT_START: starts}, {"starts": []})  # fresh calls: no chunk starts


def padded_length(T: int) -> int:
    """The real tokens of the padded rows: a quarter of the row is padding (at least one token)."""
    if T < 2:
        raise ValueError("the padded schedule needs at least 2 tokens")
    return T - max(1, T // 4)


def padded(runner: Runner, tokens: Tensor, opts, capture, on_step=None):
    """Per input row: [row, prefix + right padding, left padding + prefix] in one padded batch."""
    B, T = tokens.shape
    L = padded_length(T)
    rows_l, rows_h = [], []
    for b in range(B):
        row = tokens[b]
        pad = torch.full((T - L,), PAD_ID, dtype=row.dtype, device=row.device)
        batch = torch.stack([row, torch.cat([row[:L], pad]), torch.cat([pad, row[:L]])])
        mask = torch.ones(3, T, dtype=torch.long, device=row.device)
        mask[1, L:] = 0
        mask[2, :T - L] = 0
        out = runner.forward_padded(batch, mask, capture)
        if out.logits.shape[:2] != (3, T):
            raise ValueError(f"{runner.label}: a padded batch of 3 x {T} returned logits of shape "
                             f"{tuple(out.logits.shape)}")
        stack = [out.logits.float()] + ([h.float() for h in out.hiddens] if capture and out.hiddens else [])
        laid = []
        for x in stack:  # real positions where the row alone has them; the rest from the full row
            right = torch.cat([x[1, :L], x[0, L:]])
            left = torch.cat([x[2, T - L:], x[0, L:]])
            laid.append(torch.stack([x[0], right, left]))
        rows_l.append(laid[0])
        rows_h.append(laid[1:] if len(laid) > 1 else None)
        if on_step is not None and b == B - 1:
            on_step(T)
    hiddens = _cat(rows_h, 0) if capture else None
    note = (f"padded: each row beside its first {L} tokens right-padded and left-padded to {T} "
            f"(rows full/right/left); padding positions are not compared")
    return torch.cat(rows_l, dim=0), hiddens, [T], {PADDING: [L]}, {"starts": [], "notes": (note,)}


def rollback_mode(runner: Runner) -> Optional[str]:
    """How `runner` takes back a rejected draft: "crop", "copy", or None (it cannot)."""
    return "crop" if runner.can(CROP) else "copy" if runner.can(COPY) else None


def rollback(runner: Runner, tokens: Tensor, opts, capture, on_step=None, prompt=None):
    """Prefill the prompt; then each verify step feeds `draft` tokens, the last `reject` of them
    wrong, keeps the outputs before them and takes them back out of the cache."""
    B, T = tokens.shape
    k, j = opts.draft, opts.reject
    if not 0 < j < k:
        raise ValueError(f"rollback rejects between 1 and draft - 1 tokens of each draft ({k}), got {j}")
    mode = rollback_mode(runner)
    if mode is None:
        raise ValueError(f"{runner.label} can neither crop its cache nor copy it, so a rejected draft "
                         "cannot be taken back: the rollback schedule cannot run on it")
    vocab = max(int(tokens.max()) + 1, 2)
    cache = runner.new_cache(B, T + k)
    out = runner.step(tokens[:, :prompt], cache, capture)
    logits, caps, steps, starts, cuts = [out.logits.float()], [out.hiddens if capture else None], [prompt], [], []
    if on_step is not None:
        on_step(prompt)
    pos = prompt
    while pos < T:
        n = min(k, T - pos)
        draft = tokens[:, pos:pos + n]
        keep = n if n < k else n - j  # the last, short draft is accepted whole
        if keep < n:  # wrong guesses: the next id (within the ids the row holds)
            draft = torch.cat([draft[:, :keep], (draft[:, keep:] + 1) % vocab], dim=1)
        saved = runner.copy(cache) if mode == "copy" and keep < n else None
        out = runner.step(draft, cache, capture)
        starts.append(pos)
        steps.append(n)
        logits.append(out.logits[:, :keep].float())
        caps.append([h[:, :keep] for h in out.hiddens] if capture and out.hiddens is not None else None)
        if keep < n:
            if mode == "crop":
                runner.crop(cache, pos + keep)
            else:
                cache = saved
                if keep:  # the accepted part again, on the copy from before the draft
                    runner.step(tokens[:, pos:pos + keep], cache, False)
                    steps.append(keep)
            cuts.append(pos + keep)
        pos += keep
        if on_step is not None:
            on_step(keep)
    how = ("cropped back" if mode == "crop" else "restored from a copy taken before the draft (the "
           "runner cannot crop its cache), the accepted tokens fed again")
    note = f"rollback: drafts of {k}, the last {j} of each rejected and the cache {how}"
    return (torch.cat(logits, dim=1), _cat(caps, 1) if capture else None, steps, {ROLLBACK: cuts},
            {"starts": [s for s in starts if s > 0], "notes": (note,)})
