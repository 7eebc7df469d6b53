"""Engines: code we did not write that runs a model through its own cached paths, one folder each.

An engine's folder holds everything of it: its runner (`implementation`, whose names the folder's
package lends on first use) and the worker that runs in the engine's own Python (`worker`,
`environment`), its census session (`session`: what `scan --engine` runs on one architecture), its
command-line preparation (`prepare`: what `compare --impl` does before a run, the one module of the
folder in the CLI's layer; not named `cli`: the worker's folder comes first on the worker's
sys.path, and a name some package imports would be shadowed there), and its one registration
(`registration`: its `compare --impl` implementation and its census, `engines.registry`), which
names those modules as strings, so that `--help` imports none of them. Importing this package
registers every built-in engine.

- `engines.transformers`: a Hugging Face transformers model through its own cache API, and the census's
  check of every causal LM (the modules only that census uses: layer orders' runs, boundaries, where an
  error is born, ties, groups, reach, reproducers and drafts);
- `engines.vllm`: vLLM, in its own environment (scripts/make_env.sh vllm);
- `engines.llamacpp`: llama.cpp through llama-cpp-python, in its own environment
  (scripts/make_env.sh llamacpp);
- `engines.nanochat`: a user's nanochat checkout (import sandbox, guard, `adapter.NanochatRunner`,
  the audit, the fix) and `prepare`, `--impl ours|nanochat|both` (our GPT's runners are core).

The census core (`smearcli.census`) imports no engine and names none; the other engines still reach
into transformers' reference and CLI preparation, listed in `tests/core/test_layout.py` (`TO_CUT`) to
be cut (CONTRIBUTING.md draws where they are going).
"""

# the built-in engines, in the order `--impl` and `--engine` list them
from .nanochat import registration as nanochat_registration  # noqa: F401, E402
from .transformers import registration as transformers_registration  # noqa: F401, E402
from .vllm import registration as vllm_registration  # noqa: F401, E402
from .llamacpp import registration as llamacpp_registration  # noqa: F401, E402
