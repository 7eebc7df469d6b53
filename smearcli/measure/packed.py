"""How much of one document reaches the next when documents are packed in one row: the packed
schedule's measurement, per document, split into the smear's part and attention's part.

nanochat's training loader packs BOS-started documents back to back in each row; at inference a
conversation starts at position 0, its BOS with no predecessor. The packed schedule
(`smearcli.measure.boundaries`) runs each document alone against the packed row's full pass (what training
sees). Here, per runner (each against its own packed row) and per document:

- the leak: max |dlogit| at the document's BOS, over its first `first` tokens, over all of it;
- the smear's part at the BOS, checked analytically: the post-smear embedding of the BOS in the
  packed row differs from the document alone by exactly gate(BOS) * x_prev (x_prev: the pre-smear
  embedding of the previous document's last token), zero under the BOS-masked logic;
- the packed row run again with a document-causal attention mask (`Runner.forward_documents`):
  what it still differs from the document alone is the smear's part; what it differs from the
  packed row is attention's part. A runner with no document mask (or whose `forward_documents`
  raises `runner.NoDocumentMask`) is measured without the split, and the table, verdict and JSON
  say that attention's part was not measured and why: never a zero.

A leak is a measurement of training against inference, not a bug: the verdict says so, and
`limit` (a max |dlogit| over each document's first tokens) makes it a gate.

```python
from smearcli.gpt import gpt_runners, weights
from smearcli.measure import packed
model = weights.tiny_model().model
tokens = packed.packed_tokens(model.config.vocab_size, (100, 60, 96), packed.default_bos(model.config))
result = packed.measure(gpt_runners.runners(model, ["old", "fixed", "bosmask"], bos=0), tokens, (100, 60, 96))
print(result.table())
```
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional, Sequence

import torch
from torch import Tensor

from .boundaries import document_starts
from .compare import Comparison, compare
from .jsondoc import SCHEMAS, header, model_header
from ..util.defaults import FIRST_TOKENS, NOISE_MARGIN, PACKED
from .owned import Owned
from .runner import DOCUMENT_MASK, SMEAR_TERMS, NoDocumentMask, Runner
from .steps import ScheduleOptions
from ..util.formatters import sci, times

BYTE_BOS = 0  # a byte-level model has no <|bos|>: byte 0 (NUL, absent from text) stands in for it
NANOCHAT_SPECIALS = 9  # nanochat appends 9 special tokens after the merges, <|bos|> first
SCHEMA = SCHEMAS["packed"]


def default_bos(config) -> int:
    """The BOS id when no tokenizer says: byte 0 for a byte-level model, else the first special
    token of nanochat's layout (vocab_size - 9)."""
    return BYTE_BOS if config.is_byte_level else config.vocab_size - NANOCHAT_SPECIALS


def packed_tokens(vocab_size: int, lengths: Sequence[int], bos: int, seed: int = 0, batch: int = 1) -> Tensor:
    """(batch, sum(lengths)) seeded random ids, BOS at each document's start and nowhere else."""
    g = torch.Generator().manual_seed(seed)
    t = torch.randint(0, vocab_size - 1, (batch, sum(lengths)), generator=g)
    t = t + (t >= bos).long()  # every id but bos
    t[:, document_starts(lengths)] = bos
    return t


@dataclass
class DocumentLeak:
    index: int
    start: int
    length: int
    bos: float  # max |dlogit| at the BOS: packed row against the document alone
    first: float  # the same over the first tokens
    whole: float  # over the whole document
    smear_predicted: Optional[float]  # max |gate(BOS) * x_prev| (0 for the first; None: no smear terms)
    smear_measured: float  # max |packed - alone| of the BOS's post-smear embedding
    smear_residual: Optional[float]  # max |(packed - alone) - gate(BOS) * x_prev| there: rounding
    masked_first: Optional[float] = None  # document mask on: what is left (the smear's part)
    attention_first: Optional[float] = None  # packed against packed with the mask (attention's part)


@dataclass
class LogicLeak:
    label: str
    comparison: Comparison  # the packed schedule against this runner's own packed row
    documents: list[DocumentLeak]
    gate_at_bos: Optional[float]  # the gate the smear gives a BOS token (0 where the logic masks it)
    noise: float  # the logits noise floor of this runner's comparison
    unsplit: Optional[str] = None  # why attention's part was not measured (None: it was)

    def worst(self, attr: str = "first") -> float:
        vals = [getattr(d, attr) for d in self.documents[1:] if getattr(d, attr) is not None]
        return max(vals, default=0.0)


