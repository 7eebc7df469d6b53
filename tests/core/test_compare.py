"""compare: one result type for every implementation, its plan of runs, what it stores, its verdict."""

import json

import pytest
import torch

from smearcli.measure import compare as cmp
from smearcli.gpt import gpt_runners, smear
from smearcli.judging import judge
from smearcli.measure import jsondoc, runplan, schedules, steps
from smearcli.judging.verdicts import BUG, CRASHED, OK
from smearcli.measure.inputs import random_tokens
from smearcli.util.defaults import LOGIC_NAMES
from smearcli.measure.runner import Output, Runner
from smearcli.measure.schedules import ScheduleOptions
from smearcli.gpt.weights import random_config, random_model
from smearcli.judging.verdicts import INCONCLUSIVE

T = 32
OPTS = ScheduleOptions(chunks=4, gen_len=8)


@pytest.fixture(scope="module")
def model():
    return random_model(random_config(2), seed=4).model


@pytest.fixture(scope="module")
def tokens():
    return torch.randint(0, 256, (1, T), generator=torch.Generator().manual_seed(6))


def test_the_plan_is_what_runs(model, tokens):
    """The progress totals the CLI shows come from `plan`: every label announced is a planned run
    that calls the model, and the tokens counted reach the total exactly."""
    runners = gpt_runners.runners(model, LOGIC_NAMES)
    schedules = ["prefill", "decode", "chunked", "engine", "speculative"]
    planned = runplan.plan(runners, schedules)
    labels, ticks = [], []
    cmp.compare(runners, tokens, schedules, options=OPTS, progress=labels.append,
                tokens_progress=lambda d, t: ticks.append((d, t)))
    evidence_steps = [lb for lb in labels if lb.startswith(("noise floor", "power")) or lb.endswith("in float64")]
    assert evidence_steps[0] == "noise floor (float64)"  # the floor is the reference in float64, no run of its own
    labels = [lb for lb in labels if lb not in evidence_steps]
    assert len(labels) == runplan.forward_runs(planned) == 1 + 2 * len(schedules) - 1  # decode shared
    assert [p.label for p in planned if p.same_as is None] == labels
    assert ticks[-1] == (runplan.forward_runs(planned) * T,) * 2
    # no schedule is decode: one more run, for the noise floor
    assert runplan.forward_runs(runplan.plan(runners, ["chunked"])) == 1 + 2  # no decode of its own for the floor


def test_the_result_stores_what_ran(model, tokens):
    """Nothing reads the live model after the run: changing it does not change the document."""
    m = random_model(random_config(2), seed=4).model
    c = cmp.compare(m, tokens, ["chunked"], options=OPTS, name="mine")
    before = json.dumps(jsondoc.to_json(c), sort_keys=True)
    with torch.no_grad():
        m.smear_lambda.fill_(0.0)
    assert json.dumps(jsondoc.to_json(c), sort_keys=True) == before
    d = c.description()
    assert (d.name, d.shape, d.config["n_layer"]) == ("mine", "d2 n_embd 128", 2)
    assert c.labels == ["old", "fixed"] and c.get("chunked", "old").logic == "old"


def test_one_verdict_for_one_runner_and_for_several(model, tokens):
    both = cmp.compare(model, tokens, ["chunked"], options=OPTS)
    assert both.word is BUG and [both.run_name(m) for m in both.bugs] == ["chunked/old"]
    assert "born at emb@8, the first chunk start (8)" in both.verdict
    assert both.verdict.endswith("the fixed logic matches every schedule")
    fixed = cmp.compare(gpt_runners.GPTRunner(model, "fixed"), tokens, ["chunked"], options=OPTS)
    assert fixed.passed and fixed.word is OK
    old = cmp.compare(gpt_runners.GPTRunner(model, "old"), tokens, ["chunked"], options=OPTS)
    assert old.word is BUG and [old.run_name(m) for m in old.bugs] == ["chunked"]
    assert "matches every schedule" not in old.verdict
    assert "BUG: chunked (steps 4x8) diverges from the full pass: born at emb@8" in old.table()


