"""The built-in boundaries' parts of the census's standalone reproducer (`steps.Repro`): Python
source that needs torch and transformers only, as `smearcli.engines.transformers.repro` pastes it after the
reproducer's `step(model, ids, cache, pos)`, `their_crop(model, ids)` (rollback through their
cache API, `engines.transformers.repro.their_crop_fragment`) and its constants `T` and `SCHEDULE`. Each is a
`str.format` template (braces doubled) over the fields its `values` gives
(`smearcli.measure.boundaries` pairs them); each defines a function named after its schedule (a dash
becomes an underscore: `padded-chunks` defines `padded_chunks`, `engines.transformers.repro.function_name`).
The boundaries in combination (padded-chunks, padded-decode, rollback-window) rebuild the whole
combination: the padded ones with their own masked cached call (`padded_step`), rollback-window
through `their_crop`'s `generation_cache` and `recording`."""

PADDED = '''L, PAD_ID, POSITIONS = {padded_len!r}, {pad_id!r}, {positions!r}  # padded: real tokens, pad id, position_ids


def padded(model, ids):
    """[row, prefix + right padding, left padding + prefix] in one batch with the mask; the real
    positions laid where the row alone has them (the rest from the row itself)."""
    row = ids[0]
    pad = torch.full((T - L,), PAD_ID, dtype=row.dtype)
    batch = torch.stack([row, torch.cat([row[:L], pad]), torch.cat([pad, row[:L]])])
    mask = torch.ones(3, T, dtype=torch.long)
    mask[1, L:] = 0
    mask[2, :T - L] = 0
    kw = dict(attention_mask=mask, use_cache=True)
    if POSITIONS and "position_ids" in inspect.signature(model.forward).parameters:  # as generate() counts them
        kw["position_ids"] = (mask.cumsum(-1) - 1).clamp_min(0)
    x = model(input_ids=batch, **kw).logits.float()
    return torch.stack([x[0], torch.cat([x[1, :L], x[0, L:]]), torch.cat([x[2, T - L:], x[0, L:]])])
'''

ROLLBACK = '''PROMPT, DRAFT, REJECT, MODE = {prompt!r}, {draft!r}, {reject!r}, {mode!r}  # rollback: crop or copy


def rollback(model, ids):
    """Crop: through their cache API as assisted generation takes drafts back (`their_crop`); copy:
    restored from a copy taken before each draft."""
    return (their_crop if MODE == "crop" else restored)(model, ids)


def restored(model, ids):
    """A prefill, then drafts of DRAFT tokens whose last REJECT are wrong; the cache restored from
    a copy taken before the draft, the accepted tokens fed again."""
    vocab = max(int(ids.max()) + 1, 2)
    out, cache = step(model, ids[:, :PROMPT], None, 0)
    logits, pos = [out], PROMPT
    while pos < T:
        n = min(DRAFT, T - pos)
        keep = n if n < DRAFT else n - REJECT
        draft = ids[:, pos:pos + n]
        if keep < n:
            draft = torch.cat([draft[:, :keep], (draft[:, keep:] + 1) % vocab], dim=1)
        saved = copy.deepcopy(cache) if keep < n else None
        out, cache = step(model, draft, cache, pos)
        logits.append(out[:, :keep])
        if keep < n:
            cache = saved
            if keep:
                _, cache = step(model, ids[:, pos:pos + keep], cache, pos)
        pos += keep
    return torch.cat(logits, dim=1)
'''

# the padded boundaries in combination: a cached call of a padded batch, as generate passes its
# mask and positions to a chunked prefill and to each decode step, and the batch's rows
PADDED_STEP = '''

def padded_step(model, ids, mask, cache, prefill=True):
    """One cached call of a padded batch: the mask (3, past + n) over every position so far, as
    generate() hands it (a decode step gets what the model's prepare_inputs_for_generation keeps
    of it: Mamba's drops it), the positions counted over its real tokens; (logits, the cache)."""
    keyword, n = cache_keyword(model), ids.size(1)
    kw = dict(use_cache=True, attention_mask=mask)
    if cache is not None:
        kw[keyword] = cache
        if not prefill:
            try:
                kept = model.prepare_inputs_for_generation(ids, attention_mask=mask, use_cache=True,
                                                           is_first_iteration=False, **{{keyword: cache}})
                kw["attention_mask"] = kept.get("attention_mask", mask)
            except Exception:
                pass
        if kw["attention_mask"] is None:
            del kw["attention_mask"]
    if POSITIONS and "position_ids" in inspect.signature(model.forward).parameters:
        kw["position_ids"] = (mask.cumsum(-1) - 1).clamp_min(0)[:, -n:]
    if passes_cache_position(model, keyword):
        kw["cache_position"] = torch.arange(mask.size(1) - n, mask.size(1))
    o = model(input_ids=ids, **kw)
    got = out_cache(o)
    if got is None and cache is None:  # the model wants the caller to create its cache
        kw[keyword] = got = caller_cache(model)
        o = model(input_ids=ids, **kw)
    return o.logits.float(), got if got is not None else cache


def padded_rows(row, real, left):
    """(batch (3, len), mask): the row, then its first `real` tokens padded with each of PAD_IDS."""
    out, mask = [row], torch.ones(3, row.size(0), dtype=torch.long)
    for r, pad in enumerate(PAD_IDS, start=1):
        fill = torch.full((row.size(0) - real,), pad, dtype=row.dtype)
        out.append(torch.cat([fill, row[:real]] if left else [row[:real], fill]))
        if left:
            mask[r, :row.size(0) - real] = 0
        else:
            mask[r, real:] = 0
    return torch.stack(out), mask
'''

