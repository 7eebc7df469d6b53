"""Multi-turn chat on one KV cache, under the old and the fixed smear logic.

A chat engine keeps the cache between turns: the model's reply is decoded one token at a time,
then the next user turn is appended as ONE multi-token step on the non-empty cache. That step
is a chunk in the sense of nanochat issue #756: under the old logic its first token loses the
smear contribution of the token before it (the end of the previous reply), so everything that
follows is computed from a slightly wrong embedding. A reference session without a cache shows
what the model really says.

    python examples/chunked_chat.py                    # the tiny model that ships with smearcli
    python examples/chunked_chat.py --checkpoint DIR   # any byte-level nanochat checkpoint
"""

from __future__ import annotations

import argparse
import sys

import torch

from smearcli.gpt import generate, weights

from smearcli.measure import inputs
from smearcli.util.errors import UserError
from smearcli.util.threads import use_threads

# A "chat" for a model trained on Python source: each user turn starts a method of a dict-like
# class and the model's reply completes it. With the shipped tiny model and 16-byte replies, the
# old logic's reply to turns 2 and 3 differs from the reference (a wrong indentation, then other
# code) while the fixed logic's matches every turn; checked by tests/docs/test_examples.py.
TURNS = [
    "    def get(self, key, default=None):\n        ",
    "\n    def set(self, key, value):\n        ",
    "\n    def delete(self, key):\n        ",
]


def chat(model, logic: str, turns, reply_len: int) -> tuple[list[str], list[int]]:
    """Run every turn on one session; returns the replies and the step sizes fed."""
    s = generate.session(model, logic, max_len=sum(len(inputs.encode(t)) for t in turns) + len(turns) * reply_len + 1)
    replies = []
    for turn in turns:
        s.feed(inputs.encode(turn))  # the whole turn in one step
        replies.append(inputs.decode(s.generate(reply_len)))
    return replies, s.steps


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--checkpoint", help="a byte-level nanochat checkpoint directory (default: the tiny model)")
    ap.add_argument("--reply-len", type=int, default=16, help="bytes generated per reply")
    args = ap.parse_args(argv)
    torch.manual_seed(0)
    print(use_threads())  # the rule every smearcli command uses: 1 thread on a busy machine
    try:
        lm = weights.byte_model(args.checkpoint)
    except UserError as e:
        print(e, file=sys.stderr)
        return 2
    model = lm.model

    results = {logic: chat(model, logic, TURNS, args.reply_len) for logic in ("reference", "fixed", "old")}
    ref = results["reference"][0]
    print(f"model {lm.name}: smear_lambda {float(model.smear_lambda):.3f}; {len(TURNS)} turns, "
          f"{args.reply_len} bytes per reply\n")
    for i, turn in enumerate(TURNS):
        print(f"--- turn {i + 1}: user sends {turn!r}")
        for logic in ("reference", "fixed", "old"):
            reply = results[logic][0][i]
            at = generate.first_divergence(reply, ref[i])
            mark = "same as reference" if at is None else f"differs from character {at}"
            print(f"{logic:>9}: {generate.mark_divergence(reply, at)!r}  ({mark})")
    same = {logic: results[logic][0] == ref for logic in ("fixed", "old")}
    print(f"\nfixed logic reproduces the reference: {same['fixed']}; old logic: {same['old']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
