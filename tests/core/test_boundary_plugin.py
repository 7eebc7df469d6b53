"""A boundary plugs in with one module and one registration: a toy boundary, written
and registered here at run time (then taken out again), gets its table row, its JSON entry, its
verdict's shape, its figure mark, the CLI's schedule list for the implementations whose runners can
run it, its census entry and its reproducer, with no other file changed.

The toy: a cached prefill of the row's first half, then the rest in one step on a copy of the
cache. Our GPT's old logic drops the smear's predecessor at that chunk start (a bug the toy's
shape names); a runner whose copy forgets the cache fails it in the census."""

from __future__ import annotations

import contextlib
import json

import pytest
import torch
from typer.testing import CliRunner

from smearcli.measure import compare, jsondoc, schedules
from smearcli.judging.verdicts import BUG
from smearcli.engines import registry
from smearcli.cli.app import app
from smearcli.cli.impls import offered
from smearcli.util.defaults import SCHEDULE_NAMES
from smearcli.render import figures
from smearcli.measure.runner import COPY
from smearcli.measure.steps import Ran, Repro, Schedule
from smearcli.gpt.weights import random_config, random_model

# -- the toy boundary: everything a new boundary writes ------------------------------------------
TOY = "copied"
KIND = "toy_copy"  # the mark it records: where the rest was fed on the copy
WORDS = "cache copied, the rest fed on the copy"
SHAPE = "state lost in a cache copy"


def half(T: int) -> int:
    return T // 2


def run(runner, tokens, opts, capture, on_step=None):
    """The first half as one cached step, the rest as one step on a copy of that cache."""
    B, T = tokens.shape
    h = half(T)
    cache = runner.new_cache(B, T)
    first = runner.step(tokens[:, :h], cache, capture)
    rest = runner.step(tokens[:, h:], runner.copy(cache), capture)
    if on_step is not None:
        on_step(T)
    hiddens = None
    if capture and first.hiddens is not None and rest.hiddens is not None:
        hiddens = [torch.cat([a.float(), b.float()], dim=1) for a, b in zip(first.hiddens, rest.hiddens)]
    return Ran(torch.cat([first.logits.float(), rest.logits.float()], dim=1), hiddens, [h, T - h], {KIND: [h]})


REPRO = Repro("A prefill of half the row, then the rest fed on a deep copy of the cache,", '''HALF = {half!r}


def copied(model, ids):
    """Half the row, then the rest on a copy of the cache."""
    first, cache = step(model, ids[:, :HALF], None, 0)
    rest, _ = step(model, ids[:, HALF:], copy.deepcopy(cache), HALF)
    return torch.cat([first, rest], dim=1)
''', lambda entry, T: {"half": half(T)})

TOY_SCHEDULE = Schedule(TOY, "the first half, then the rest on a copy of the cache", run, frozenset({COPY}),
                        shape=SHAPE, marks=((KIND, WORDS),), census=True, repro=REPRO)
# ------------------------------------------------------------------------------------------------


@contextlib.contextmanager
def registered():
    schedules.register(TOY_SCHEDULE)  # the one registration
    try:
        yield TOY_SCHEDULE
    finally:
        schedules.unregister(TOY)
    # taken out again: the built-ins first, as ever (an engine imported earlier may have added its own after them)
    assert TOY not in schedules.SCHEDULES and tuple(schedules.SCHEDULES)[:len(SCHEDULE_NAMES)] == SCHEDULE_NAMES


@pytest.fixture
def toy():
    with registered() as schedule:
        yield schedule


@pytest.fixture(scope="module")
def model():
    return random_model(random_config(1), seed=2).model


def tokens(T=32):
    return torch.randint(0, 256, (1, T), generator=torch.Generator().manual_seed(3))


def test_the_toy_gets_its_table_row_json_entry_and_shape(toy, model):
    c = compare.compare(model, tokens(), [TOY], logics=("old", "fixed"))
    rows = [line.split() for line in c.table().splitlines() if line.split()[:1] == [TOY]]
    assert [r[1] for r in rows] == ["old", "fixed"] and rows[0][-1] == "BUG" and rows[1][-1] == "ok", c.table()
    doc = jsondoc.to_json(c)
    assert [(r["schedule"], r["logic"]) for r in doc["runs"]] == [(TOY, "old"), (TOY, "fixed")]
    old = doc["runs"][0]
    assert old["boundaries"][KIND] == [16] and old["chunk_starts"] == [16]  # its mark, and the chunk start
    assert not old["passed"] and doc["runs"][1]["passed"]
    assert c.word is BUG and f"({SHAPE})" in c.verdict, c.verdict


