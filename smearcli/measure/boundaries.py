"""The schedules of boundaries other than chunk starts: packed documents, padded rows, rolled-back
drafts. Each is one `steps.Schedule` (`BOUNDARIES`, which `smearcli.measure.schedules` registers) that
owns everything said of it: its run (a `steps.Ran`, with the chunk starts that are not the steps'
running sums and notes on what ran), the shape of its failure, its marks' words in a figure,
whether the census runs it, and its part of the census's reproducer (`Repro`, in
`boundaries_repro`).

- packed: the input row holds documents back to back, each beginning with BOS, as nanochat's
  BOS-aligned loader packs them for training; the run feeds each document alone, from position 0,
  as inference sees it. Measured against the packed row's full pass, the error at each document's
  BOS is what leaks across documents (`smearcli.measure.packed` splits it into the smear's and
  attention's parts).
- padded: for each input row, one padded batch of three rows: the row itself, a shorter prefix
  right-padded, and the same prefix left-padded, with the attention mask (`Runner.forward_padded`);
  every position that is not padding is laid back where that row alone has it.
- rollback: a prefill, then verify steps of `draft` tokens whose last `reject` are wrong guesses;
  the cache is cropped back before them (`Runner.crop`) or, where a runner cannot crop, restored
  from a copy taken before the draft (`Runner.copy`), and the next step feeds the right tokens.

Boundaries in combination (`COMBINATIONS`: census-only, registered by `engines.transformers.boundary` and never
offered to compare, `Schedule.compare`), where the paths users run meet:

- padded-chunks: batched generation with a chunked prefill. The row beside its prefix left-padded
  twice, once with the model's own pad id and once with an id whose embedding is not zero (a
  state that takes the pads in is hidden when they embed to zero), fed through the cache in
  chunks whose width puts the padding's end inside a chunk after a chunk of pads alone
  (`chunk_width`), each step with the mask over every position so far (`Runner.step_padded`).
- padded-decode: a right-padded prefill, then single-token decode of further tokens after the pads
  (the mask's gap stays in every step): a state that carries the pads shows at every later step.
- rollback-window: speculative decoding with an assistant's cache: several draft forwards held
  (`Runner.record`) before ONE crop that takes back more than the last forward fed, the prompt
  sized so the first round's drafts cross the runner's sliding window (`Runner.window`), every
  later round holding more tokens than the window.

In each, every real position is laid where the row alone has it; padding is never compared.
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

from . import boundaries_repro
from ..util.defaults import DOCUMENT_START, DRAFT, PADDING, REJECT, ROLLBACK  # the kinds of boundary recorded here
from .runner import BOS_DOCUMENTS, COPY, CROP, PADDED_STEPS, PADDING as PADDED_BATCH, RECORD, Runner
from .steps import Ran, Repro, Schedule, ScheduleOptions, prompt_len, split_even

PAD_ID = 0  # what a padding position holds (its outputs are never compared)
CHUNK_WIDTH = 8  # padded-chunks: the widest chunk, below the scan's chunks of 16 so pads fill one
DECODED = 6  # padded-decode: tokens decoded one at a time after the right-padded prefill
HELD = (3, 3, 4)  # rollback-window: draft forwards held for one crop, tokens in each, tokens the crop takes back
ROUNDS = 3  # rollback-window: rounds of held drafts (the rest of the row then comes in one forward)


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


def pad_ids(runner: Runner, tokens: Tensor) -> tuple[int, int]:
    """The two ids padding holds in the padded combinations: the runner's own pad id (the model's
    pad token, else PAD_ID) and another whose input embedding is not zero (`Runner.nonzero_pad`)."""
    own = runner.pad_id if isinstance(runner.pad_id, int) else PAD_ID
    return own, runner.nonzero_pad(own, max(int(tokens.max()) + 1, 2))


def chunk_width(pads: int) -> int:
    """padded-chunks' chunk width for `pads` left pads: at most CHUNK_WIDTH and below `pads`, so a
    chunk of pads alone is carried in the cache, and not dividing `pads`, so the padding ends
    inside a chunk, not at its edge (pads + 1 when no such width exists: they end in the first)."""
    for w in range(min(CHUNK_WIDTH, pads - 1), 1, -1):
        if pads % w:
            return w
    return pads + 1


def _padded_rows(row: Tensor, real: int, ids: tuple[int, int], left: bool) -> tuple[Tensor, Tensor]:
    """(batch (3, T), mask (3, T)): the row itself, then its first `real` tokens padded to the
    row's length with each of `ids`, on the left or on the right."""
    T = row.size(0)
    out, mask = [row], torch.ones(3, T, dtype=torch.long, device=row.device)
    for r, pad in enumerate(ids, start=1):
        fill = torch.full((T - real,), pad, dtype=row.dtype, device=row.device)
        out.append(torch.cat([fill, row[:real]] if left else [row[:real], fill]))
        if left:
            mask[r, :T - real] = 0
        else:
            mask[r, real:] = 0
    return torch.stack(out), mask


