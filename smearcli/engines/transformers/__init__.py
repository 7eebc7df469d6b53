"""The transformers engine: Hugging Face models through their own cache API, and the census's
check of every causal LM the installed transformers registers.

```python
from smearcli.engines import transformers as hf
model, info = hf.load("mamba")            # a built-in tiny random config, or a local model dir
check = hf.check_model(model, hf.random_tokens(model, 48), chunks=3)
```

The package's names (`load`, `tiny_model`, `HFRunner`, `check_model`, ...) are those of
`implementation`, imported on first use: the folder's torch-free modules (`releases`, which
`scan --release` and `--bisect` drive from a Python that may never build a model; `files`;
the census's page and known threads) import without torch and transformers, so a misused option
is refused in a fraction of a second.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys


def __getattr__(name: str):
    if name.startswith("__"):
        raise AttributeError(name)
    module = f"{__name__}.{name}"
    if module in sys.modules or importlib.util.find_spec(module) is not None:  # a module of the folder: itself
        return sys.modules.get(module) or importlib.import_module(module)
    implementation = importlib.import_module(f"{__name__}.implementation")
    # its public names are the package's own from now on (looked up here no more)
    globals().update({k: v for k, v in vars(implementation).items() if not k.startswith("_")})
    try:
        return vars(implementation)[name]
    except KeyError:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from None


def __dir__() -> list[str]:
    implementation = importlib.import_module(f"{__name__}.implementation")
    return sorted(set(globals()) | {k for k in vars(implementation) if not k.startswith("_")})
