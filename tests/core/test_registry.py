"""A new implementation plugs in through the registry alone: a toy runner gets the table, --json,
plot and --check of every other implementation, with no edit to compare, render or cli/commands."""

import json

import pytest
import torch
from typer.testing import CliRunner

from smearcli.engines import registry
from smearcli.cli.app import app
from smearcli.cli.impls import offered
from smearcli.cli.reports import comparison_job
from smearcli.measure.runner import Output, Runner
from smearcli.measure.schedules import ScheduleOptions

V, C = 64, 16


# -- the toy implementation: about 30 lines -------------------------------------------------------
class Toy(Runner):
    """h_t = E[x_t] + 0.5 E[x_{t-1}]; the cache keeps the last token's embedding, and with
    `drop` a multi-token cached step forgets it (the chunk-start bug class)."""
    label, layers, dtype = "toy", ("emb", "logits"), torch.float32

    def __init__(self, drop: bool):
        g = torch.Generator().manual_seed(0)
        self.E, self.W, self.drop = torch.randn(V, C, generator=g), torch.randn(C, V, generator=g), drop

    def _run(self, ids, prev):
        e = self.E[ids]
        prev = torch.zeros_like(e[:, :1]) if prev is None else prev
        h = e + 0.5 * torch.cat([prev, e[:, :-1]], dim=1)
        return Output(h @ self.W, [h])

    def forward(self, ids, capture):
        return self._run(ids, None)

    def new_cache(self, batch, max_len):
        return {"prev": None}

    def step(self, ids, cache, capture):
        out = self._run(ids, None if self.drop and ids.size(1) > 1 else cache["prev"])
        cache["prev"] = self.E[ids[:, -1:]]
        return out


def toy_prepare(spec, schedules, tolerance):
    tokens = torch.randint(0, V, (spec.batch, spec.seq_len or 48), generator=torch.Generator().manual_seed(spec.seed))
    return comparison_job([Toy(drop=spec.seed == 0)], tokens, schedules, ScheduleOptions(chunks=spec.chunks or 3),
                          tolerance)
# --------------------------------------------------------------------------------------------------


@pytest.fixture
def toy(monkeypatch):
    impl = registry.Implementation("toy", "a toy model", toy_prepare, runners=(Toy,))
    monkeypatch.setitem(registry.REGISTRY, "toy", impl)
    return impl


runner = CliRunner()


def test_toy_gets_the_table_and_the_verdict(toy):
    r = runner.invoke(app, ["compare", "--impl", "toy"])
    assert r.exit_code == 0, r.output
    assert "model: " in r.output.splitlines()[0]  # the title line, from the runner's description
    rows = {line.split()[0]: line for line in r.output.splitlines() if line.strip().startswith(("chunked", "decode"))}
    # the toy runner has no float64 form: its departures cannot be confirmed, so they are not bugs
    assert rows["chunked"].rstrip().endswith("unconfirmed") and "emb@16" in rows["chunked"]
    assert rows["decode"].rstrip().endswith("ok")
    assert "UNCONFIRMED: chunked, speculative diverge from the full forward pass" in r.output
    assert "not confirmed: its runner has no float64 form" in r.output


def test_toy_gets_json_check_and_plot(toy, tmp_path):
    r = runner.invoke(app, ["compare", "--impl", "toy", "--json", "--schedules", "chunked"])
    doc = json.loads(r.stdout)
    assert doc["schema"] == "smearcli.compare/1" and doc["layers"] == ["emb", "logits"]
    (run,) = doc["runs"]
    assert run["logic"] == "toy" and run["chunk_starts"] == [16, 32] and not run["passed"]
    assert run["first_departure"] == {"layer": "emb", "position": 16}
    assert runner.invoke(app, ["compare", "--impl", "toy", "--check"]).exit_code == 1
    assert runner.invoke(app, ["compare", "--impl", "toy", "--check", "--seed", "1"]).exit_code == 0  # no drop
    out = tmp_path / "toy.png"
    r = runner.invoke(app, ["plot", "--impl", "toy", "--out", str(out)])
    assert r.exit_code == 0, r.output
    assert out.stat().st_size > 10_000 and "schedule chunked" in r.output


def test_registry_refuses_what_an_implementation_cannot_do(toy):
    r = runner.invoke(app, ["compare", "--impl", "toy", "--schedules", "engine"])
    assert r.exit_code == 2 and "engine cannot run with --impl toy" in r.output
    r = runner.invoke(app, ["bench", "--impl", "toy"])
    assert r.exit_code == 2 and "bench does not run this implementation" in r.output
    r = runner.invoke(app, ["compare", "--impl", "toy", "--hf-model", "llama"])
    assert r.exit_code == 2 and "--hf-model is used by --impl hf" in r.output
    r = runner.invoke(app, ["compare", "--impl", "nope"])
    assert r.exit_code == 2 and "choose from ours, nanochat, both, hf, vllm, llamacpp, toy" in r.output


def test_each_implementation_is_offered_what_its_runners_can_run():
    """The lists the registry once held by hand now follow from the runners' capabilities, with
    one fix: a nanochat checkout, whose cache the adapter can neither crop nor copy, is no longer
    offered rollback (it was refused only once the run began). hf has no engine expansion and no
    BOS-started documents; vLLM runs only what its worker does."""
    got = {name: offered(registry.REGISTRY[name]) for name in ("ours", "nanochat", "both", "hf", "vllm")}
    assert got["ours"] == ["full", "prefill", "decode", "chunked", "engine", "speculative", "packed", "rollback"]
    assert got["nanochat"] == got["both"] == ["full", "prefill", "decode", "chunked", "engine", "speculative", "packed"]
    assert got["hf"] == ["full", "prefill", "decode", "chunked", "speculative", "padded", "rollback"]
    assert got["vllm"] == ["full", "prefill", "decode", "chunked", "prefix"]


def test_a_registrations_texts_name_options_by_field_and_the_cli_writes_the_flags():
    """A registration names no flag (the CLI owns them): `{field}` and `{this}` in its help and its
    refusals become the options' flags and its own `--impl NAME` (`cli.options.said`)."""
    from smearcli.cli.options import said

    for impl in registry.REGISTRY.values():
        for text in (impl.help, *(why for _, why in impl.refuses)):
            assert "--" not in text and "{" not in said(impl, text), (impl.name, text)
    hf = registry.REGISTRY["hf"]
    assert said(hf, dict(hf.refuses)["checkpoint"]) == \
        "configures a nanochat model and does not apply to --impl hf (--hf-model names the model)"
    r = runner.invoke(app, ["compare", "--impl", "vllm", "--hf-model", "x", "--reject", "1"])
    assert r.exit_code == 2 and "--reject sizes the rollback schedule, which --impl vllm does not run" in r.output
    from smearcli.cli.options import SHARED

    assert "ours: smearcli's reimplementation of nanochat's GPT; --logic picks the smear;" in SHARED["impl"][1].help
