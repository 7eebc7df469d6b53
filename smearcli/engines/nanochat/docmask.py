"""A packed row through the user's own forward pass with attention kept inside each document: the
packed schedule's split of a leak (`Runner.forward_documents`) for a checkout whose GPT takes no
document mask.

nanochat's uncached forward computes attention with `torch.nn.functional.scaled_dot_product_attention`
(its `flash_attention._sdpa_attention`, the path the sandbox forces: a causal call, or an explicit
causal-and-window mask). While `document_attention` is active, that function (the attribute of
`torch.nn.functional`, and any name a module of the checkout bound to it at import, under any
alias) is replaced by one that intersects the mask each call asks for with the document-causal
mask of the row (`smearcli.gpt.model.document_mask`) and calls the real function with it. Nothing
else of the user's code changes: their projections, rotary, norms, windows and smear run as
written, so what attention computes is theirs, restricted to each document. A boolean mask stays
boolean (the mask our GPT gives the same kernel for the same row); an additive float mask gets
-inf outside the documents.

The mask is only trusted when every layer's attention went through it: one call per block, each
over the whole row (queries and keys of the row's length) and causal. Otherwise (FA3 or a kernel
of their own, a call that is not over the row, a non-causal one) the real function runs as asked
and `DocumentAttention.check` raises `runner.NoDocumentMask` with the reason afterwards: an
exception raised inside their code would read as their bug.

```python
with document_attention(lengths, code.modules.values(), device) as patch:
    logits = net(tokens)
patch.check(n_layer)
```
"""

from __future__ import annotations

import contextlib
from typing import Iterable, Optional

import torch
import torch.nn.functional as F

from ...gpt.model import document_mask
from ...measure.runner import NoDocumentMask

SDPA = "scaled_dot_product_attention"


class DocumentAttention:
    """The replacement for torch's SDPA while a packed row runs, and what it saw."""

    def __init__(self, lengths, device, real):
        self.doc = document_mask(list(lengths), device)  # (T, T), causal within each document
        self.T = self.doc.size(0)
        self.causal = torch.ones(self.T, self.T, dtype=torch.bool, device=device).tril()
        self.real = real
        self.calls = 0
        self.problem: Optional[str] = None

    def _refuse(self, why: str) -> None:
        if self.problem is None:
            self.problem = why

    def __call__(self, query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
                 enable_gqa=False):
        T, doc = self.T, self.doc
        mask = None
        if query.size(-2) != T or key.size(-2) != T:
            self._refuse(f"an attention call over {query.size(-2)} queries and {key.size(-2)} keys, not the "
                         f"row's {T} tokens")
        elif attn_mask is None:
            if is_causal:
                mask = doc
            else:
                self._refuse("an attention call over the row that is not causal")
        elif is_causal:
            self._refuse("an attention call with both a mask and is_causal")
        elif attn_mask.dtype == torch.bool or attn_mask.is_floating_point():
            sees = attn_mask if attn_mask.dtype == torch.bool else ~torch.isneginf(attn_mask)
            if bool((sees & ~self.causal).any()):  # intersecting would change what their code computes
                self._refuse("an attention call whose mask lets a query see later keys")
            elif attn_mask.dtype == torch.bool:
                mask = attn_mask & doc
            else:
                mask = attn_mask.masked_fill(~doc, float("-inf"))
        else:
            self._refuse(f"an attention mask of dtype {attn_mask.dtype}")
        if mask is None:  # as asked: the run goes on, and `check` says why it does not count
            return self.real(query, key, value, attn_mask=attn_mask, dropout_p=dropout_p, is_causal=is_causal,
                             scale=scale, enable_gqa=enable_gqa)
        self.calls += 1
        return self.real(query, key, value, attn_mask=mask, dropout_p=dropout_p, is_causal=False, scale=scale,
                         enable_gqa=enable_gqa)

    def check(self, n_layer: int) -> None:
        """NoDocumentMask unless exactly one masked call per block ran and nothing was refused."""
        if self.problem is not None:
            raise NoDocumentMask(f"its attention made {self.problem}, which a document mask cannot be "
                                 "laid over")
        if self.calls == 0:
            raise NoDocumentMask("its attention does not call torch.nn.functional.scaled_dot_product_attention "
                                 "(FA3 or a kernel of its own), where the document mask is laid")
        if self.calls != n_layer:
            raise NoDocumentMask(f"its forward made {self.calls} attention calls for {n_layer} blocks, "
                                 "so which of them the document mask reached is unknown")


@contextlib.contextmanager
def document_attention(lengths, modules: Iterable, device):
    """Within the block, torch's SDPA (and each module-level name bound to it in `modules`) masks
    attention to the documents of `lengths`; everything is restored afterwards."""
    real = getattr(F, SDPA)
    patch = DocumentAttention(lengths, device, real)
    bound = [(m, name) for m in modules for name, v in list(vars(m).items()) if v is real]
    setattr(F, SDPA, patch)
    for m, name in bound:
        setattr(m, name, patch)
    try:
        yield patch
    finally:
        setattr(F, SDPA, real)
        for m, name in bound:
            setattr(m, name, real)