def test_the_toy_gets_its_figure_mark(toy, model):
    c = compare.compare(model, tokens(), [TOY], logics=("old",), power=False)
    fig = figures.figure(c, TOY, kind="error")
    lines = [a for ax in fig.get_axes() for a in ax.lines if a.get_gid() == f"mark:{KIND}"]
    assert [int(a.get_xdata()[0]) for a in lines] == [16]
    assert WORDS in [t.get_text() for t in fig.legends[0].get_texts()]


def test_the_cli_offers_the_toy_where_the_runners_can_copy(toy):
    assert TOY in offered(registry.REGISTRY["ours"]) and TOY in offered(registry.REGISTRY["hf"])
    assert TOY not in offered(registry.REGISTRY["nanochat"])  # a checkout's cache cannot be copied
    r = CliRunner().invoke(app, ["compare", "--depth", "1", "--seq-len", "32", "--schedules", TOY, "--json"])
    assert r.exit_code == 0, r.output
    assert {run["schedule"] for run in json.loads(r.stdout)["runs"]} == {TOY}


# -- the census (transformers) --------------------------------------------------------------------

def census_llama():
    pytest.importorskip("transformers", reason="transformers is not installed: pip install 'smearcli[hf]'")
    from smearcli.engines.transformers.check import T, build, split_points
    from smearcli.tiny.derive import derive

    cfg = derive("llama").config
    return build(cfg, None, 0), cfg, tokens(T), split_points(cfg, T)


def test_the_census_runs_the_toy_and_reports_it():
    model, cfg, ids, plans = census_llama()
    # the census's own combinations are registered on this import: before the toy, whichever test
    # file this process ran first
    from smearcli.engines.transformers import boundary
    from smearcli.census import report
    from smearcli.census.record import new as new_record
    from smearcli.engines.transformers.check import check_model
    from smearcli.judging.verdicts import OK

    with registered():
        assert TOY in boundary.SCHEDULES
        out = check_model(model, ids, plans)
        assert out["verdict"] == OK and out["boundaries"][TOY].status == OK, out
        assert out["schedules"][TOY].passed
        md = report.markdown([new_record("llama", **out)])  # its column and its line of the section
        names = boundary.SCHEDULES  # the built-in boundaries, the census's combinations, then the toy
        assert names[-1] == TOY and f"{' / '.join(names)} |" in md
        assert f"## Padded, rollback, {', '.join(names[2:-1])} and {TOY}" in md
        assert f"- {TOY}: 1 {OK}." in md


@pytest.mark.slow
def test_the_toys_reproducer_needs_torch_and_transformers_only(toy, tmp_path):
    from smearcli.engines.transformers import repro
    from smearcli.census.record import BoundaryResult, bare

    model, cfg, ids, plans = census_llama()
    record = bare("llama", BUG, model_class=type(model).__name__, worst_schedule=TOY,
                  steps=[half(ids.size(1))], boundaries={TOY: BoundaryResult(BUG, max_abs=1.0)})
    path = repro.write(record, cfg, tmp_path / "llama-copied.py", schedule=TOY)
    assert "def copied(model, ids):" in path.read_text() and f"HALF = {half(ids.size(1))}" in path.read_text()
    status, last = repro.run(path)
    assert status == 0 and "no bug" in last, last  # the llama's cache copies: the toy passes there


def test_a_copy_that_forgets_is_the_toys_bug_in_the_census(toy):
    from smearcli.engines.transformers.check import check_model
    from smearcli.engines.transformers.cache_runner import CacheRunner

    class Forgets(CacheRunner):
        """A runner whose copy is a fresh, empty cache."""

        def copy(self, cache):
            return self.new_cache(1, 0)

    model, cfg, ids, plans = census_llama()
    out = check_model(model, ids, plans, make=Forgets)
    e = out["boundaries"][TOY]
    assert e.status == BUG and e.shape == SHAPE, e
