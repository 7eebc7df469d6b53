"""Implementations of code we did not write, each behind `smearcli.runner.Runner`:

- `impls.nanochat`: a user's nanochat checkout (import sandbox, `adapter.NanochatRunner`, the
  audit, the fix);
- `impls.hf`: a Hugging Face transformers model through its own cache API (`hf.HFRunner`).

vLLM and llama.cpp are engines with a folder each (`smearcli.engines`). Our own GPT's runners are core (`smearcli.gpt_runners`). `smearcli.compare` measures any runner the
same way, and the CLI reaches each through its registry (`smearcli.cli.registry`).
"""