PADDED_CHUNKS = '''L, CHUNK, PAD_IDS, POSITIONS = {padded_len!r}, {chunk!r}, {pad_ids!r}, {positions!r}  # padded-chunks
''' + PADDED_STEP + '''

def padded_chunks(model, ids):
    """[row, pads + prefix, other pads + prefix] fed in chunks of CHUNK (the pads end inside one),
    the mask over every position so far; real positions laid where the row alone has them."""
    batch, mask = padded_rows(ids[0], L, left=True)
    cache, outs = None, []
    for s in range(0, T, CHUNK):
        out, cache = padded_step(model, batch[:, s:s + CHUNK], mask[:, :s + CHUNK], cache)
        outs.append(out)
    x, p = torch.cat(outs, dim=1), T - L
    return torch.stack([x[0]] + [torch.cat([x[r, p:], x[0, L:]]) for r in (1, 2)])
'''

PADDED_DECODE = '''W, L, DECODED, PAD_IDS, POSITIONS = {prefill!r}, {padded_len!r}, {decoded!r}, {pad_ids!r}, {positions!r}  # padded-decode
''' + PADDED_STEP + '''

def padded_decode(model, ids):
    """[row, prefix + pads, prefix + other pads] prefilled to W, then each row's next DECODED tokens
    one at a time after its pads (the mask keeps the gap); real positions laid as the row alone's."""
    row = ids[0]
    batch, mask = padded_rows(row[:W], L, left=False)
    out, cache = padded_step(model, batch, mask, None)
    outs = [out]
    for k in range(DECODED):
        nxt = torch.stack([row[W + k], row[L + k], row[L + k]]).unsqueeze(1)
        mask = torch.cat([mask, torch.ones(3, 1, dtype=mask.dtype)], dim=1)
        out, cache = padded_step(model, nxt, mask, cache, prefill=False)
        outs.append(out)
    x = torch.cat(outs, dim=1)
    return torch.stack([x[0]] + [torch.cat([x[r, :L], x[r, W:], x[0, L + DECODED:]]) for r in (1, 2)])
'''

ROLLBACK_WINDOW = '''PROMPT, HELD, ROUNDS, DRAFTED = {prompt!r}, {held!r}, {rounds!r}, {drafted!r}  # rollback-window


def rollback_window(model, ids):
    """A prefill, then ROUNDS rounds of HELD[0] draft forwards of HELD[1] tokens held for one crop
    of the last HELD[2] (wrong guesses), as an assistant's cache keeps its drafts until the next
    round crops them, then the rest in one forward; generate's crop(0) after every forward of a
    round that rejects nothing."""
    forwards, width, reject = HELD
    held, vocab = forwards * width, max(int(ids.max()) + 1, 2)
    made = generation_cache(model)
    if made is not None:
        made.activate_past_recording(**recording(made, DRAFTED))  # generate: before the prefill
    out, cache = step(model, ids[:, :PROMPT], made, 0)
    if made is None:  # a cache the model made itself: recorded from the prefill on
        cache.activate_past_recording(**recording(cache, DRAFTED))
    logits, pos, due, rounds = [out], PROMPT, True, 0
    while pos < T:
        n = min(held, T - pos) if rounds < ROUNDS else T - pos
        keep = n if n < held or rounds >= ROUNDS else n - reject
        rounds += 1
        draft = ids[:, pos:pos + n]
        if keep < n:
            draft = torch.cat([draft[:, :keep], (draft[:, keep:] + 1) % vocab], dim=1)
            due = False  # held: no crop between this round's forwards
        size = width if keep < n else n  # held drafts in forwards of HELD[1]; an accepted rest at once
        for i in range(0, n, size):
            if due:
                cache.crop(0)
            out, cache = step(model, draft[:, i:i + size], cache, pos + i)
            logits.append(out[:, :max(0, min(size, keep - i))])
            due = keep == n
        if keep < n:
            cache.crop(keep - n)  # one crop: the tokens of several forwards
            due = False
        pos += keep
    return torch.cat(logits, dim=1)
'''
