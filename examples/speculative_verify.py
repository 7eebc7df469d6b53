"""Speculative decoding's verify step under the old and the fixed smear logic.

A draft proposes a few tokens; the target model checks them all in ONE cached forward step and
keeps the prefix it agrees with. That verify step is a multi-token chunk on a non-empty cache,
exactly where nanochat's old smear logic drops the chunk's first predecessor (issue #756). With
a correct target, speculative decoding returns the same text as plain greedy decoding whatever
the draft proposes; with the old logic it does not, and it also rejects good drafts.

Here the draft is the target itself, run token by token with the fixed logic: a perfect draft,
so every rejection is the target's own error.

    python examples/speculative_verify.py [--draft 4] [--new 96] [--checkpoint DIR]
"""

from __future__ import annotations

import argparse
import sys

import torch

from smearcli.gpt import generate, weights

from smearcli.measure import inputs
from smearcli.util.errors import UserError
from smearcli.util.threads import use_threads

PROMPT = "import sys\n\n\ndef parse_args(argv):\n    \"\"\"Parse the command line.\"\"\"\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--checkpoint", help="a byte-level nanochat checkpoint directory (default: the tiny model)")
    ap.add_argument("--draft", type=int, default=4, help="tokens proposed per verify step")
    ap.add_argument("--new", type=int, default=96, help="bytes to generate")
    ap.add_argument("--prompt", default=PROMPT)
    args = ap.parse_args(argv)
    print(use_threads())  # the rule every smearcli command uses: 1 thread on a busy machine
    torch.manual_seed(0)
    try:
        lm = weights.byte_model(args.checkpoint)
    except UserError as e:
        print(e, file=sys.stderr)
        return 2
    model = lm.model
    prompt = inputs.encode(args.prompt)
    greedy = inputs.decode(generate.generate(model, prompt, args.new, logic="reference"))
    print(f"model {lm.name}; prompt {len(prompt)} bytes, {args.new} new bytes, drafts of {args.draft}\n")
    print(f"greedy (reference): {greedy!r}")
    for logic in ("fixed", "old"):
        r = generate.speculative_generate(model, prompt, args.new, args.draft, logic)
        out = inputs.decode(r.ids)
        at = generate.first_divergence(out, greedy)
        print(f"\nspeculative, {logic} logic: {r.verify_steps} verify steps, "
              f"{r.accepted}/{r.proposed} draft tokens accepted ({100 * r.acceptance:.0f}%)")
        print(f"  {generate.mark_divergence(out, at)!r}")
        print("  same text as greedy decoding" if at is None else f"  differs from greedy at character {at}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
