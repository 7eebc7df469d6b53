"""The words a verdict may use, defined once (importable without torch).

A verdict is a claim about someone else's code, so each word says exactly what was shown:

- `ok`: every run agrees with the reference within the tolerance, and the check had power (the
  state under test moves the logits enough that an error in it would have shown);
- `bug`: a run departs from the reference and the departure keeps its size when the model runs in
  float64 with its float32 islands lifted (`smearcli.judging.evidence.Confirmer`);
- `unconfirmed`: a run departs in its own precision, but the float64 rerun could not say whether it
  is a logic error (it shrank without vanishing, or the model cannot run lifted);
- `inconclusive`: every run agrees, but the state under test never moved the logits enough for an
  error in it to show;
- `crashed`: a cached path raised where the full pass runs;
- `timed out`: the check did not finish within its time, retried once with more (the record
  says how long and at what load): nothing about their code;
- `not run`: the check was not made (a run before it failed, or it was not asked for);
- `not built`: the model, its config or its full pass does not run on the inputs given;
- `unsupported`: a path the library itself declares it does not support (transformers: a cache
  whose `is_croppable` is False, a model `generate` refuses assisted decoding for), quoted where
  it is said; measured and reported, never counted as a bug (what the library's API then does
  anyway is one finding about that API, at its code).
- `latent`: a confirmed departure seen only in a layer order the architecture's default
  configuration does not have (`engines.transformers.orders`): real code, not reachable as configured;
- `tie artifact`: a departure that comes from an exact tie in a discrete choice (a top-k) and
  vanishes under a deterministic tie-break or on another seed (`engines.transformers.ties`): not a logic error;
- `by design`: a finding whose every departure its maintainers answered is intended
  (`census.known`, with their words quoted): said, never counted as a bug.

Neither `latent`, `tie artifact`, `by design` nor `unsupported` is counted as a bug.

`passed(word)` is True for `ok` alone: every surface (the library's `Comparison.passed`, the CLI's
`--check`, the census, `smearcli.testing`) passes nothing else. `line(word, detail)` is the one
way a verdict line is written: "BUG: ...", "OK: ...".
"""

from __future__ import annotations

from enum import Enum


class Verdict(str, Enum):
    """One verdict word; a `str`, so it compares with and serialises as its value ("ok")."""

    OK = "ok"
    BUG = "bug"
    UNCONFIRMED = "unconfirmed"
    INCONCLUSIVE = "inconclusive"
    CRASHED = "crashed"
    TIMED_OUT = "timed out"
    NOT_RUN = "not run"
    NOT_BUILT = "not built"
    UNSUPPORTED = "unsupported"
    LATENT = "latent"
    TIE_ARTIFACT = "tie artifact"
    BY_DESIGN = "by design"

    def __str__(self) -> str:
        return self.value


OK, BUG, UNCONFIRMED, INCONCLUSIVE = Verdict.OK, Verdict.BUG, Verdict.UNCONFIRMED, Verdict.INCONCLUSIVE
CRASHED, NOT_RUN, NOT_BUILT = Verdict.CRASHED, Verdict.NOT_RUN, Verdict.NOT_BUILT
TIMED_OUT, UNSUPPORTED = Verdict.TIMED_OUT, Verdict.UNSUPPORTED
LATENT, TIE_ARTIFACT, BY_DESIGN = Verdict.LATENT, Verdict.TIE_ARTIFACT, Verdict.BY_DESIGN
WORDS = tuple(v.value for v in Verdict)  # in order of the enum: the census counts them in this order

# the order "worst" follows when several results make one (a census's layer orders, a comparison's
# runs): a confirmed bug outranks a crash, which outranks what could not be decided; a path the
# library declares unsupported is no failure of it
SEVERITY = (BUG, CRASHED, UNCONFIRMED, LATENT, TIE_ARTIFACT, BY_DESIGN, INCONCLUSIVE, TIMED_OUT, NOT_BUILT, NOT_RUN, UNSUPPORTED, OK)

# the sets of words, each defined here once and read wherever it is needed:
# a departure the census reports as a finding (a group, a draft, a rerun that keeps a bug a bug)
FINDINGS = (BUG, UNCONFIRMED)
# their code failed: a finding or a crash where the full pass runs (a release's regression, the
# words an engine without a float64 form fails `--check` on, a page's findings table)
FAILURES = (BUG, UNCONFIRMED, CRASHED)
# their code ran and nothing failed: what a release can regress from (an inconclusive that now
# crashes is a new crash)
RAN_CLEAN = (OK, INCONCLUSIVE, UNSUPPORTED, LATENT, TIE_ARTIFACT)
# every word a census record may hold, in the order its reports list and count them
RECORD = (BUG, CRASHED, UNCONFIRMED, LATENT, TIE_ARTIFACT, BY_DESIGN, INCONCLUSIVE, OK, NOT_BUILT, TIMED_OUT)

# what a float64 rerun says of one departure (`evidence.Confirmation.status`)
ROUNDING = "rounding"  # gone in float64: float32 rounding, not a finding (the run counts as ok)

# a census boundary (padded, rollback) that agreed beside another schedule's failure: no verdict of
# its own, since an ok needs the power check, which runs only when every schedule agrees
NOT_JUDGED = "not judged"
NOT_JUDGED_WHY = "a schedule before it failed"
# a padded batch off only in its left-padded row, on a model whose forward takes no position_ids:
# the row can only be numbered after its padding (absolute positions counted from the cache), or,
# with a recurrent state, its padding runs through that state. That is what the model's API
# allows, not a wrong cache: a boundary status of its own (`judge.unmeasured`), shown, never
# counted as a bug
LEFT_UNSUPPORTED = "left padding unsupported"


def rank(word) -> int:
    """Where a record's word comes in `RECORD` (a word outside it last): reports sort by it."""
    return RECORD.index(word) if word in RECORD else len(RECORD)


def passed(word) -> bool:
    """Whether a verdict lets a check pass: `ok` and nothing else."""
    return Verdict(word) is OK


def worst(words) -> Verdict:
    """The most severe of several verdicts (`SEVERITY`); ok when there are none."""
    found = {Verdict(w) for w in words}
    return next((v for v in SEVERITY if v in found), OK)


def line(word, detail: str) -> str:
    """A verdict line: the word in capitals, then what it rests on ("BUG: chunked diverges ...")."""
    return f"{Verdict(word).value.upper()}: {detail}"
