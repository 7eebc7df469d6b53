"""Our GPT (`smearcli.gpt.model`) as runners: one per smear logic, on the same weights.

```python
from smearcli.gpt import gpt_runners, weights
model = weights.tiny_model().model
old, fixed = gpt_runners.runners(model, ["old", "fixed"], name="tiny@500")
```
"""

from __future__ import annotations

from typing import Optional, Sequence

import torch

from .model import GPT
from ..util.defaults import layer_names
from ..measure.runner import (
    BOS_DOCUMENTS, COPY, CROP, DOCUMENT_MASK, EXPAND, SMEAR_TERMS, Described, ModelRunner, Output,
)
from .smear import ONE_TOKEN_STEP, TAKES_BOS, get_logic

SERIES = {"old": "old logic (upstream)", "fixed": "fixed logic",  # the legend's words per logic
          "bosmask": "fixed logic, no smear at BOS"}


class GPTRunner(ModelRunner):
    """Our GPT with its KVCache under one smear logic (`smearcli.gpt.smear.LOGICS`). Captures the
    post-smear embedding (`emb`) and every block's output. `bos`: the BOS id, which a BOS-masked
    logic needs (and which the packed schedule's documents begin with)."""

    capabilities = frozenset({EXPAND, SMEAR_TERMS, CROP, COPY, DOCUMENT_MASK, BOS_DOCUMENTS})
    thread_safe = True  # GPT.forward writes only the cache it is given (and its rotary table, once)
    fresh_outputs = True  # its logits and captures are new tensors of each call, never written after it

    def __init__(self, model: GPT, logic: str, name: str = "model", bos: Optional[int] = None):
        get_logic(logic)  # an unknown logic fails here, not in the first forward
        if logic in TAKES_BOS and bos is None:
            raise ValueError(f"the {logic} logic needs the BOS token id (bos=)")
        self.model, self.label, self.name, self.bos = model, logic, name, bos
        self.series = SERIES.get(logic, f"{logic} logic")
        self.layers = tuple(layer_names(model.config.n_layer))
        # logics whose one-token step is the same function run the same decode, bit for bit
        fn = ONE_TOKEN_STEP.get(logic)
        self.one_token_step = None if fn is None else (id(model), fn)

    def describe(self) -> Described:
        cfg = self.model.config
        return Described(self.label, self.series, self.name, cfg.shape,
                         str(self.dtype).removeprefix("torch."), str(self.device), cfg.to_dict(),
                         float(f"{float(self.model.smear_lambda):.6g}"))

    def _call(self, tokens, cache, capture: bool, documents=None) -> Output:
        cap = [] if capture else None
        logits = self.model(tokens, cache=cache, smear=self.label, capture=cap, bos=self.bos,
                            documents=documents)
        if cache is not None:  # the ids seen, for the smear state of a cropped cache
            seen = getattr(cache, "ids", None)
            cache.ids = tokens if seen is None else torch.cat([seen, tokens], dim=1)
        return Output(logits, cap)

    def forward_documents(self, tokens, lengths, capture):
        return self._call(tokens, None, capture, documents=list(lengths))

    def forward(self, tokens, capture):
        return self._call(tokens, None, capture)

    def new_cache(self, batch, max_len):
        return self.model.new_cache(batch, max_len)

    def step(self, tokens, cache, capture):
        return self._call(tokens, cache, capture)

    def expand(self, cache, rows, max_len):
        out = self.model.new_cache(rows, max_len)
        out.expand_from(cache)  # prev_embedding included
        return out

    def crop(self, cache, length):
        """Keep positions [0, length): the smear state is the pre-smear embedding of the last kept token."""
        cache.ids = cache.ids[:, :length]
        prev = self.model.smear_terms(cache.ids[:, -1:])[0]
        cache.truncate(length, prev)

    def copy(self, cache):
        out = cache.copy()
        out.ids = getattr(cache, "ids", None)
        return out

    def smear_terms(self, tokens):
        return self.model.smear_terms(tokens, self.bos if self.label in TAKES_BOS else None)

    def float64(self):
        """This logic on a float64 copy of the weights (`precision.float64_model`, made once per model)."""
        from ..measure.precision import float64_model

        m64 = float64_model(self.model)
        if m64.dtype != torch.float64:  # activations and the rotary table in float64 too
            m64.dtype, m64._rotary_device = torch.float64, None
        return GPTRunner(m64, self.label, self.name, self.bos)


def runners(model: GPT, logics: Sequence[str], name: Optional[str] = None,
            bos: Optional[int] = None) -> list[GPTRunner]:
    """One runner per logic, in the order given."""
    return [GPTRunner(model, logic, name or "model", bos) for logic in logics]