def test_a_model_whose_smear_is_off_says_so(tokens):
    m = random_model(random_config(1), seed=4).model
    with torch.no_grad():
        m.smear_lambda.zero_()
    c = cmp.compare(m, tokens, ["chunked"], options=OPTS)
    # the smear state is inert: an error in it could not show, so agreement is no ok (no power)
    assert c.word == "inconclusive" and not c.passed
    assert "could not see any error in the recurrent state (zeroing it moves no logit)" in c.verdict
    assert "smear_lambda is 0: this model cannot show the bug" in c.verdict


def test_chunk_start_share_is_blank_for_rounding_noise(model, tokens):
    """A run inside the floor has no share on chunk starts: that share of pure rounding differs
    between CPUs, and is no finding."""
    c = cmp.compare(model, tokens, ["chunked"], options=OPTS)
    fixed, old = c.get("chunked", "fixed"), c.get("chunked", "old")
    assert fixed.passed and fixed.chunk_start_share is None and c.start_share(fixed) is None
    assert old.chunk_start_share > 0.999 and c.start_share(old) > 0.999


class LogitsOnly(Runner):
    """A runner that returns no hidden states (as an engine returning log-probabilities would)."""
    label = "logits-only"

    def __init__(self, model):
        self.inner, self.dtype = gpt_runners.GPTRunner(model, "old"), torch.float32

    def forward(self, toks, capture):
        return Output(self.inner.forward(toks, False).logits, None)

    def new_cache(self, batch, max_len):
        return self.inner.new_cache(batch, max_len)

    def step(self, toks, cache, capture):
        return Output(self.inner.step(toks, cache, False).logits, None)


def test_metrics_use_what_the_runner_returns(model, tokens):
    c = cmp.compare(LogitsOnly(model), tokens, ["chunked"], options=OPTS)
    assert c.layers == ["logits"] and c.born_at(c.get("chunked")) == ("logits", 8)
    assert c.analytic == {}  # no smear terms declared: no analytic check, and no error
    with pytest.raises(ValueError, match="logits-only cannot run the engine schedule"):
        cmp.compare(LogitsOnly(model), tokens, ["engine"], options=OPTS)


def test_runners_of_two_models_share_nothing(model, tokens):
    """Decode is shared only between runners whose one-token step is the same computation: never
    across models."""
    other = random_model(random_config(2), seed=5).model
    planned = runplan.plan([gpt_runners.GPTRunner(model, "old"), gpt_runners.GPTRunner(other, "fixed")], ["decode"])
    assert all(p.same_as is None for p in planned)
    shared = runplan.plan(gpt_runners.runners(model, LOGIC_NAMES), ["decode"])
    assert [p.same_as is not None for p in shared] == [False, False, True]


# -- decode run once where the one-token steps are the same code; progress inside runs ----------
@pytest.fixture(scope="module")
def small():
    return random_model(random_config(2, sequence_len=64), seed=1).model


def _count_runs(monkeypatch):
    calls = []
    real = cmp.run_schedule

    def counting(runner, tokens, sched, *a, **k):
        calls.append((sched, runner.label))
        return real(runner, tokens, sched, *a, **k)
    monkeypatch.setattr(cmp, "run_schedule", counting)
    return calls


def test_compare_runs_decode_once_and_reports_both(small, monkeypatch):
    calls = _count_runs(monkeypatch)
    toks = random_tokens(small.config, 12, 1, 0)
    c = cmp.compare(small, toks, ["decode", "chunked"], ["old", "fixed"])
    assert [s for s, _ in calls].count("decode") == 1
    from smearcli.measure import jsondoc
    doc = jsondoc.to_json(c)
    rows = [(r["schedule"], r["logic"]) for r in doc["runs"]]
    assert rows == [("decode", "old"), ("decode", "fixed"), ("chunked", "old"), ("chunked", "fixed")]
    # what sharing stands for: a decode run under each logic is the same, bit for bit
    a = schedules.run_schedule(small, toks, "decode", "old")
    b = schedules.run_schedule(small, toks, "decode", "fixed")
    assert torch.equal(a.logits, b.logits) and all(torch.equal(x, y) for x, y in zip(a.hiddens, b.hiddens))
    assert torch.equal(c.get("decode", "old").abs_err, c.get("decode", "fixed").abs_err)


