"""The transformers census's reading of an architecture's layer orders (`tiny.layers` makes them:
one tiny config per layer kind, that kind as layer 0).

`combine(records, names)` makes one architecture's record of its orders' records: the worst verdict
(`judge.of_orders`) heads it, and `variants` lists every order with its verdict and numbers. A
finding seen only in an order the default configuration does not have (another kind as layer 0) is
`latent`: real code, but no configuration as shipped runs it, so it is not counted as a bug; unless
a published configuration has that layer 0 (`PUBLISHED`, each with where it is said).
"""

from __future__ import annotations

import dataclasses
from typing import Optional

from ...judging import judge
from ...judging.verdicts import LATENT
from ...census.record import Record, Variant

# Layer 0 as published configurations have it, where it differs from the config class's defaults:
# a finding in that order is reachable as shipped, so not latent. Each with where it is said.
PUBLISHED = {
    # MiniMax-Text-01 (and M1): attn_type_list [0, 0, 0, 0, 0, 0, 0, 1] x 10, 0 = lightning (linear)
    # attention, so layer 0 is linear; MiniMaxConfig() puts full attention first
    "minimax": ("linear_attention", "MiniMax-Text-01's config: attn_type_list [0]*7 + [1], repeated; "
                                    "0 is linear (lightning) attention"),
}
# the numbers a variant's line keeps: what a finding needs to be read without the head record
KEPT = ("verdict", "worst_schedule", "max_abs", "multiple", "shape", "born_at", "born_in", "init", "reason")


def combine(records: list[Record], names: list[list[str]]) -> Record:
    """One architecture's record of its orders' records (`names[i]`: record i's layer order, layer 0
    first; record 0 is the defaults' order). One order: its record as it is. Several: a finding
    (bug, unconfirmed) of an order other than the defaults' counts as `latent` (`real`); the first
    record with the worst of those verdicts among the orders that were built (`judge.of_orders`)
    heads it, with its `order`; `variants` lists each order's own verdict and numbers. An order
    whose config or model cannot be built does not decide the verdict while another order runs
    (the config class refused that order: not a finding)."""
    if len(records) == 1:
        return records[0]
    said = [real(r, i, names[i][0] if names[i] else None) for i, r in enumerate(records)]
    word, at = judge.of_orders(said)
    head = records[at]
    out = dataclasses.replace(head, verdict=said[at])
    out.order = names[at]
    out.variants = [Variant(o, **{k: getattr(r, k) for k in KEPT}) for r, o in zip(records, names)]
    if at and word == LATENT:
        out.notes = list(head.notes or []) + [
            f"latent: {head.verdict} only with layer 0 '{names[at][0]}', which the default configuration does "
            f"not have (its layer 0 is '{names[0][0]}', where it is {records[0].verdict}); not counted as a bug"]
    elif at:
        shipped = published(head, names[at][0])
        out.notes = list(head.notes or []) + [
            f"{word} only with layer 0 '{out.order[0]}'; in the defaults' order (layer 0 "
            f"'{names[0][0]}') it is {records[0].verdict}"
            + (f"; a published configuration has that layer 0 ({shipped})" if shipped else "")]
    return out


def published(record: Record, first: Optional[str]) -> Optional[str]:
    """Where a published configuration of `record`'s architecture is said to have layer 0 of kind
    `first` (`PUBLISHED`), or None."""
    known = PUBLISHED.get(record.model_type)
    return known[1] if known and first is not None and known[0] == first else None


def real(record: Record, i: int, first: Optional[str] = None) -> str:
    """The verdict an order's record gives the architecture: a finding of a layer order (`i` > 0:
    another kind as layer 0, `first`) that neither the default configuration nor a published one
    (`PUBLISHED`) has is `latent`."""
    v = record.verdict
    word = judge.in_layer_order(v, default_order=not i, published=bool(published(record, first)))
    return str(word) if word is LATENT else v
