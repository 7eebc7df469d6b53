"""A runner's output that cannot be measured is the caller's mistake, said where the output is
received (`smearcli.measure.owned`): a ValueError naming the call, the shape expected and the shape
returned, never a RuntimeError from a schedule's buffer or an IndexError from a metric. Through the
CLI (a registered implementation's runner) it is that runner's failure: one `smearcli: error:`
line, exit status 1, no file written and none replaced."""

import pytest
import torch
from typer.testing import CliRunner

from smearcli.measure import compare as cmp
from smearcli import testing
from smearcli.engines import registry
from smearcli.cli.app import app
from smearcli.cli.reports import comparison_job
from smearcli.measure.runner import Output, Runner
from smearcli.measure.schedules import ScheduleOptions, run_steps

V, C, T = 32, 8, 12
g = torch.Generator().manual_seed(0)
E, W = torch.randn(V, C, generator=g), torch.randn(C, V, generator=g)
TOKENS = torch.arange(T) % V


def shrinking(ids, cache):
    """The full pass (cache None) gives V columns; every cached call one fewer."""
    logits = E[ids] @ W
    return (logits if cache is None else logits[..., :V - 1]), (cache or 0) + 1


def empty(ids, cache):
    return torch.zeros(ids.size(0), ids.size(1), 0), cache


def test_a_vocabulary_that_shrinks_on_cached_calls_is_named_where_it_is_received():
    with pytest.raises(ValueError, match=r"^model: a cached step over 1 token \(call 2 of the decode run\) returned "
                                         r"logits of shape \(1, 1, 31\); expected \(1, 1, 32\): the vocabulary of 32 "
                                         r"that its call 1 returned$"):
        testing.check_cache_consistency(shrinking, TOKENS, chunks=3, schedules=("decode",))
    with pytest.raises(ValueError, match=r"a cached step over 4 tokens \(call 2 of the chunked run\) returned logits "
                                         r"of shape \(1, 4, 31\); expected \(1, 4, 32\)"):
        testing.check_cache_consistency(shrinking, TOKENS, chunks=3, schedules=("chunked",))


def test_an_empty_vocabulary_is_named_where_it_is_received():
    with pytest.raises(ValueError, match=r"^model: its forward pass without a cache over 12 tokens \(call 1 of the "
                                         r"full run\) returned logits of shape \(1, 12, 0\), an empty vocabulary; "
                                         r"expected \(1, 12, vocab\)$"):
        testing.check_cache_consistency(empty, TOKENS, chunks=3)


def test_steps_whose_width_differs_from_the_reference_are_named():
    def step(ids, cache):  # consistent with itself, one column short of `full`
        return (E[ids] @ W)[..., :V - 1], cache
    with pytest.raises(ValueError, match=r"^model: its decode run returned logits of shape \(1, 12, 31\); expected "
                                         r"\(1, 12, 32\), the width of the reference's \(model, full\) \(1, 12, 32\)$"):
        testing.check_cache_consistency(step, TOKENS, chunks=3, schedules=("decode",), full=lambda ids: E[ids] @ W)


class Toy(Runner):
    """A runner subclass; `bad(call, logits, hidden)` rewrites what its `call`-th cached step returns."""
    label, layers, dtype = "toy", ("emb", "logits"), torch.float32

    def __init__(self, bad=None):
        self.bad, self.calls = bad, 0

    def forward(self, ids, capture):
        h = E[ids]
        return Output(h @ W, [h])

    def new_cache(self, batch, max_len):
        return {}

    def step(self, ids, cache, capture):
        self.calls += 1
        h = E[ids]
        out = Output(h @ W, [h])
        return self.bad(self.calls, *out) if self.bad else out