def test_compare_does_not_share_when_one_token_steps_differ(small, monkeypatch):
    def other_one(x, w, lam, prev):
        return x if prev is None else x + 0.5 * smear.smear_gate(x, w, lam) * prev

    def other(x, w, lam, prev, cached):
        return other_one(x, w, lam, prev) if cached and x.size(1) == 1 else smear.smear_fixed(x, w, lam, prev, cached)
    monkeypatch.setitem(smear.LOGICS, "other", other)
    monkeypatch.setitem(smear.ONE_TOKEN_STEP, "other", other_one)
    calls = _count_runs(monkeypatch)
    toks = random_tokens(small.config, 10, 1, 0)
    c = cmp.compare(small, toks, ["decode"], ["old", "other"], confirm=False)
    assert calls.count(("decode", "old")) == 1 and calls.count(("decode", "other")) == 1
    assert not torch.equal(c.runs[0].logits, c.runs[1].logits)  # sharing would have hidden this


def test_no_sharing_for_a_runner_without_a_one_token_key(small):
    pair = gpt_runners.runners(small, ["old", "fixed"])
    for r in pair:  # as a user's code behind an adapter: its one-token step is its own
        r.one_token_step = None
    assert all(p.same_as is None for p in runplan.plan(pair, ["decode"]))
    assert any(p.same_as is not None for p in runplan.plan(gpt_runners.runners(small, ["old", "fixed"]), ["decode"]))


def test_run_schedule_reports_every_step(small):
    toks = random_tokens(small.config, 9, 1, 0)
    seen = []
    schedules.run_schedule(small, toks, "chunked", "old", schedules.ScheduleOptions(chunks=3),
                           progress=lambda d, t: seen.append((d, t)))
    assert seen == [(3, 9), (6, 9), (9, 9)]
    seen.clear()
    schedules.run_schedule(small, toks, "decode", "old", progress=lambda d, t: seen.append((d, t)))
    assert seen == [(i, 9) for i in range(1, 10)]


def test_compare_token_progress_counts_every_run(small):
    toks = random_tokens(small.config, 8, 1, 0)
    seen = []
    cmp.compare(small, toks, ["prefill", "decode"], ["old", "fixed"], tokens_progress=lambda d, t: seen.append((d, t)))
    total = runplan.forward_runs(runplan.plan(gpt_runners.runners(small, ["old", "fixed"]), ["prefill", "decode"])) * 8
    assert total == 4 * 8  # full, prefill x2, decode once
    assert {t for _, t in seen} == {total} and seen[-1] == (total, total)
    assert all(a[0] < b[0] for a, b in zip(seen, seen[1:]))


class Engine(Runner):
    """An engine that runs whole schedules itself and returns log-probs (a toy vLLM): prefill is
    the reference's own log-probs, chunked is off by `skew` at position 8, and prefix crashes."""
    label, layers, dtype = "engine", ("logits",), torch.float32

    def __init__(self, reference, skew=0.0):
        self.reference, self.skew = reference, skew

    def run(self, schedule, tokens, options):
        T = tokens.size(1)
        if schedule == "prefix":
            return steps.RunResult(schedule, self.label, torch.empty(1, 0, 1), None, [], [0],
                                       outcome=judge.RAISED, message="IndexError: out of bounds")
        lp = self.reference.forward(tokens, False).logits.clone()
        if schedule == "chunked":
            lp[:, 8] += self.skew
        return steps.RunResult(schedule, self.label, lp, None, [T] if schedule == "prefill" else [8, T - 8], [0])


def test_a_separate_reference_and_runs_that_crashed(model, tokens):
    from smearcli.measure.runner import PREFIX_CACHE, LogProbs

    ref = LogProbs(gpt_runners.GPTRunner(model, "fixed"))
    engine = Engine(ref, skew=0.0)
    engine.capabilities = frozenset({PREFIX_CACHE})
    planned = runplan.plan([engine], ["prefill", "chunked", "prefix"], reference=ref)
    assert [(p.schedule, p.runner is ref, p.measured) for p in planned] == [
        ("full", True, False), ("prefill", False, True), ("chunked", False, True), ("prefix", False, True)]
    # no run for the noise floor: the reference's full pass in float64
    c = cmp.compare(engine, tokens, ["prefill", "chunked", "prefix"], reference=ref)
    lp = ref.forward(tokens, False).logits
    assert torch.allclose(lp.exp().sum(-1), torch.ones(()), atol=1e-5) and c.layers == ["logits"]
    assert c.labels == ["engine"] and [m.schedule for m in c.metrics] == ["prefill", "chunked"]
    assert [r.schedule for r in c.unmeasured] == ["prefix"] and c.crashed and not c.passed
    assert c.word is CRASHED and [r.schedule for r in c.crashed] == ["prefix"]
    assert "every run measured matches" in c.verdict  # the line says the measured runs agree
    assert "prefix crashed: IndexError" in c.table()
    doc = jsondoc.to_json(c)
    assert doc["not_measured"] == [{"schedule": "prefix", "logic": "engine", "outcome": "crashed", "status": "crashed",
                                    "message": "IndexError: out of bounds", "steps": []}]
    skewed = cmp.compare(Engine(ref, skew=1.0), tokens, ["prefill", "chunked"], reference=ref)
    assert not skewed.get("chunked").passed and skewed.get("prefill").passed
    assert skewed.born_at(skewed.get("chunked")) == ("logits", 8)


