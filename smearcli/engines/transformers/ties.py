"""Exact ties in a discrete choice, and replication: a departure a maintainer can reproduce.

A top-k (a sparse-attention indexer, an MoE router) chooses by comparing numbers. When two of them
are exactly equal at the edge of the choice (an indexer's ReLU scores at exactly 0 on a tiny
config), which one is kept depends on the order a kernel happens to evaluate them in: the full
pass and a cached step may keep different keys and differ by a whole key's contribution. That
survives float64 (a tie is exact in any precision), so the float64 confirmation cannot catch it.

- `watching()` records, while it is open, every top-k call that has an exact tie at its edge (the
  k-th and the (k+1)-th value equal and finite in some row);
- `tie_break()` makes every top-k deterministic while it is open: among equal values the lower
  index is kept (a stable sort), in the full pass and in every cached step alike;
- `replicate(fields, rerun)` takes `check_model`'s fields of a `bug` and reruns the check: under the
  tie-break where a tie was seen, on a second seed for the weights and tokens, and at the
  architecture's default head and expert counts where the tiny config shrank them (`derive.Counts`:
  the same tiny config, seed and tokens, those counts restored as far as memory allows). A
  departure that vanishes under the tie-break, or on the second seed or at the default counts where
  ties were seen, is a `tie artifact`; one that vanishes on the second seed or at the default counts
  without any tie is `unconfirmed` (not replicated); one that stays is a bug. A rerun at the default
  counts that cannot run (the model refuses them: crashed, not built) replicates nothing and
  refutes nothing: the bug stands, and the record says so. The record's `replication` says what
  each rerun gave.
"""

from __future__ import annotations

from typing import Callable, Optional

from ...judging import judge
from ...measure.topk import tie_break, tied, watching  # noqa: F401 - the census's rule, used here by name
from ...judging.verdicts import BUG, TIE_ARTIFACT, UNCONFIRMED

def summary(fields: dict) -> dict:
    """What a rerun of the check gave, for the record's `replication`."""
    return {k: fields.get(k) for k in ("verdict", "worst_schedule", "max_abs", "shape")}


def replicate(fields: dict, ties: int, rerun: Callable[..., dict], seed: int, defaults=None) -> dict:
    """`fields` (`check_model`'s, a bug) judged again (module docstring): `rerun(seed, tie_break)`
    runs the same check on another seed or under the tie-break and returns its fields;
    `rerun(seed, False, config)` on another config: `defaults` (a `derive.Counts`, None where the
    config was not derived) holds the one at the default counts. Returns `fields` with `verdict`
    settled and `replication` set."""
    rep: dict = {"ties": ties}
    word: Optional[str] = None
    why = ""
    if ties:
        broke = rerun(seed, True)
        rep[judge.TIE_BREAK] = summary(broke)
        word = judge.replicated(judge.TIE_BREAK, broke["verdict"], True)
        why = f"under a deterministic tie-break (the lower index kept) it is {broke['verdict']}"
    if word is None:
        other = rerun(seed + 1, False)
        rep["seed"] = seed + 1
        rep[judge.SECOND_SEED] = summary(other)
        word = judge.replicated(judge.SECOND_SEED, other["verdict"], bool(ties or other.get("_ties")))
        why = f"on seed {seed + 1} (weights and tokens) it is {other['verdict']}"
    if defaults is not None and word is None:
        rep[judge.DEFAULT_COUNTS] = at_defaults(defaults, rerun, seed)
        got = rep[judge.DEFAULT_COUNTS].get("rerun")
        if got:
            word = judge.replicated(judge.DEFAULT_COUNTS, got["verdict"],
                                    bool(ties or rep[judge.DEFAULT_COUNTS].get("ties")))
            why = f"at the default head/expert counts ({defaults.words()}) it is {got['verdict']}"
    fields["replication"] = rep
    if word == TIE_ARTIFACT:
        fields["verdict"] = word
        fields["notes"].append(f"a tie artifact: {ties} top-k call(s) had an exact tie at the edge of the choice; "
                               + why)
    elif word == UNCONFIRMED:
        fields["verdict"] = word
        fields["notes"].append("not replicated: " + why)
    else:
        fields["notes"].append(f"replicated on seed {seed + 1} (weights and tokens): "
                               f"{rep['second_seed']['worst_schedule']}, {rep['second_seed']['max_abs'] or 0:.3g}")
        if defaults is not None:
            fields["notes"].append(counts_note(rep["default_counts"], defaults))
    return fields


def at_defaults(defaults, rerun: Callable[..., dict], seed: int) -> dict:
    """The `default_counts` entry: what was restored and skipped, and, when anything was, the check
    rerun there (`rerun`, its `ties`)."""
    out = defaults.entry()
    if defaults.config is not None:
        got = rerun(seed, False, defaults.config)
        out["rerun"] = summary(got)
        out["ties"] = int(got.get("_ties") or 0)
        if got.get("reason"):
            out["reason"] = str(got["reason"])[:300]
    return out


def counts_note(entry: dict, defaults) -> str:
    """The note of a bug's rerun at the default counts (replicated, not run, or nothing to restore)."""
    skipped = "; ".join(f"{k} not restored: {v}" for k, v in entry.get("skipped", {}).items())
    got = entry.get("rerun")
    if got is None:
        said = "no head or expert count was shrunk" if not skipped else skipped
        return f"not rerun at the default head/expert counts: {said}"
    if str(got["verdict"]) == str(BUG):
        said = f"replicated at the default head/expert counts ({defaults.words()}): {got['worst_schedule']}, " \
               f"{got['max_abs'] or 0:.3g}"
    else:
        said = (f"could not be checked at the default head/expert counts ({defaults.words()}): it is "
                f"{got['verdict']}" + (f" ({entry['reason']})" if entry.get("reason") else ""))
    return said + (f"; {skipped}" if skipped else "")