@pytest.mark.parametrize("bad,words", [
    (lambda n, lg, h: Output(lg[..., :5] if n > 1 else lg, h),
     r"toy: a cached step over 4 tokens \(call 2 of the chunked run\) returned logits of shape \(1, 4, 5\); "
     r"expected \(1, 4, 32\)"),
    (lambda n, lg, h: Output(lg[..., :0], h), r"returned logits of shape \(1, 4, 0\), an empty vocabulary"),
    (lambda n, lg, h: Output(lg.long(), h), r"returned int64 logits of shape \(1, 4, 32\); expected floating point"),
    (lambda n, lg, h: Output(lg[0], h), r"returned logits of shape \(4, 32\); expected \(1, 4, vocab\)"),
    (lambda n, lg, h: Output(lg, [x[..., :n] for x in h]),
     r"returned hidden states of widths \[2\]; its earlier calls in this run returned \[1\]"),
    (lambda n, lg, h: [lg], r"returned a list, not an Output\(logits, hiddens\)"),
])
def test_a_runner_subclass_gets_the_same_answer(bad, words):
    with pytest.raises(ValueError, match=words):
        cmp.compare(Toy(bad), TOKENS[None], ["chunked"], options=ScheduleOptions(chunks=3))


def test_run_steps_is_the_same_seam():
    with pytest.raises(ValueError, match=r"toy: a cached step over 6 tokens \(call 2 of the fuzz run\) returned "
                                         r"logits of shape \(1, 6, 5\)"):
        run_steps(Toy(lambda n, lg, h: Output(lg[..., :5] if n > 1 else lg, h)), TOKENS[None], [6, 6],
                  schedule="fuzz")


@pytest.fixture
def shrinking_impl(monkeypatch):
    def prepare(spec, schedules, tolerance):
        bad = lambda n, lg, h: Output(lg[..., :V - 1] if n > 1 else lg, h)  # noqa: E731
        return comparison_job([Toy(bad)], TOKENS[None], schedules, ScheduleOptions(chunks=3), tolerance)
    monkeypatch.setitem(registry.REGISTRY, "shrinks", registry.Implementation("shrinks", "a bad runner", prepare,
                                                                               runners=(Toy,)))


def test_through_the_cli_it_is_the_runners_failure(shrinking_impl, tmp_path):
    saved = tmp_path / "runs.pt"
    saved.write_bytes(b"an earlier run's file")
    for extra in ([], ["--json", "--check"], ["--save", str(saved)]):
        r = CliRunner().invoke(app, ["compare", "--impl", "shrinks", "--schedules", "chunked", *extra])
        assert r.exit_code == 1, r.output
        assert r.stderr.splitlines() == [
            "smearcli: error: toy: a cached step over 4 tokens (call 2 of the chunked run) returned logits of "
            "shape (1, 4, 31); expected (1, 4, 32): the vocabulary of 32 that its call 1 returned"], r.stderr
        assert r.stdout == "" and "internal error" not in r.output and "Traceback" not in r.output
    assert saved.read_bytes() == b"an earlier run's file"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["runs.pt"]


class WholeRuns(Toy):
    """An engine that runs whole schedules itself (`run()`), returning `logits` for each."""
    runs_itself = frozenset({"chunked"})

    def __init__(self, logits):
        super().__init__()
        self.logits = logits

    def run(self, schedule, tokens, options):
        from smearcli.measure.schedules import RunResult

        return RunResult(schedule, self.label, self.logits, None, [tokens.size(1)], [0])


def test_a_whole_run_an_engine_returns_is_checked_and_owned():
    from smearcli.measure.schedules import run_schedule

    good = torch.randn(1, T, V)
    got = run_schedule(WholeRuns(good), TOKENS[None], "chunked")
    assert torch.equal(got.logits, good) and got.logits.untyped_storage().data_ptr() != good.untyped_storage().data_ptr()
    with pytest.raises(ValueError, match=r"toy: its own run of the chunked schedule returned logits of shape "
                                         r"\(1, 12, 0\), an empty vocabulary; expected \(1, 12, vocab\)"):
        run_schedule(WholeRuns(torch.randn(1, T, 0)), TOKENS[None], "chunked")
    with pytest.raises(ValueError, match=r"returned logits of shape \(12, 32\); expected \(rows, 12, vocab\)"):
        run_schedule(WholeRuns(torch.randn(T, V)), TOKENS[None], "chunked")
