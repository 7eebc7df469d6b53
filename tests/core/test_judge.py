"""The one judge (`smearcli.judging.judge`): each rule a verdict word rests on, on the judge itself, with
stand-in confirmations and power (torch-free); the surfaces that call it are tested where they
measure (compare, the audit, the census)."""

from dataclasses import dataclass

import pytest

from smearcli.judging import judge
from smearcli.judging.judge import DEFAULT_COUNTS, SECOND_SEED, TIE_BREAK, Run
from smearcli.judging.verdicts import (BUG, CRASHED, INCONCLUSIVE, LATENT, LEFT_UNSUPPORTED, NOT_BUILT, NOT_RUN, OK, ROUNDING,
                               TIE_ARTIFACT, TIMED_OUT, UNCONFIRMED, UNSUPPORTED)


@dataclass
class Conf:  # an evidence.Confirmation as the judge reads it
    status: str


@dataclass
class Power:  # an evidence.Power as the judge reads it
    sufficient: bool
    measured: bool = True
    shortfall: str = "the cache's state moved the logits by 1e-9 only"

    def describe(self) -> str:
        return "power not measured here"


STRONG = Power(True)


@pytest.mark.parametrize("run, expected", [
    (Run("a"), OK),
    (Run("a", passed=False), UNCONFIRMED),  # no float64 rerun: never a bug
    (Run("a", passed=False, confirmation=Conf(str(BUG))), BUG),
    (Run("a", passed=False, confirmation=Conf(ROUNDING)), ROUNDING),
    (Run("a", passed=False, confirmation=Conf(str(UNCONFIRMED))), UNCONFIRMED),
    (Run("a", outcome=judge.RAISED), CRASHED),
    (Run("a", outcome=judge.CHECKED_NOTHING), NOT_RUN),
    (Run("a", outcome=judge.DECLARED), UNSUPPORTED),
])
def test_a_runs_status(run, expected):
    assert judge.status(run) == expected


@pytest.mark.parametrize("runs, power, unusable, word", [
    ([Run("a"), Run("b", False, Conf(str(BUG)))], None, None, BUG),
    ([Run("a", outcome=judge.RAISED), Run("b", False, Conf(str(BUG)))], None, None, BUG),  # a bug outranks a crash
    ([Run("a", outcome=judge.RAISED), Run("b")], STRONG, None, CRASHED),
    ([Run("a")], STRONG, "the reference is not finite", INCONCLUSIVE),
    ([Run("a"), Run("b", False)], STRONG, None, UNCONFIRMED),
    ([], STRONG, None, INCONCLUSIVE),  # nothing measured
    ([Run("a"), Run("b", False, Conf(ROUNDING))], None, None, INCONCLUSIVE),  # ok needs power
    ([Run("a")], Power(False), None, INCONCLUSIVE),
    ([Run("a"), Run("b", False, Conf(ROUNDING))], STRONG, None, OK),  # rounding counts as ok
])
def test_the_word(runs, power, unusable, word):
    j = judge.judge(runs, power, unusable)
    assert j.word is word
    assert list(j.statuses) == [r.name for r in runs]
    if word is INCONCLUSIVE:
        assert j.why


def test_only_power_stands_between_agreeing_runs_and_ok():
    assert judge.judge([Run("a")]).wants_power
    assert not judge.judge([Run("a", False)]).wants_power


@pytest.mark.parametrize("rerun, word, ties, becomes", [
    (TIE_BREAK, OK, True, TIE_ARTIFACT),  # gone under the tie-break
    (TIE_BREAK, BUG, True, None),
    (TIE_BREAK, UNCONFIRMED, True, None),  # still a finding there: the next rerun decides
    (SECOND_SEED, BUG, False, None),
    (SECOND_SEED, OK, False, UNCONFIRMED),  # not replicated
    (SECOND_SEED, OK, True, TIE_ARTIFACT),
    (SECOND_SEED, UNCONFIRMED, False, UNCONFIRMED),
    (SECOND_SEED, CRASHED, False, UNCONFIRMED),
    (DEFAULT_COUNTS, BUG, False, None),
    (DEFAULT_COUNTS, CRASHED, False, None),  # the model refuses its default counts: refutes nothing
    (DEFAULT_COUNTS, NOT_BUILT, True, None),
    (DEFAULT_COUNTS, OK, False, UNCONFIRMED),
    (DEFAULT_COUNTS, INCONCLUSIVE, True, TIE_ARTIFACT),
    (DEFAULT_COUNTS, TIMED_OUT, False, UNCONFIRMED),
])
def test_a_bug_after_each_rerun(rerun, word, ties, becomes):
    assert judge.replicated(rerun, word, ties) is becomes
    assert judge.replicated(rerun, str(word), ties) is becomes  # as a record's JSON carries it


