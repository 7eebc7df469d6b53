"""Schedules: what each feeds a runner, the boundaries it records, and what a runner must declare."""

import pytest
import torch

from smearcli.gpt import gpt_runners
from smearcli.util.defaults import ENGINE_SCHEDULES, SCHEDULE_NAMES
from smearcli.measure.runner import Output, Runner
from smearcli.measure.schedules import SCHEDULES, STEP_PLANS, plan_steps, run_schedule, runnable
from smearcli.measure.steps import CACHE_COPY, CHUNK_START, RunResult, ScheduleOptions
from smearcli.gpt.weights import random_config, random_model

T = 24


@pytest.fixture(scope="module")
def model():
    return random_model(random_config(1), seed=2).model


@pytest.fixture(scope="module")
def tokens():
    return torch.randint(0, 256, (1, T), generator=torch.Generator().manual_seed(3))


def test_boundaries_are_recorded_by_kind(model, tokens):
    opts = ScheduleOptions(chunk_sizes=(10, 4, 10), gen_len=8, samples=3, draft=3)
    fixed = gpt_runners.GPTRunner(model, "fixed")
    chunked = run_schedule(fixed, tokens, "chunked", opts=opts)
    assert chunked.boundaries == {CHUNK_START: [10, 14]}
    engine = run_schedule(fixed, tokens, "engine", opts=opts)
    assert engine.boundaries == {CACHE_COPY: [16]} and engine.expand_at == 16
    assert engine.row_map == [0, 0, 0] and engine.logits.shape[0] == 3
    spec = run_schedule(fixed, tokens, "speculative", opts=opts)
    assert spec.boundaries[CHUNK_START] == [16, 19, 22] == spec.chunk_starts
    assert run_schedule(fixed, tokens, "decode", opts=opts).boundaries == {}  # one-token steps only


def test_every_schedule_covers_every_position_once(model, tokens):
    opts = ScheduleOptions(chunks=5, gen_len=7, draft=2, reject=1)
    for name in SCHEDULES:
        if not runnable(gpt_runners.GPTRunner(model, "fixed"), name):
            # no padding mask; prefix: only engines; a schedule an engine registered (llama.cpp's ubatch)
            assert name == "padded" or name in ENGINE_SCHEDULES or name not in SCHEDULE_NAMES
            continue
        r = run_schedule(model, tokens, name, "fixed", opts)
        assert r.logits.shape[1] == T
        assert sum(r.steps) == T or name in ("rollback", "rollback-window")  # they feed rejected tokens too
        assert len(r.hiddens) == model.config.n_layer + 1 and all(h.shape[1] == T for h in r.hiddens)
        if name in STEP_PLANS:
            assert r.steps == plan_steps(name, T, opts)


class Minimal(Runner):
    """Only forward and step: no cache copy, so the engine schedule is not for it."""
    label, layers = "minimal", ("logits",)

    def __init__(self, model):
        self.inner = gpt_runners.GPTRunner(model, "fixed")

    def forward(self, tokens, capture):
        return Output(self.inner.forward(tokens, False).logits, None)

    def new_cache(self, batch, max_len):
        return self.inner.new_cache(batch, max_len)

    def step(self, tokens, cache, capture):
        return Output(self.inner.step(tokens, cache, False).logits, None)


def test_a_schedule_needs_what_the_runner_declares(model, tokens):
    m = Minimal(model)
    assert not runnable(m, "engine") and runnable(m, "chunked")
    with pytest.raises(ValueError, match="minimal cannot run the engine schedule.*expand"):
        run_schedule(m, tokens, "engine")
    r = run_schedule(m, tokens, "chunked", opts=ScheduleOptions(chunks=3))
    assert r.hiddens is None and r.logic == "minimal" and r.chunk_starts == [8, 16]