def _outputs(outs: list) -> list[Tensor]:
    """The steps' outputs stitched along T: [logits, *hiddens] (3, T, ...) in float32."""
    logits = torch.cat([o.logits.float() for o in outs], dim=1)
    hs = [o.hiddens for o in outs]
    if any(h is None for h in hs):
        return [logits]
    return [logits] + [torch.cat([h[i].float() for h in hs], dim=1) for i in range(len(hs[0]))]


def _laid(stack: list[Tensor], pieces) -> list[Tensor]:
    """Each output (3, T, ...) laid where the row alone has it: row 0 as it is, each padded row's
    real positions (`pieces(x, r)`) then the row's own beyond them, so padding is never compared."""
    return [torch.stack([x[0]] + [pieces(x, r) for r in (1, 2)]) for x in stack]


def padded_chunks(runner: Runner, tokens: Tensor, opts, capture, on_step=None):
    """Per input row: [row, pads + prefix, other pads + prefix] fed in chunks with the mask over
    every position so far; the left-padded rows' real positions laid where the row alone has them."""
    B, T = tokens.shape
    L = padded_length(T)
    p, ids = T - L, pad_ids(runner, tokens)
    w = chunk_width(p)
    steps = [min(w, T - s) for s in range(0, T, w)]
    rows_l, rows_h = [], []
    for b in range(B):
        batch, mask = _padded_rows(tokens[b], L, ids, left=True)
        cache, pos, outs = runner.new_cache(3, T), 0, []
        for n in steps:  # (3, n) each, the mask (3, pos + n)
            outs.append(runner.step_padded(batch[:, pos:pos + n], mask[:, :pos + n], cache, capture, prefill=True))
            pos += n
        laid = _laid(_outputs(outs) if capture else _outputs(outs)[:1], lambda x, r: torch.cat([x[r, p:], x[0, L:]]))
        rows_l.append(laid[0])
        rows_h.append(laid[1:] or None)
        if on_step is not None and b == B - 1:
            on_step(T)
    note = (f"padded-chunks: each row beside its first {L} tokens left-padded with id {ids[0]} and with id "
            f"{ids[1]}, fed in chunks of {w} (the {p} pads end inside a chunk) with the mask; padding is not compared")
    return Ran(torch.cat(rows_l, dim=0), _cat(rows_h, 0) if capture else None, steps, {PADDING: [L]},
               starts=[s for s in range(w, T, w)], notes=(note,))


def padded_decode(runner: Runner, tokens: Tensor, opts, capture, on_step=None):
    """Per input row: [row, prefix + pads, prefix + other pads], a prefill of all but the last
    DECODED tokens, then each row's next tokens one at a time after its pads (the mask keeps the
    gap); the right-padded rows' real positions laid where the row alone has them."""
    B, T = tokens.shape
    W = T - DECODED  # the prefill's width
    if W < 2:
        raise ValueError(f"padded-decode needs more than {DECODED + 1} tokens")
    L = padded_length(W)
    ids = pad_ids(runner, tokens)
    rows_l, rows_h = [], []
    for b in range(B):
        row = tokens[b]
        batch, mask = _padded_rows(row[:W], L, ids, left=False)
        cache = runner.new_cache(3, T)
        outs = [runner.step_padded(batch, mask, cache, capture, prefill=True)]
        for k in range(DECODED):  # the row's next token at W + k; the padded rows' at L + k
            nxt = torch.stack([row[W + k], row[L + k], row[L + k]]).unsqueeze(1)
            mask = torch.cat([mask, mask.new_ones(3, 1)], dim=1)
            outs.append(runner.step_padded(nxt, mask, cache, capture, prefill=False))
        stack = _outputs(outs) if capture else _outputs(outs)[:1]  # (3, T, ...): W prefilled, then DECODED
        laid = _laid(stack, lambda x, r: torch.cat([x[r, :L], x[r, W:], x[0, L + DECODED:]]))
        rows_l.append(laid[0])
        rows_h.append(laid[1:] or None)
        if on_step is not None and b == B - 1:
            on_step(T)
    note = (f"padded-decode: each row beside its first {L} tokens right-padded to {W} with id {ids[0]} and with "
            f"id {ids[1]}, then {DECODED} tokens decoded one at a time after the pads, with the mask; padding is "
            "not compared")
    return Ran(torch.cat(rows_l, dim=0), _cat(rows_h, 0) if capture else None, [W] + [1] * DECODED,
               {PADDING: [L]}, starts=[], notes=(note,))