def test_a_run_that_checked_nothing_is_named_and_is_no_evidence(model, tokens):
    """Not a crash, and not an ok either: with nothing measured the check had nothing to judge."""
    from smearcli.measure.runner import LogProbs

    ref = LogProbs(gpt_runners.GPTRunner(model, "fixed"))

    class Cold(Engine):
        def run(self, schedule, tokens, options):
            r = super().run("prefill", tokens, options)
            return steps.RunResult(schedule, self.label, r.logits, None, r.steps, [0],
                                       outcome=judge.CHECKED_NOTHING, message="the cache was not read")
    c = cmp.compare(Cold(ref), tokens, ["prefill"], reference=ref)
    assert not c.passed and not c.metrics and c.unmeasured[0].outcome == "checked nothing"
    assert c.word is INCONCLUSIVE and not c.crashed and c.judgement.statuses == {"prefill/engine": "not run"}
    assert c.verdict == "INCONCLUSIVE: no schedule was measured; prefill checked nothing: the cache was not read"


# -- overlap: the noise-floor decode on a second thread ----------------------------------------------
class Recording(gpt_runners.GPTRunner):
    """Our runner, noting the thread of every step and able to fail on a chosen schedule."""

    def __init__(self, model, logic, seen, fail_on=None, pace=0.0):
        super().__init__(model, logic)
        self.seen, self.fail_on, self.pace = seen, fail_on, pace

    def step(self, tokens, cache, capture):
        import threading
        import time
        self.seen.append((threading.current_thread().name, tokens.size(1)))
        if self.fail_on is not None and tokens.size(1) == self.fail_on:
            raise RuntimeError(f"boom at a step of {self.fail_on}")
        if tokens.size(1) == 1:
            time.sleep(self.pace)  # a slow decode: one left to run would take pace * T
        return super().step(tokens, cache, capture)


@pytest.fixture
def two_threads():
    """Overlap needs torch to have more than one thread; a one-core CI machine gives it one."""
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(before)


def _results(c):
    return [(r.schedule, r.logic, r.logits, r.hiddens) for r in [c.reference] + c.runs]


def test_overlap_runs_decode_beside_the_others_and_changes_no_number(model, tokens, two_threads):
    """The decode for the noise floor goes on its own thread; every run's logits and hidden states
    are bit for bit those of the runs made one after another, and the metrics are the same."""
    schedules_ = ["prefill", "decode", "chunked", "engine", "speculative"]
    alone = cmp.compare(model, tokens, schedules_, options=OPTS)
    seen: list = []
    runners = [Recording(model, logic, seen) for logic in LOGIC_NAMES]
    ticks = []
    both = cmp.compare(runners, tokens, schedules_, options=OPTS, overlap=True,
                       tokens_progress=lambda d, t: ticks.append(d))
    side = {n for name, n in seen if name == "smearcli-decode"}
    assert side == {1} and sum(1 for name, _ in seen if name == "smearcli-decode") == T  # decode, all of it
    assert {name for name, n in seen if n > 1} == {"MainThread"}  # prefill, chunks, drafts: here
    for a, b in zip(_results(alone), _results(both)):
        assert a[:2] == b[:2] and torch.equal(a[2], b[2])
        assert all(torch.equal(x, y) for x, y in zip(a[3], b[3]))
    assert [m.max_abs_logits for m in alone.metrics] == [m.max_abs_logits for m in both.metrics]
    assert alone.noise.per_layer == both.noise.per_layer and alone.verdict == both.verdict
    total = runplan.forward_runs(runplan.plan(runners, schedules_)) * T
    assert ticks[-1] == total and all(a <= b for a, b in zip(ticks, ticks[1:]))  # one count, rising


