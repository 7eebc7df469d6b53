"""Implementations of code we did not write that are not (yet) engines, each behind
`smearcli.runner.Runner`:

- `impls.nanochat`: a user's nanochat checkout (import sandbox, `adapter.NanochatRunner`, the
  audit, the fix);
- `impls.foreign`: what every engine run in its own Python shares (the handshake, capped reads).

transformers, vLLM and llama.cpp are engines with a folder each (`smearcli.engines`). Our own GPT's
runners are core (`smearcli.gpt_runners`). `smearcli.compare` measures any runner the same way, and
the CLI reaches each through its registry (`smearcli.cli.registry`).
"""
