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

from ...util.named import lend

__getattr__, __dir__ = lend(globals())