@pytest.mark.parametrize("rerun, word, ties, becomes", [
    (SECOND_SEED, UNCONFIRMED, False, None),  # the same departure again: the engine's finding stands
    (SECOND_SEED, OK, False, UNCONFIRMED),  # gone on the next seed: not replicated
    (SECOND_SEED, OK, True, TIE_ARTIFACT),
    (DEFAULT_COUNTS, UNCONFIRMED, True, None),
    (DEFAULT_COUNTS, NOT_BUILT, False, None),
    (DEFAULT_COUNTS, OK, True, TIE_ARTIFACT),
    (SECOND_SEED, BUG, False, UNCONFIRMED),  # not the engine's word for its finding: the finding did not recur
])
def test_a_finding_of_an_engine_without_float64_after_each_rerun(rerun, word, ties, becomes):
    """llama.cpp's strongest word is `unconfirmed`: its cache findings are replicated by the same rule."""
    assert judge.replicated(rerun, word, ties, finding=UNCONFIRMED) is becomes


def test_an_unknown_rerun_is_refused():
    with pytest.raises(ValueError, match="no such rerun"):
        judge.replicated("third_seed", OK, False)


@pytest.mark.parametrize("word, default_order, published, becomes", [
    (BUG, False, False, LATENT),
    (UNCONFIRMED, False, False, LATENT),
    (BUG, False, True, BUG),  # a published configuration has that layer 0
    (BUG, True, False, BUG),
    (OK, False, False, OK),
    (CRASHED, False, False, CRASHED),
])
def test_a_finding_in_a_layer_order_no_configuration_has_is_latent(word, default_order, published, becomes):
    assert judge.in_layer_order(word, default_order, published) is becomes


def test_a_record_keeps_bug_only_with_a_float64_confirmation_that_says_bug():
    """`judge.recorded`, which the census loop applies to every engine's record."""
    assert judge.recorded("bug", "bug") == BUG
    assert judge.recorded("bug", "unconfirmed") == UNCONFIRMED
    assert judge.recorded("bug", None) == UNCONFIRMED and judge.recorded("bug", "rounding") == UNCONFIRMED
    assert judge.recorded("crashed", None) == CRASHED and judge.recorded("ok", None) == OK


@pytest.mark.parametrize("where, word", [
    (judge.DERIVE, NOT_BUILT), (judge.BUILD, NOT_BUILT), (judge.NO_CACHE, NOT_BUILT), (judge.REFERENCE, NOT_BUILT),
    (judge.ENGINE, NOT_BUILT), (judge.CACHED_PATH, CRASHED), (judge.WORKER, CRASHED), (judge.MEMORY, CRASHED)])
def test_a_check_that_stopped_is_not_built_before_their_cache_ran_and_crashed_where_their_code_or_ours_failed(
        where, word):
    assert judge.stopped(where) is word
    assert set(judge.STOPS) == {judge.DERIVE, judge.BUILD, judge.NO_CACHE, judge.REFERENCE, judge.ENGINE,
                                judge.CACHED_PATH, judge.WORKER, judge.MEMORY}


def test_an_unknown_stop_is_refused():
    with pytest.raises(ValueError, match="no such stop"):
        judge.stopped("somewhere")


def test_a_departure_is_a_bug_only_when_it_withstood_every_test():
    assert judge.withstood([]) is BUG
    assert judge.withstood(["second seed: within the threshold (1e-07)"]) is UNCONFIRMED


