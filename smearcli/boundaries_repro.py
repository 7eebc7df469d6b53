"""The built-in boundaries' parts of the census's standalone reproducer (`steps.Repro`): Python
source that needs torch and transformers only, as `smearcli.census.repro` pastes it after the
reproducer's `step(model, ids, cache, pos)`, `their_crop(model, ids)` (rollback through their
cache API, `census.repro.their_crop_fragment`) and its constants `T` and `SCHEDULE`. Each is a
`str.format` template (braces doubled) over the fields its `values` gives
(`smearcli.boundaries` pairs them); each defines a function named after its schedule."""

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
