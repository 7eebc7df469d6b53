"""nanochat's registration (`engines.registry`): `--impl ours` (our reimplementation of nanochat's
GPT, whose runners are core), `--impl nanochat` (a user's checkout) and `--impl both`. No census
runs them."""

from __future__ import annotations

from ..registry import COMMANDS, Implementation, register

NANOCHAT_OPTIONS = ("nanochat_path", "user_code_timeout")
# what each runs is what its runners declare (`smearcli.measure.runner`): our GPT has no padding mask; a
# user's checkout runs packed (its documents alone against the packed row, the attention split
# through its own SDPA calls masked to the documents) but neither padded nor, as it can neither crop
# nor copy its cache, rollback
OURS = "smearcli.gpt.gpt_runners:GPTRunner"
NANOCHAT = "smearcli.engines.nanochat.adapter:NanochatRunner"
PREPARE = "smearcli.engines.nanochat.prepare:prepare"
CHECKOUT = (("nanochat_path", "DIR (a nanochat checkout)"),)

register(
    Implementation("ours", "smearcli's reimplementation of nanochat's GPT; {logic} picks the smear", PREPARE,
                   commands=COMMANDS, runners=(OURS,)),
    Implementation("nanochat", "your checkout at {nanochat_path}: its own GPT, forward pass and KVCache, on the "
                   "same weights", PREPARE, needs=CHECKOUT, owns=NANOCHAT_OPTIONS, runners=(NANOCHAT,)),
    Implementation("both", "your checkout and ours side by side (ours then runs old and fixed)", PREPARE,
                   needs=CHECKOUT, owns=NANOCHAT_OPTIONS, runners=(NANOCHAT, OURS)))