def test_an_engine_that_schedules_itself_is_asked_first(model, tokens):
    class Engine(Minimal):
        label = "engine-like"
        asked = []

        def run(self, schedule, toks, options):
            self.asked.append(schedule)
            if schedule != "chunked":
                return None  # driven step by step
            logits = self.inner.forward(toks, False).logits
            return RunResult(schedule, self.label, logits, None, [T // 2, T // 2], [0])

    e = Engine(model)
    r = run_schedule(e, tokens, "chunked", opts=ScheduleOptions(chunks=3))
    assert r.steps == [12, 12] and r.chunk_starts == [12]  # its own chunking, not the plan's
    assert run_schedule(e, tokens, "prefill").steps == [T]
    assert e.asked == ["chunked", "prefill"]


def test_a_wrong_step_is_named(model, tokens):
    class Short(Minimal):
        label = "short"

        def step(self, toks, cache, capture):
            return Output(super().step(toks, cache, capture).logits[:, :1], None)

    with pytest.raises(ValueError, match=r"short: a cached step over 8 tokens \(call 1 of the chunked run\) returned "
                                         r"logits of shape \(1, 1, 256\); expected \(1, 8, vocab\)"):
        run_schedule(Short(model), tokens, "chunked", opts=ScheduleOptions(chunks=3))


def test_the_prefix_schedule_is_only_for_engines_with_a_prefix_cache(model, tokens):
    with pytest.raises(ValueError, match="cannot run the prefix schedule .*prefix_cache"):
        run_schedule(model, tokens, "prefix", "fixed")


@pytest.mark.parametrize("schedule", ["decode", "chunked", "engine", "speculative"])
def test_step_outputs_are_written_in_place_not_concatenated(model, tokens, schedule, monkeypatch):
    """Each step's logits go straight into the run's one (rows, T, V) tensor: torch.cat never
    sees a logits row (at d12 and 1024 tokens one is 256 MB, and the engine's were 4 s of
    concatenation); the logits are those of plain per-step calls, in order."""
    V = model.config.vocab_size
    seen = []
    real = torch.cat

    def watch(parts, *a, **k):
        seen.extend(tuple(p.shape) for p in parts if p.dim() == 3 and p.size(-1) == V)
        return real(parts, *a, **k)

    monkeypatch.setattr(torch, "cat", watch)
    run = run_schedule(gpt_runners.GPTRunner(model, "fixed"), tokens, schedule)
    monkeypatch.setattr(torch, "cat", real)
    assert not seen, seen
    runner = gpt_runners.GPTRunner(model, "fixed")
    rows = run.logits.size(0) // tokens.size(0)
    with torch.inference_mode():  # the same steps by hand, on the first row
        cache, pos, parts = runner.new_cache(1, tokens.size(1)), 0, []
        for n in run.steps:
            parts.append(runner.step(tokens[:1, pos:pos + n], cache, False).logits)
            pos += n
    if schedule != "engine":  # the engine decodes its rows as a batch: equal only to rounding there
        assert torch.equal(run.logits[rows - 1], real(parts, dim=1)[0])
    assert run.hiddens is not None and all(h.shape[:2] == run.logits.shape[:2] for h in run.hiddens)


@pytest.mark.parametrize("fresh", [True, False])
def test_a_one_step_run_keeps_its_step_outputs_without_another_copy(model, tokens, monkeypatch, fresh):
    """prefill is one step over every token: the run holds that step's outputs as the seam received
    them (a fresh runner's own tensors, another runner's copy), not a second copy in a new buffer."""
    runner = gpt_runners.GPTRunner(model, "fixed")
    monkeypatch.setattr(runner, "fresh_outputs", fresh)
    returned = []
    step = runner.step
    monkeypatch.setattr(runner, "step", lambda *a: returned.append(step(*a)) or returned[-1])
    got = run_schedule(runner, tokens, "prefill", capture=True)
    (out,) = returned
    same = got.logits.untyped_storage().data_ptr() == out.logits.untyped_storage().data_ptr()
    assert same is fresh
    assert torch.equal(got.logits, out.logits) and all(torch.equal(a, b) for a, b in zip(got.hiddens, out.hiddens))
    assert got.logits.dtype == torch.float32 and len(got.hiddens) == model.config.n_layer + 1


@pytest.fixture
def one_thread():
    """Torch on one thread while the test runs: whether equal rows of one batched step come out bit
    for bit alike depends on how torch splits the batch over its threads (on 2 threads here they
    did not, and the engine test below failed whenever its file ran outside the suite's `-n 2`)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def test_engine_samples_that_decode_alike_are_one_row_held_once(model, tokens, one_thread):
    """The engine's sample rows share one prefill, so their prompt logits are equal by
    construction; where the samples also decode bit for bit alike, the run holds one (1, T, V)
    row expanded to S rows, not S copies (at d12 / 1024 tokens each copy was 260 MB of fresh
    memory). Samples that decode differently are written out row by row."""
    opts = ScheduleOptions(gen_len=8, samples=3)
    P, V = T - 8, model.config.vocab_size
    run = run_schedule(gpt_runners.GPTRunner(model, "fixed"), tokens, "engine", opts=opts)
    assert run.logits.shape == (3, T, V) and run.logits.stride(0) == 0
    assert run.logits.untyped_storage().nbytes() == T * V * 4  # one row's memory
    runner = gpt_runners.GPTRunner(model, "fixed")
    with torch.inference_mode():
        prompt = runner.step(tokens[:, :P], runner.new_cache(1, P), False).logits
    assert torch.equal(run.logits[2, :P], prompt[0])

    class Apart(gpt_runners.GPTRunner):  # each sample row's logits moved by its row number
        def step(self, toks, cache, capture):
            out = super().step(toks, cache, capture)
            shift = torch.arange(toks.size(0), dtype=out.logits.dtype).view(-1, 1, 1)
            return Output(out.logits + shift, out.hiddens)

    apart = run_schedule(Apart(model, "fixed"), tokens, "engine", opts=opts)
    assert apart.logits.stride(0) != 0
    assert torch.equal(apart.logits[:, :P], run.logits[:, :P])  # the prompt in every row, written out
    assert torch.equal(apart.logits[2, P:], run.logits[2, P:] + 2)  # each row its own


def test_streamed_steps_are_the_run_s_logits_in_order(model, tokens):
    """`stream_logits` hands over each step's logits, first position and all, and keeps none: put
    together they are the run's logits, bit for bit. A schedule that is not a plain sequence of
    steps is not run at all."""
    from smearcli.measure.schedules import stream_logits

    opts = ScheduleOptions(chunk_sizes=(10, 4, 10), gen_len=8, draft=3)
    runner = gpt_runners.GPTRunner(model, "old")
    for schedule in STEP_PLANS:
        got = []
        assert stream_logits(runner, tokens, schedule, lambda pos, x: got.append((pos, x)), opts)
        run = run_schedule(runner, tokens, schedule, opts=opts, capture=False)
        assert [p for p, _ in got] == [sum(run.steps[:i]) for i in range(len(run.steps))]
        assert torch.equal(torch.cat([x for _, x in got], dim=1), run.logits)

    class Counted(gpt_runners.GPTRunner):
        calls = 0

        def step(self, *a, **k):
            Counted.calls += 1
            return super().step(*a, **k)

    assert not stream_logits(Counted(model, "old"), tokens, "engine", lambda pos, x: None, opts)
    assert Counted.calls == 0
