"""The one judge: measured runs in, the verdict word and each run's status out (torch-free).

Every surface that says a verdict about someone's cache (`compare` for every `--impl`, the audit of
a nanochat checkout, `smearcli.testing`, the census on transformers and on vLLM) measures its runs
its own way, then hands them here as `Run`s, with the check's `evidence.Power` and whether the
reference could be used at all, and reads the word back from `judge`. Nothing else turns
measurements into a word.

A run's status (`status`):

- `ok`: within the tolerance in its own precision;
- `rounding`: past it, but its float64 rerun vanished (`evidence.Confirmation`): float32 rounding,
  which counts as ok;
- `bug` / `unconfirmed`: past it, and its float64 rerun kept its size / could not say (no rerun is
  `unconfirmed`: a departure is never a bug without one);
- `crashed` / `not run`: not measured (the run raised, or it checked nothing).

The word (`judge`), in this order: `bug` when any run is a confirmed bug; `crashed` when any run
raised; `inconclusive` when the reference is unusable (nothing measured against it means anything);
`unconfirmed` when any run departs without confirmation; `inconclusive` when no run was measured,
or when the check did not show power (`evidence.Power.sufficient`: not measured, or too weak);
else `ok`. So OK needs power, BUG needs confirmation, and anything else is said as what it is.

The census then holds a bug to the maintainer's rules, each one function here, which the census
calls with what its reruns and layer orders gave (it decides which reruns to make, and when):

- `replicated`: a bug rerun under a deterministic top-k tie-break, on a second seed, or at the
  architecture's default head and expert counts (`engines.transformers.ties`) stands only if the rerun still
  finds it; where it does not, it is a `tie artifact` when an exact tie was seen, else
  `unconfirmed`;
- `in_layer_order`: a finding seen only in a layer order that neither the default configuration
  nor a published one has (`engines.transformers.orders`) is `latent`; `of_orders`: the architecture's word is
  the worst of its orders that were built;
- `by_design`: a finding whose every part upstream's maintainers answered is intended
  (`census.known`) is `by design`;
- `recorded`: every engine's record passes it in the census loop: a `bug` whose record holds no
  float64 confirmation that says bug is `unconfirmed`.

A check that stops before any run can be judged says where (`stopped`: its tiny config, the
model's build, a forward with no cache, the reference, the engine's refusal, a cached path that
raised, its own process, memory), and the word comes from here: `not built` or `crashed`. One run
that was not measured as its schedule asks says why (`Run.outcome`, `unmeasured`: their code raised
in it, it checked nothing, the check cannot run it, their code refuses it, their library declares
it unsupported, the model cannot number a left-padded row): every runner's `RunResult.outcome` is
one of these reasons, and the status (`crashed`, `not run`, `unsupported`, `left padding
unsupported`) comes from here. Whether a departure keeps its size in float64 is decided here too
(`confirmed`, which `evidence.Confirmer` and every other float64 rerun call), and so is how an
engine that reads a rerun by where it departs reads it (`read_again`).

```python
from smearcli.judging.judge import Run, judge
j = judge([Run("decode", passed=True), Run("chunked", passed=False, confirmation=c)], power=p)
j.word, j.statuses["chunked"], j.why
```
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional, Sequence

from .verdicts import (BUG, BY_DESIGN, CRASHED, FINDINGS, INCONCLUSIVE, LATENT, LEFT_UNSUPPORTED, NOT_BUILT, NOT_RUN,
                       OK, ROUNDING, TIE_ARTIFACT, UNCONFIRMED, UNSUPPORTED, Verdict, worst)

NOTHING_MEASURED = "no schedule was measured"
POWER_NOT_MEASURED = "power not measured"


@dataclass(frozen=True)
class Run:
    """One run as the judge sees it: whether it stayed within the tolerance in its own precision,
    its float64 rerun when it did not (an `evidence.Confirmation`, or None: none was made), or, for
    a run that was not measured, why (`outcome`: one of `OUTCOMES`, read by `unmeasured`)."""
    name: str
    passed: bool = True
    confirmation: Optional[object] = None
    outcome: Optional[str] = None


def status(run: Run) -> str:
    """One run's status: ok, rounding, bug or unconfirmed for a measured run, `unmeasured`'s word for
    one that was not (module docstring); a `verdicts.Verdict` for each but rounding
    (`verdicts.ROUNDING`) and left padding unsupported (`verdicts.LEFT_UNSUPPORTED`)."""
    if run.outcome is not None:
        return unmeasured(run.outcome)
    if run.passed:
        return OK
    c = run.confirmation
    return UNCONFIRMED if c is None else (ROUNDING if c.status == ROUNDING else Verdict(c.status))


@dataclass
class Judgement:
    """The verdict word, each run's status (name -> status, in the runs' order) and, for an
    inconclusive word, why nothing more could be said."""
    word: Verdict
    statuses: dict = field(default_factory=dict)
    why: str = ""
    wants_power: bool = False  # only power stood between these runs and ok (`judge`)

    def named(self, *wanted) -> list[str]:
        """The runs whose status is one of `wanted`, in order."""
        keep = {str(w) for w in wanted}
        return [n for n, s in self.statuses.items() if s in keep]


def judge(runs: Sequence[Run], power=None, unusable: Optional[str] = None) -> Judgement:
    """The verdict of `runs` (the module docstring gives the order). `power`: the check's
    `evidence.Power` (None: not measured); `unusable`: why the reference cannot be measured
    against (`evidence.unusable`), or None."""
    statuses = {r.name: status(r) for r in runs}
    found = {str(s) for s in statuses.values()}
    if str(BUG) in found:
        return Judgement(BUG, statuses)
    if str(CRASHED) in found:
        return Judgement(CRASHED, statuses)
    if unusable:
        return Judgement(INCONCLUSIVE, statuses, unusable)
    if str(UNCONFIRMED) in found:
        return Judgement(UNCONFIRMED, statuses)
    if not found & {str(OK), str(ROUNDING)}:
        return Judgement(INCONCLUSIVE, statuses, NOTHING_MEASURED)
    # every measured run agrees: ok needs the check to have shown power (the caller measures it
    # only now: `wants_power`)
    if power is None or not power.sufficient:
        why = POWER_NOT_MEASURED if power is None else power.shortfall if power.measured else power.describe()
        return Judgement(INCONCLUSIVE, statuses, why, wants_power=True)
    return Judgement(OK, statuses, wants_power=True)


# where a check stopped before any of its runs could be judged (`stopped`): what the engine saw,
# never a word of its own
DERIVE = "derive"  # no tiny config could be made from the config class's defaults
BUILD = "build"  # the model, its saved copy or its conversion could not be made from that config
NO_CACHE = "no cache"  # the model's forward takes no cache: there is no cached path to check
REFERENCE = "reference"  # the full pass fails, is not one row of logits per position, or overflows
ENGINE = "engine"  # the engine refuses the model (an architecture, or a feature, it does not run)
CACHED_PATH = "cached path"  # a cached path raised where the full pass runs
WORKER = "worker"  # the process running the check died or answered nothing readable
MEMORY = "memory"  # an allocation over the census's memory limit was refused
STOPS = (DERIVE, BUILD, NO_CACHE, REFERENCE, ENGINE, CACHED_PATH, WORKER, MEMORY)


def stopped(where: str) -> Verdict:
    """The word of a check that stopped at `where` (one of `STOPS`) before a cached path could be
    measured: `not built` where nothing of their cache ran (our tiny config, a model or a reference
    that does not run on it, an engine that does not take the model: nothing about their cache is
    shown), `crashed` where their code failed on a path the full pass runs (a cached path raised)
    or the check's process did (it died, or ran out of the census's memory: the record says which,
    and which step it was in)."""
    if where not in STOPS:
        raise ValueError(f"no such stop: {where!r}")
    return CRASHED if where in (CACHED_PATH, WORKER, MEMORY) else NOT_BUILT


# why one run was not measured as its schedule asks (`Run.outcome`, `unmeasured`): what the engine
# saw, never a word of its own. The first three are also what a runner reports of a schedule
# (`steps.RunResult.outcome`), spelled as compare's JSON has always written them (`outcome`: two
# of them as the status they get).
RAISED = str(CRASHED)  # their code raised inside the path, where the full pass runs
CHECKED_NOTHING = "checked nothing"  # it ran, but did not exercise what the schedule tests
CANNOT_RUN = str(NOT_RUN)  # the check cannot run it: a capability, an input or a step before it is missing
THEIRS_REFUSES = "theirs refuses"  # their code refuses the use on purpose (a raise of its own, generate declining)
DECLARED = "declared"  # their library declares the path unsupported, and what it did anyway is recorded
NO_PAD_POSITIONS = "no pad positions"  # their model cannot number a row past its left pads (no position_ids)
OUTCOMES = (RAISED, CHECKED_NOTHING, CANNOT_RUN, THEIRS_REFUSES, DECLARED, NO_PAD_POSITIONS)


def unmeasured(why: str) -> str:
    """The status of one run that was not measured as its schedule asks, by `why` (one of
    `OUTCOMES`): `crashed` where their code raised in it (a finding of their code); `not run` where
    it checked nothing, could not be run or their code refused it; `unsupported` where their library
    declares the path unsupported; `left padding unsupported` where the model's API cannot number a
    left-padded row (a padded boundary's status of its own: what the API allows, never a bug)."""
    words = {RAISED: CRASHED, CHECKED_NOTHING: NOT_RUN, CANNOT_RUN: NOT_RUN, THEIRS_REFUSES: NOT_RUN,
             DECLARED: UNSUPPORTED, NO_PAD_POSITIONS: LEFT_UNSUPPORTED}
    if why not in words:
        raise ValueError(f"no such reason a run was not measured: {why!r}")
    return words[why]


# whether a departure keeps its size in float64 with the float32 islands lifted (`confirmed`)
KEEPS = 0.5  # a confirmed bug's lifted error is at least this share of its error in its own precision


def confirmed(original: float, lifted: Optional[float], bound: float) -> tuple[str, str]:
    """What a float64 rerun makes of one departure, and why (`evidence.Confirmation`'s status):
    `bug` where its lifted size keeps at least `KEEPS` of its size in its own precision (a logic
    error does not care about precision), `rounding` where it falls within `bound` (the most
    float64 rounding of it could leave: float32 rounding, gone), else `unconfirmed` (it shrank
    without vanishing, or, `lifted` None, it could not be rerun)."""
    if lifted is None:
        return UNCONFIRMED, "not confirmed: the model does not run in float64"
    if lifted >= KEEPS * original:
        return BUG, "keeps its size in float64"
    if lifted <= bound:
        return ROUNDING, "float32 rounding, gone in float64"
    return UNCONFIRMED, "shrinks in float64 without vanishing: neither a logic error nor rounding shown"


# the reruns a census makes of a bug (`replicated`), in the order it makes them
TIE_BREAK, SECOND_SEED, DEFAULT_COUNTS = "tie_break", "second_seed", "default_counts"


def replicated(rerun: str, word, ties: bool, finding: Verdict = BUG) -> Optional[Verdict]:
    """What a finding becomes after one rerun of its check, or None where it stands. `rerun`:
    under the tie-break (TIE_BREAK: any finding there keeps it), on a second seed (SECOND_SEED: only
    the finding's own word keeps it) or at the default counts (DEFAULT_COUNTS: the finding's word
    keeps it, and so does a rerun the model cannot run, crashed or not built, which refutes
    nothing); `word`: the rerun's verdict; `ties`: whether an exact tie at the edge of a top-k was
    seen (in the check or in this rerun; always, where a tie-break was run); `finding`: the word
    the engine gives a finding it has confirmed as far as it can (a bug; `unconfirmed` for an
    engine with no float64, whose departures go no further)."""
    stands = {TIE_BREAK: FINDINGS, SECOND_SEED: (finding,), DEFAULT_COUNTS: (finding, CRASHED, NOT_BUILT)}.get(rerun)
    if stands is None:
        raise ValueError(f"no such rerun: {rerun!r}")
    if Verdict(str(word)) in stands:
        return None
    return TIE_ARTIFACT if ties else UNCONFIRMED


def read_again(same: bool, finding: Verdict, word=None) -> Verdict:
    """A rerun's word as `replicated` reads it, for a check that reads a rerun by whether it departs
    the same way again (llama.cpp: a cached path against its own one-call prefill, at the same
    schedule; generate's path on the next seed): `word`, the rerun's own verdict where it has one,
    stands where it crashed or was not built (it refutes nothing); else a rerun that departs the same
    way (`same`) is the finding (`finding`) again, and any other refutes it, as an ok."""
    if word is not None and Verdict(str(word)) in (CRASHED, NOT_BUILT):
        return Verdict(str(word))
    return finding if same else OK


def recorded(word, confirmed: Optional[str]) -> Verdict:
    """The word a census record keeps, whichever engine made it: `bug` only with its float64
    confirmation saying bug (`confirmed`: the status of the record's `confirmation`, as
    `evidence.Confirmation` words it; None without one); a bug without one is `unconfirmed` (a
    departure is never a bug without a rerun that kept its size). Any other word is its own."""
    word = Verdict(str(word))
    if word == BUG and confirmed != str(BUG):
        return UNCONFIRMED
    return word


UNCONFIRMED_BUG = "called a bug without a float64 confirmation that kept its size: unconfirmed"


def withstood(failed: Sequence[str]) -> Verdict:
    """A departure put to every test a maintainer would (its float64 rerun, a second seed, the
    positions the public API passes, exact ties, a reproducer without smearcli) and `failed`, the
    ones it did not pass: a bug when it passed them all, else `unconfirmed` (the caller notes why)."""
    return UNCONFIRMED if failed else BUG


def own_tie(word, ties: int, own_choice: bool) -> Verdict:
    """An engine whose own one-call prefill departs from the reference (`own_choice`) where the
    reference's pass had `ties` exact ties at the edge of a top-k (a router scoring experts alike):
    the engine broke the tie by its own order, a `tie artifact`; any other word is its own."""
    return TIE_ARTIFACT if ties and own_choice else Verdict(str(word))


def in_layer_order(word, default_order: bool, published: bool) -> Verdict:
    """The verdict a layer order's check gives the architecture: a finding (bug, unconfirmed) in an
    order that is not the default configuration's (`default_order` False) and that no published
    configuration has is `latent`; any other word is its own."""
    word = Verdict(str(word))
    return LATENT if not default_order and word in FINDINGS and not published else word


def of_orders(words: Sequence) -> tuple[Verdict, int]:
    """The architecture's word from its layer orders' words (each already read by `in_layer_order`),
    and the first order that has it: the worst (`verdicts.worst`) among the orders that were built;
    an order the config class cannot build (`not built`) decides nothing while another order runs."""
    words = [Verdict(str(w)) for w in words]
    ran = [i for i, w in enumerate(words) if w != NOT_BUILT] or list(range(len(words)))
    word = worst(words[i] for i in ran)
    return word, next(i for i in ran if words[i] == word)


def by_design(word, classes) -> Verdict:
    """The verdict of a finding once placed against what upstream knows (`census.known`): a bug,
    crash or unconfirmed departure every part of which (`classes`, one per path that failed) its
    maintainers answered is intended is `by design`; anything else keeps its word. A finding one
    part of which is not by design stands whole."""
    word = Verdict(str(word))
    classes = [str(c) for c in classes]
    designed = word in (BUG, CRASHED, UNCONFIRMED, BY_DESIGN) and classes and all(c == str(BY_DESIGN) for c in classes)
    return BY_DESIGN if designed else word