def test_overlap_only_where_it_is_safe(model, tokens, two_threads):
    runners = gpt_runners.runners(model, LOGIC_NAMES)
    planned = runplan.plan(runners, ["chunked", "decode"])
    assert planned[runplan.side_run(planned)].schedule == "decode"
    assert runplan.side_run(runplan.plan(runners, ["chunked"])) is None  # no decode planned: the floor is float64
    other = gpt_runners.runners(model, LOGIC_NAMES)
    for r in other:
        r.thread_safe = False  # as a user's code: nobody said two of its runs may go on at once
    assert runplan.side_run(runplan.plan(other, ["chunked", "decode"])) is None
    seen: list = []
    from smearcli.measure import profile
    with profile.session(True, out=open("/dev/null", "w")):  # a profile times one run at a time
        cmp.compare([Recording(model, "old", seen)], tokens, ["chunked"], options=OPTS, overlap=True)
    assert {name for name, _ in seen} == {"MainThread"}
    threads = torch.get_num_threads()
    seen.clear()
    try:
        torch.set_num_threads(1)  # held to one thread: one core
        cmp.compare([Recording(model, "old", seen)], tokens, ["chunked"], options=OPTS, overlap=True)
    finally:
        torch.set_num_threads(threads)
    assert {name for name, _ in seen} == {"MainThread"}


def test_a_failure_beside_the_decode_stops_it_and_is_raised(model, tokens, two_threads):
    seen: list = []
    runners = [Recording(model, "old", seen, fail_on=T // 4, pace=0.1)]  # chunked's first step fails
    import time
    t0 = time.perf_counter()
    with pytest.raises(RuntimeError, match="boom at a step of 8"):
        cmp.compare(runners, tokens, ["chunked", "decode"], options=OPTS, overlap=True)
    side = [n for name, n in seen if name == "smearcli-decode"]
    # stopped at its next step (3.2 s of decode left to run otherwise), and no thread is left behind
    assert len(side) < T and time.perf_counter() - t0 < 0.1 * T / 2
    import threading
    assert not any(t.name == "smearcli-decode" for t in threading.enumerate())


def test_a_failure_in_the_side_run_is_raised_after_the_others(model, tokens, two_threads):
    seen: list = []
    runners = [Recording(model, "old", seen, fail_on=1)]  # every decode step fails
    with pytest.raises(RuntimeError, match="boom at a step of 1"):
        cmp.compare(runners, tokens, ["chunked", "decode"], options=OPTS, overlap=True)
    assert any(name == "MainThread" and n == T // 4 for name, n in seen)  # the chunks still ran


def test_the_json_carries_the_judges_word_statuses_power_and_confirmation(model, tokens):
    """compare/1 says what the judge said, as a scan/1 record does: the word, each run's status
    and float64 confirmation, and the power behind an ok."""
    import schema_check

    found = cmp.compare(model, tokens, ["chunked"], options=ScheduleOptions(chunks=2))
    doc = jsondoc.to_json(found)
    assert schema_check.document_problems(doc) == []
    assert doc["word"] == "bug" == found.word and doc["power"] is None  # no power check beside a departure
    by_logic = {r["logic"]: r for r in doc["runs"]}
    assert by_logic["old"]["status"] == "bug" and by_logic["fixed"]["status"] == "ok"
    conf = found.confirmation(found.get("chunked", "old"))
    assert by_logic["old"]["confirmation"] == conf.to_json() and conf.lifted >= 0.5 * conf.original
    assert by_logic["fixed"]["confirmation"] is None and doc["verdict"].startswith("BUG: ")

    agreed = cmp.compare(model, tokens, ["chunked"], logics=("fixed",), options=ScheduleOptions(chunks=2))
    doc = jsondoc.to_json(agreed)
    assert schema_check.document_problems(doc) == []
    assert doc["word"] == "ok" and doc["runs"][0]["status"] == "ok" and doc["power"]["sufficient"] is True
    assert doc["power"]["effects"] == {k: float(v) for k, v in agreed.power.effects.items()}
