"""Audit a nanochat checkpoint directory for the chunked-prefill smear bug (issue #756).

Loads the checkpoint (newest step unless --step), runs every schedule under the old and the
fixed smear logic against the full forward pass, and prints smearcli's table and verdict: the
same library calls `smearcli compare --checkpoint DIR` makes.

    python examples/audit_checkpoint.py ~/.cache/nanochat/base_checkpoints/d20
    python examples/audit_checkpoint.py            # the tiny model that ships with smearcli

Exit status 1 when the fixed logic fails anywhere (it should not), else 0.
"""

from __future__ import annotations

import argparse
import sys

from smearcli.measure import compare, inputs

from smearcli.gpt import weights
from smearcli.gpt.weights import load_checkpoint
from smearcli.render.table import console, print_comparison
from smearcli.measure.schedules import ScheduleOptions
from smearcli.util.threads import use_threads

SAMPLE = "def fib(n):\n    a, b = 0, 1\n    for _ in range(n):\n        a, b = b, a + b\n    return a\n" * 3


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("checkpoint", nargs="?", help="checkpoint directory (default: the tiny model)")
    ap.add_argument("--step", type=int)
    ap.add_argument("--seq-len", type=int, default=256, help="input length for non-byte-level models")
    ap.add_argument("--chunks", type=int, default=4)
    ap.add_argument("--schedules", default=",".join(compare.DEFAULT_SCHEDULES),
                    help="comma-separated schedules to run (default: all)")
    args = ap.parse_args(argv)
    print(use_threads())  # the rule every smearcli command uses: 1 thread on a busy machine
    lm = load_checkpoint(args.checkpoint, args.step) if args.checkpoint else weights.tiny_model()
    model = lm.model
    if model.config.is_byte_level:
        tokens = inputs.text_tokens(SAMPLE, model.config)  # real text: a byte-level model reads it as is
    else:
        tokens = inputs.random_tokens(model.config, args.seq_len)  # no tokenizer is ever unpickled
    schedules = [s.strip() for s in args.schedules.split(",") if s.strip()]
    result = compare.compare(model, tokens, schedules, options=ScheduleOptions(chunks=args.chunks))
    cfg = model.config
    print_comparison(result, console(), f"{lm.name}: d{cfg.n_layer} n_embd {cfg.n_embd}, "
                     f"smear_lambda {float(model.smear_lambda):.3f}, {tokens.size(1)} tokens")
    fixed_failures = [m for m in result.failures if m.logic == "fixed"]
    return 1 if fixed_failures else 0


if __name__ == "__main__":
    sys.exit(main())