@dataclass
class PackedResult:
    lengths: list[int]
    bos: int
    first: int
    logics: list[LogicLeak]
    limit: Optional[float] = None
    notes: list[str] = field(default_factory=list)

    def get(self, label: str) -> LogicLeak:
        return next(lg for lg in self.logics if lg.label == label)

    @property
    def failed(self) -> bool:
        return self.limit is not None and any(lg.worst() > self.limit for lg in self.logics)

    @property
    def verdict(self) -> str:
        return verdict(self)

    def table(self) -> str:
        return table(self)


def _max(x: Tensor) -> float:
    return float(x.abs().max()) if x.numel() else 0.0


@torch.inference_mode()
def measure(runners: Sequence[Runner], tokens: Tensor, lengths: Sequence[int], first: int = FIRST_TOKENS,
            limit: Optional[float] = None, tolerance: float = NOISE_MARGIN, progress=None,
            tokens_progress=None, notes: Sequence[str] = ()) -> PackedResult:
    """The packed schedule on each runner against its own packed row, per document (see the module)."""
    lengths = list(lengths)
    starts = document_starts(lengths)
    bos = int(tokens[0, 0])
    opts = ScheduleOptions(documents=tuple(lengths))
    out = []
    for r in runners:
        c = compare(r, tokens, [PACKED], options=opts, tolerance=tolerance, progress=progress,
                    tokens_progress=tokens_progress, notes=notes)
        ref, alone = c.reference, c.runs[0]
        masked, unsplit = None, f"{r.label} takes no document mask"
        if r.can(DOCUMENT_MASK):
            try:
                masked = Owned(r, PACKED).forward_documents(tokens.to(r.device), lengths, True)  # checked, copied
                unsplit = None
            except NoDocumentMask as e:
                unsplit = str(e)
        terms = r.smear_terms(tokens.to(r.device)) if r.can(SMEAR_TERMS) else None
        dl = (ref.logits - alone.logits).abs().amax(dim=(0, 2))  # (T,)
        docs = []
        for i, (s, n) in enumerate(zip(starts, lengths)):
            k = min(first, n)
            d = DocumentLeak(i, s, n, float(dl[s]), float(dl[s:s + k].max()), float(dl[s:s + n].max()),
                             0.0, 0.0, 0.0)
            if ref.hiddens is not None and alone.hiddens is not None:
                diff = (ref.hiddens[0][:, s] - alone.hiddens[0][:, s]).float()
                term = torch.zeros_like(diff)
                if terms is not None and s > 0:
                    x, gate, scale = terms
                    term = (scale * gate[:, s] * x[:, s - 1]).float()
                d.smear_predicted, d.smear_measured, d.smear_residual = _max(term), _max(diff), _max(diff - term)
                if terms is None and s > 0:  # no gate to check against: not a zero
                    d.smear_predicted = d.smear_residual = None
            if masked is not None:
                ml = masked.logits.float()
                d.masked_first = _max(ml[:, s:s + k] - alone.logits[:, s:s + k])
                d.attention_first = _max(ref.logits[:, s:s + k] - ml[:, s:s + k])
            docs.append(d)
        gate = None if terms is None else float(terms[1][:, 0].max())  # position 0 holds a BOS
        out.append(LogicLeak(r.label, c, docs, gate, c.noise.per_layer[-1], unsplit))
    return PackedResult(lengths, bos, first, out, limit, list(notes))


def title(p: PackedResult) -> str:
    """The line above the table: what was packed and against what."""
    return (f"{len(p.lengths)} documents packed in one row ({','.join(map(str, p.lengths))}), each "
            f"starting with BOS (id {p.bos}), against each document run alone; max |dlogit| per document")


def table_data(p: PackedResult) -> tuple[list[str], list[list[str]]]:
    """(column names, rows): per logic and document, the leak at the BOS and over the first tokens,
    in logits and as multiples of the noise floor, its split, and the analytic check."""
    head = ["logic", "doc", "start", "len", "BOS", "xnoise", f"first {p.first}", "xnoise", "smear part",
            "attention part", "emb@BOS", "gate*x_prev", "residual"]
    opt = lambda v: "-" if v is None else sci(v)  # noqa: E731
    rows = [[lg.label, str(d.index), str(d.start), str(d.length), sci(d.bos), times(d.bos / lg.noise),
             sci(d.first), times(d.first / lg.noise), opt(d.masked_first), opt(d.attention_first),
             sci(d.smear_measured), opt(d.smear_predicted), opt(d.smear_residual)]
            for lg in p.logics for d in lg.documents]
    return head, rows