def window_prompt(T: int, window: Optional[int]) -> int:
    """rollback-window's prompt: ending before the window by half a round's drafts, so the first
    round's held drafts cross it; without a window (or one past T), the rollback's prompt."""
    forwards, width, _ = HELD
    if window is None or window >= T - 1:
        return prompt_len(T, ScheduleOptions())
    return max(1, window - forwards * width // 2)


def rollback_window(runner: Runner, tokens: Tensor, opts, capture, on_step=None):
    """A prefill, then ROUNDS rounds of HELD[0] draft forwards of HELD[1] tokens held for one crop
    of the last HELD[2] (wrong guesses, across the last forward's start); the next round feeds the
    right tokens. The rest of the row then comes in one forward, accepted whole (as does a round
    too short to reject anything): a few forwards, not one per draft to the row's end."""
    B, T = tokens.shape
    forwards, width, reject = HELD
    held = forwards * width
    prompt = window_prompt(T, runner.window)
    vocab = max(int(tokens.max()) + 1, 2)
    cache = runner.new_cache(B, T + held)
    out = runner.step(tokens[:, :prompt], cache, capture)
    logits, caps, steps, starts, cuts = [out.logits.float()], [out.hiddens if capture else None], [prompt], [], []
    pos, rounds = prompt, 0
    while pos < T:
        n = min(held, T - pos) if rounds < ROUNDS else T - pos
        keep = n if n < held or rounds >= ROUNDS else n - reject
        rounds += 1
        draft = tokens[:, pos:pos + n]
        if keep < n:  # wrong guesses: the next id
            draft = torch.cat([draft[:, :keep], (draft[:, keep:] + 1) % vocab], dim=1)
            runner.record(cache)  # no crop between the forwards of this round
        step = width if keep < n else n  # held drafts in forwards of `width`; an accepted rest at once
        for i in range(0, n, step):
            m = min(step, n - i)
            o = runner.step(draft[:, i:i + m], cache, capture)
            take = max(0, min(m, keep - i))  # its accepted positions
            starts.append(pos + i)
            steps.append(m)
            logits.append(o.logits[:, :take].float())
            caps.append([h[:, :take] for h in o.hiddens] if capture and o.hiddens is not None else None)
        if keep < n:
            runner.crop(cache, pos + keep)
            cuts.append(pos + keep)
        pos += keep
        if on_step is not None:
            on_step(keep)
    crossed = (f"the first round's drafts crossing the window of {runner.window} at position {runner.window}"
               if runner.window is not None and prompt < runner.window else "no sliding window to cross")
    note = (f"rollback-window: {ROUNDS} rounds of {forwards} draft forwards of {width} tokens held for one crop of "
            f"the last {reject}, from a prompt of {prompt}, then the rest in one forward: {crossed}")
    return Ran(torch.cat(logits, dim=1), _cat(caps, 1) if capture else None, steps, {ROLLBACK: cuts},
               starts=starts, notes=(note,))


# the census's reproducer of each (`smearcli.engines.transformers.repro`): its values from the boundary's census
# entry (`engines.transformers.boundary.entry`) and the reproducer's length T, at the schedules' default options
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


# the boundaries in combination: run by the census only (registered by `engines.transformers.boundary`, after
# the built-in schedules), each with its own entry, shape and reproducer
PADDED_CHUNKS_REPRO = Repro(
    "The row beside its prefix left-padded with two pad ids, fed in chunks with the mask,",
    boundaries_repro.PADDED_CHUNKS,
    lambda e, T: dict(padded_len=padded_length(T), chunk=chunk_width(T - padded_length(T)),
                      pad_ids=tuple(e.get("pad_ids") or (PAD_ID, PAD_ID + 1)), positions=bool(e.get("positions", True))))
PADDED_DECODE_REPRO = Repro(
    "The row beside its prefix right-padded with two pad ids, then tokens decoded after the pads,",
    boundaries_repro.PADDED_DECODE,
    lambda e, T: dict(prefill=T - DECODED, padded_len=padded_length(T - DECODED), decoded=DECODED,
                      pad_ids=tuple(e.get("pad_ids") or (PAD_ID, PAD_ID + 1)), positions=bool(e.get("positions", True))))
ROLLBACK_WINDOW_REPRO = Repro(
    "A prefill, then rounds of draft forwards held for one crop through their cache API,",
    boundaries_repro.ROLLBACK_WINDOW,
    lambda e, T: dict(prompt=window_prompt(T, e.get("window")), held=HELD, rounds=ROUNDS,
                      drafted=DRAFT - 1))  # as CacheRunner.drafted

COMBINATIONS = (
    Schedule("padded-chunks", "the row beside its prefix left-padded with two pad ids, fed in chunks the padding "
             "ends inside, with the mask", padded_chunks, frozenset({PADDED_STEPS}),
             shape="padding leaks into a row through the cache", census=True, compare=False, repro=PADDED_CHUNKS_REPRO),
    Schedule("padded-decode", "the row beside its prefix right-padded, then tokens decoded one at a time after "
             "the pads, with the mask", padded_decode, frozenset({PADDED_STEPS}),
             shape="padding carried into later steps", census=True, compare=False, repro=PADDED_DECODE_REPRO),
    Schedule("rollback-window", "a prefill, then rounds of draft forwards held for one crop, across the sliding "
             "window", rollback_window, frozenset({CROP, RECORD}), shape="state not rolled back after held drafts",
             shape_at=ROLLBACK, census=True, compare=False, repro=ROLLBACK_WINDOW_REPRO),  # marks: the figures' words are padded's and rollback's
)
