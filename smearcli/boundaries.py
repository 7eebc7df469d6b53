"""The schedules of boundaries other than chunk starts: packed documents, padded rows, rolled-back
drafts. Each is one `steps.Schedule` (`BOUNDARIES`, which `smearcli.schedules` registers) that
owns everything said of it: its run (a `steps.Ran`, with the chunk starts that are not the steps'
running sums and notes on what ran), the shape of its failure, its marks' words in a figure,
whether the census runs it, and its part of the census's reproducer (`Repro`, in
`boundaries_repro`).

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

from . import boundaries_repro
from .defaults import DOCUMENT_START, DRAFT, PADDING, REJECT, ROLLBACK  # the kinds of boundary recorded here
from .runner import BOS_DOCUMENTS, COPY, CROP, PADDING as PADDED_BATCH, Runner
from .steps import Ran, Repro, Schedule, ScheduleOptions, prompt_len, split_even

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


def document_lengths(T: int, opts: ScheduleOptions) -> list[int]:
    """The packed schedule's documents: as given (they must cover T), else `chunks` near-equal ones."""
    if opts.documents is None:
        return split_even(T, opts.chunks)
    lengths = list(opts.documents)
    if any(n < 1 for n in lengths) or sum(lengths) != T:
        raise ValueError(f"documents of lengths {','.join(map(str, lengths))} do not cover the {T} tokens")
    return lengths


def packed(runner: Runner, tokens: Tensor, opts, capture, on_step=None, lengths=None):
    """Each document alone (`opts.documents`, unless `lengths` are given), stitched back along T."""
    lengths = document_lengths(tokens.size(1), opts) if lengths is None else list(lengths)
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
    return Ran(torch.cat(logits, dim=1), _cat(caps, 1) if capture else None, lengths,
               {DOCUMENT_START: starts}, starts=[])  # fresh calls: no chunk starts


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
    return Ran(torch.cat(rows_l, dim=0), hiddens, [T], {PADDING: [L]}, starts=[], notes=(note,))


def rollback_mode(runner: Runner) -> Optional[str]:
    """How `runner` takes back a rejected draft: "crop", "copy", or None (it cannot)."""
    return "crop" if runner.can(CROP) else "copy" if runner.can(COPY) else None


def rollback(runner: Runner, tokens: Tensor, opts, capture, on_step=None, prompt=None):
    """Prefill the prompt (all but the last `gen_len` tokens unless given); then each verify step
    feeds `draft` tokens, the last `reject` of them wrong, keeps the outputs before them and takes
    them back out of the cache."""
    B, T = tokens.shape
    prompt = prompt_len(T, opts) if prompt is None else prompt
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
    return Ran(torch.cat(logits, dim=1), _cat(caps, 1) if capture else None, steps, {ROLLBACK: cuts},
               starts=[s for s in starts if s > 0], notes=(note,))


# the census's reproducer of each (`smearcli.census.repro`): its values from the boundary's census
# entry (`census.boundary.entry`) and the reproducer's length T, at the schedules' default options
PADDED_REPRO = Repro(
    "The row beside its prefix right- and left-padded in one batch, with the attention mask,",
    boundaries_repro.PADDED,
    lambda e, T: dict(padded_len=padded_length(T), pad_id=PAD_ID if e.get("pad_id") is None else e["pad_id"],
                      positions=bool(e.get("positions", True))))
ROLLBACK_REPRO = Repro(
    "A prefill, then drafts partly rejected and taken back out of the cache,", boundaries_repro.ROLLBACK,
    lambda e, T: dict(prompt=prompt_len(T, ScheduleOptions()), draft=DRAFT, reject=REJECT,
                      mode=e.get("mode") or "copy"))

BOUNDARIES = (
    Schedule("packed", "each BOS-started document of the packed row alone, against the packed row", packed,
             frozenset({BOS_DOCUMENTS}), shape="leak across documents",
             marks=((DOCUMENT_START, "document start (BOS)"),)),
    Schedule("padded", "the row beside its prefix right- and left-padded in one batch, with the mask", padded,
             frozenset({PADDED_BATCH}), shape="padding leaks into a row",
             marks=((PADDING, "padding boundary (right: pads begin; left: tokens begin)"),), census=True,
             repro=PADDED_REPRO),
    # a rollback's error born at the prompt's end is the chunk-start bug, not the rollback
    Schedule("rollback", "prefill, then drafts of `draft` tokens whose last `reject` are rejected and "
             "taken back out of the cache", rollback, needs_one_of=frozenset({CROP, COPY}),
             shape="state not rolled back", shape_at=ROLLBACK, marks=((ROLLBACK, "rejected draft taken back"),),
             census=True, repro=ROLLBACK_REPRO),
)