def legend(p: PackedResult) -> list[str]:
    """The lines under the table: what the split means, the runners it could not split, each
    logic's gate at BOS, and the notes."""
    out = [f"smear part: the packed row with a document-causal attention mask against the document "
           f"alone; attention part: the packed row against that masked row (first {p.first} tokens)"]
    out += [f"{lg.label}: attention's part not measured: {lg.unsplit}" for lg in p.logics if lg.unsplit is not None]
    out += [f"{lg.label}: gate at BOS {lg.gate_at_bos:.3g}: each BOS receives {lg.gate_at_bos:.3g} x the "
            "previous document's last token embedding (rms 1)" for lg in p.logics if lg.gate_at_bos is not None]
    for lg in p.logics:  # the table's last columns in one line, which a narrow console leaves out
        res = [d.smear_residual for d in lg.documents[1:] if d.smear_residual is not None]
        if res:
            out.append(f"analytic check ({lg.label}): at each of {len(res)} later BOS, emb@BOS differs from the "
                       f"document alone by gate*x_prev to within {sci(max(res))}")
    return out + list(p.notes)


def table(p: PackedResult) -> str:
    """The whole report as plain text: title, table (every column), legend, verdict."""
    head, rows = table_data(p)
    widths = [max(len(r[i]) for r in [head] + rows) for i in range(len(head))]
    line = lambda r: "  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths)))  # noqa: E731
    return "\n".join([title(p), line(head)] + [line(r) for r in rows] + legend(p) + [p.verdict])


def verdict(p: PackedResult) -> str:
    """One line: the largest leak per logic, the floor the masks reach, and the gate if one is set."""
    parts = [f"{sci(lg.worst())} under {lg.label} ({times(lg.worst() / lg.noise)}x noise)" for lg in p.logics]
    n = len(p.lengths) - 1
    msg = (f"across {n} document {'boundary' if n == 1 else 'boundaries'}, the largest leak into a document's first "
           f"{p.first} tokens is " + ", ".join(parts))
    both = [lg for lg in p.logics if lg.gate_at_bos == 0.0 and lg.unsplit is None]
    if both:
        lg = both[0]
        m = lg.worst("masked_first")
        msg += f"; with the BOS mask and a document mask {sci(m)} ({times(m / lg.noise)}x noise)"
    unsplit = [lg.label for lg in p.logics if lg.unsplit is not None]
    if unsplit:
        msg += f"; attention's part not measured under {', '.join(unsplit)} (no document mask)"
    msg += " (a measurement of what training sees against what inference sees, not a bug)"
    if p.limit is None:
        return "MEASURED: " + msg
    over = [lg.label for lg in p.logics if lg.worst() > p.limit]
    if over:
        return f"LEAK above the limit {p.limit:g} under {', '.join(over)}: " + msg
    return f"OK: every leak is within the limit {p.limit:g}: " + msg


def to_json(p: PackedResult, model_info: Optional[dict] = None) -> dict:
    """The packed schedule's document (schema smearcli.packed/1)."""
    f = lambda v: None if v is None else float(f"{v:.6g}")  # noqa: E731
    c = p.logics[0].comparison
    return header(
        "packed", model_header(c.description(), model_info, notes=False),
        input={"batch": int(c.tokens.size(0)), "seq_len": int(c.tokens.size(1))},
        documents=p.lengths, bos=p.bos, first_tokens=p.first, limit=p.limit,
        logics=[{"logic": lg.label, "gate_at_bos": f(lg.gate_at_bos), "noise_floor_logits": f(lg.noise),
                 "attention_part": {"measured": lg.unsplit is None, "why_not": lg.unsplit},
                 "documents": [{"index": x.index, "start": x.start, "length": x.length, "bos": f(x.bos),
                                "first": f(x.first), "whole": f(x.whole),
                                "smear": {"predicted": f(x.smear_predicted), "measured": f(x.smear_measured),
                                          "residual": f(x.smear_residual)},
                                "masked_first": f(x.masked_first), "attention_first": f(x.attention_first)}
                               for x in lg.documents]} for lg in p.logics],
        failed=p.failed,
        verdict=p.verdict,
    )