@pytest.mark.parametrize("word, ties, own, becomes", [
    (UNCONFIRMED, 2, True, TIE_ARTIFACT), (UNCONFIRMED, 0, True, UNCONFIRMED), (UNCONFIRMED, 2, False, UNCONFIRMED),
    (OK, 1, True, TIE_ARTIFACT), (OK, 1, False, OK)])
def test_an_engines_own_prefill_departing_where_the_reference_tied_is_a_tie_artifact(word, ties, own, becomes):
    assert judge.own_tie(word, ties, own) is becomes


@pytest.mark.parametrize("words, becomes", [
    (["ok", "latent"], (LATENT, 1)),
    (["bug", "latent", "bug"], (BUG, 0)),
    (["not built", "ok"], (OK, 1)),  # an order the config class refuses decides nothing
    (["not built", "not built"], (NOT_BUILT, 0)),  # unless no order runs
    (["ok", "crashed", "latent"], (CRASHED, 1))])
def test_an_architectures_word_is_the_worst_of_its_layer_orders_that_were_built(words, becomes):
    assert judge.of_orders(words) == becomes


@pytest.mark.parametrize("why, word", [(judge.CANNOT_RUN, NOT_RUN), (judge.THEIRS_REFUSES, NOT_RUN),
                                       (judge.CHECKED_NOTHING, NOT_RUN), (judge.DECLARED, UNSUPPORTED),
                                       (judge.RAISED, CRASHED), (judge.NO_PAD_POSITIONS, LEFT_UNSUPPORTED)])
def test_a_run_not_measured_is_not_run_unsupported_or_crashed_by_why(why, word):
    assert judge.unmeasured(why) == word
    assert judge.status(Run("a", outcome=why)) == word  # a run handed over unmeasured reads the same
    with pytest.raises(ValueError, match="no such reason"):
        judge.unmeasured("tired")
    with pytest.raises(ValueError, match="no such reason"):  # no outcome is not run by default
        judge.status(Run("a", outcome="unchecked"))


def test_a_runners_outcomes_are_the_judges_reasons_with_the_values_compare_has_always_written():
    assert [str(judge.unmeasured(o)) for o in (judge.RAISED, judge.CHECKED_NOTHING, judge.CANNOT_RUN)] == \
        ["crashed", "not run", "not run"]
    assert (judge.RAISED, judge.CHECKED_NOTHING, judge.CANNOT_RUN) == ("crashed", "checked nothing", "not run")


@pytest.mark.parametrize("original, lifted, bound, status", [
    (1e-3, 1e-3, 1e-12, BUG),  # keeps its size: a logic error
    (1e-3, 0.5e-3, 1e-12, BUG),  # KEEPS of it is enough
    (1e-3, 1e-14, 1e-12, ROUNDING),  # within what float64 rounding of it could leave
    (1e-3, 1e-6, 1e-12, UNCONFIRMED),  # shrank without vanishing
    (1e-3, None, 1e-12, UNCONFIRMED),  # no float64 rerun
])
def test_a_departure_rerun_in_float64_is_a_bug_only_where_it_keeps_its_size(original, lifted, bound, status):
    got, why = judge.confirmed(original, lifted, bound)
    assert got == status and why


@pytest.mark.parametrize("word, same, becomes", [
    (UNCONFIRMED, True, UNCONFIRMED), (OK, True, UNCONFIRMED),  # departs the same way again: the finding
    (UNCONFIRMED, False, OK), (INCONCLUSIVE, False, OK),  # ran and did not: refuted
    (CRASHED, False, CRASHED), (NOT_BUILT, True, NOT_BUILT),  # did not run: refutes nothing
])
def test_a_rerun_read_by_where_it_departs(word, same, becomes):
    assert judge.read_again(same, UNCONFIRMED, word) is becomes
    stands = judge.replicated(SECOND_SEED, judge.read_again(same, UNCONFIRMED, word), False, finding=UNCONFIRMED)
    assert (stands is None) == (becomes is UNCONFIRMED)
    assert judge.read_again(same, BUG) is (BUG if same else OK)  # no word of its own: read by whether it departs
