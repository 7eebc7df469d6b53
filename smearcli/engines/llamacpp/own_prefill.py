"""llama.cpp's cached paths held to its own one-call prefill, beside the transformers reference.

llama.cpp has no float64, so a departure from the transformers full pass cannot be rerun lifted.
What separates the cache's logic from the rest of the implementation is llama.cpp's own prefill
(one `llama_decode`, every position's logits): a departure already there is the implementation's
(its kernels, its conversion), not a cache finding; a cached path that leaves the threshold (the
comparison's tolerance x its noise floor) against that prefill is the finding, with its shape (the
schedule's kind of boundary) and its first position.

`against_prefill(comparison, label)` returns an `OwnPrefill`: a line per run and the phrase the
verdict gets; `held(comparison)` is the comparison whose verdict carries that phrase and whose
runner's notes carry the lines (what the table, the JSON document and `--check` then report).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Optional

from ...measure.compare import Comparison

from ...measure.schedules import shape
from ...util.formatters import sci


@dataclass
class Departure:
    schedule: str
    max_abs: float  # max |d log-prob| against llama.cpp's one-call prefill
    first: Optional[int]  # first position beyond the threshold, or None
    at_boundary: bool  # that position is one of the run's boundaries (chunk start, copy, cut ...)


@dataclass
class OwnPrefill:
    threshold: float
    prefill_departs: Optional[bool]  # the one-call prefill against transformers (None: not measured)
    prefill_max: Optional[float]
    runs: list = field(default_factory=list)  # Departure per cached run
    spread: Optional[float] = None  # llama.cpp's own rounding across batch widths (`llamacpp.own_spread`)
    floor: Optional[float] = None  # the float64 floor the threshold starts from

    @property
    def findings(self) -> list:
        return [d for d in self.runs if d.first is not None]

    def lines(self) -> list:
        out = []
        if self.prefill_departs is None:
            out.append("llama.cpp's one-call prefill was not measured: its cached paths are held to transformers only")
            return out
        if self.spread is not None:
            out.append(f"llama.cpp's own spread (one-call prefills of the row's first tokens against the whole row's, "
                       f"no cache read): max |d log-prob| {sci(self.spread)}; threshold {sci(self.threshold)}: the "
                       f"tolerance x the larger of it and the float64 floor ({sci(self.floor or 0)})")
        out.append(f"llama.cpp's one-call prefill against transformers: max |d log-prob| {sci(self.prefill_max)}"
                   + (" (past the tolerance: a departure of the implementation itself, not a cache finding)"
                      if self.prefill_departs else " (within the tolerance)"))
        for d in self.runs:
            where = "" if d.first is None else f", first past {sci(self.threshold)} at position {d.first}" + (
                " (a boundary of the run)" if d.at_boundary else "")
            out.append(f"{d.schedule} against llama.cpp's one-call prefill: max |d log-prob| {sci(d.max_abs)}{where}")
        return out

    def phrase(self) -> str:
        """The verdict's clause."""
        if self.prefill_departs is None:
            return ""
        own = ("llama.cpp's one-call prefill already departs from transformers (the implementation's, not a "
               "cache finding)" if self.prefill_departs else "")
        found = self.findings
        if found:
            parts = []
            for d in found:
                kind = shape(d.schedule)
                parts.append(f"{d.schedule} from position {d.first}" + (f" ({kind})" if kind else "")
                             + (" at a boundary" if d.at_boundary else ""))
            cache = "llama.cpp's cached paths depart from its own one-call prefill: " + ", ".join(parts)
        else:
            cache = f"every cached path matches llama.cpp's own one-call prefill within {sci(self.threshold)}"
        return "; ".join(p for p in (own, cache) if p)


def against_prefill(c, label: str = "llamacpp", spread: Optional[float] = None) -> OwnPrefill:
    """Each measured run of `label` against its prefill run, at the comparison's tolerance times
    the larger of the float64 floor and llama.cpp's own `spread` (its rounding across batch widths,
    `engines.llamacpp.own_spread`): a departure within what llama.cpp's kernels do to the same row
    without any cache is not the cache's."""
    floor = c.noise.per_layer[-1]
    threshold = c.tolerance * max(floor, spread or 0.0)
    pre = next((r for r in c.runs if r.schedule == "prefill" and r.logic == label), None)
    if pre is None:
        return OwnPrefill(threshold, None, None, spread=spread, floor=floor)
    m = c.get("prefill", label)
    out = OwnPrefill(threshold, not m.passed, m.max_abs_logits, spread=spread, floor=floor)
    for r in c.runs:
        if r.logic != label or r is pre:
            continue
        base = pre.logits[r.row_map]
        diff = (r.logits - base).abs().amax(dim=(0, 2))  # per position
        beyond = (diff > threshold).nonzero().flatten().tolist()
        first = beyond[0] if beyond else None
        marks = {p for ps in r.boundaries.values() for p in ps}
        out.runs.append(Departure(r.schedule, diff.max().item() if diff.numel() else 0.0, first,
                                  first is not None and first in marks))
    return out


@dataclass
class HeldToPrefill(Comparison):
    """A comparison whose verdict adds how llama.cpp's cached paths stand against its own prefill."""
    own: Optional[OwnPrefill] = None

    @property
    def verdict(self) -> str:
        base = super().verdict
        phrase = self.own.phrase() if self.own is not None else ""
        return f"{base}; {phrase}" if phrase else base


def held(c, label: str = "llamacpp", spread: Optional[float] = None) -> HeldToPrefill:
    own = against_prefill(c, label, spread)
    fields = {f.name: getattr(c, f.name) for f in dataclasses.fields(c) if f.init}
    out = HeldToPrefill(**fields, own=own)
    i = next(i for i, d in enumerate(out.described) if d.label == label)
    d = out.described[i]
    out.described = list(out.described)
    out.described[i] = dataclasses.replace(d, notes=d.notes + tuple(own.lines()))
    return out
