"""What a runner returns is owned by the comparison (`smearcli.measure.owned`): every implementation's
outputs are copied where they are received, so a runner that hands back views of one buffer it
writes again cannot make a buggy cache look consistent.

Each implementation the default suite can run (ours, a nanochat checkout, transformers, vLLM's
stand-in worker, a `smearcli.testing` step) is held to it: every tensor its runner returned is kept
alive (so its memory cannot be handed out again), and no tensor the comparison measured may share
storage with one of them, unless its runner declares `fresh_outputs` (our GPT's): that claim is
held here too, by a run whose every output is unchanged once the later calls are made. On a checkout whose forward returns views of one reused output buffer,
`--check` finds the chunk-boundary bug it has (exit 1), where it reported consistency before."""

import json
import shutil
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from smearcli.measure import compare as compare_module
from smearcli import testing
from smearcli.measure.runner import Output, Runner
from smearcli.measure.schedules import RunResult
from conftest import standin_python

STANDIN = Path(__file__).resolve().parents[1] / "standin" / "old"
VLLM_STANDIN = Path(__file__).resolve().parents[1] / "vllm_standin.py"
SMALL = ["--depth", "2", "--seq-len", "40", "--chunks", "3", "--gen-len", "8", "--draft", "3"]
RETURNING = ("forward", "step", "forward_documents", "forward_padded", "run")
cli = CliRunner()

# the stand-in checkout's forward, rewritten to write every call's logits into one buffer per batch
# size, at the call's positions, and to return a view of it (as an engine's reused output tensor)
ALIASED_RETURN = """        key = (B, logits.dtype, logits.device)
        if key not in _OUT:  # one output buffer per batch size, reused by every call
            _OUT[key] = logits.new_zeros(B, self.cos.size(1), logits.size(-1))
        buf = _OUT[key]
        buf[:, T0:T0 + T] = logits
        return buf[:, T0:T0 + T]
"""


def aliased_checkout(tmp_path: Path) -> Path:
    root = tmp_path / "aliased"
    shutil.copytree(STANDIN, root, ignore=shutil.ignore_patterns("__pycache__"))
    gpt = root / "nanochat" / "gpt.py"
    text = gpt.read_text()
    assert text.count("        return logits\n") == 1 and text.count("\nclass GPT(") == 1
    text = text.replace("        return logits\n", ALIASED_RETURN)
    gpt.write_text(text.replace("\nclass GPT(", "\n_OUT = {}\n\n\nclass GPT(", 1))
    return root


def tensors(out) -> list:
    if isinstance(out, (Output, RunResult)):
        return [t for t in [out.logits, *(out.hiddens or [])] if isinstance(t, torch.Tensor) and t.numel()]
    return []


def subclasses(cls) -> list:
    out = []
    for sub in cls.__subclasses__():
        out += [sub] + subclasses(sub)
    return out


@pytest.fixture
def watched(monkeypatch):
    """(what every runner returned, kept alive; what each comparison measured)."""
    # every runner class, known before it is watched: an engine's package lends its runner from
    # `implementation` on first use, so the package alone may not have imported it yet (this test
    # failed for hf when its file ran alone)
    import smearcli.engines.transformers.implementation  # noqa: F401
    import smearcli.engines.nanochat.adapter  # noqa: F401
    import smearcli.engines.vllm.implementation  # noqa: F401
    import smearcli.gpt.gpt_runners  # noqa: F401

    held, measured = [], []
    for cls in {Runner, *subclasses(Runner)}:
        for name in RETURNING:
            if name not in vars(cls):
                continue

            def call(self, *args, _orig=vars(cls)[name], **kwargs):
                out = _orig(self, *args, **kwargs)
                if not self.fresh_outputs:  # a fresh runner's outputs are measured as they are
                    held.extend(tensors(out))
                return out
            monkeypatch.setattr(cls, name, call)
    collect = compare_module.collect

    def collecting(planned, results):
        ref, runs = collect(planned, results)
        measured.extend([*tensors(ref), *(t for r in runs for t in tensors(r))])
        return ref, runs
    monkeypatch.setattr(compare_module, "collect", collecting)
    return held, measured


def shared(held, measured) -> list:
    theirs = {t.untyped_storage().data_ptr() for t in held}
    return [tuple(t.shape) for t in measured if t.untyped_storage().data_ptr() in theirs]


def fake_vllm(tmp_path: Path, monkeypatch) -> list:
    from smearcli.engines import transformers as hf

    model = tmp_path / "llama"
    hf.tiny_model("llama").save_pretrained(model, safe_serialization=True)
    python = standin_python(tmp_path, VLLM_STANDIN)
    monkeypatch.setenv("SMEARCLI_STANDIN_MODE", "good")
    return ["--impl", "vllm", "--hf-model", str(model), "--vllm-python", str(python), "--seq-len", "64",
            "--chunks", "4", "--schedules", "prefill,chunked"]


@pytest.mark.parametrize("impl", ["ours", "nanochat", "hf", "vllm", "testing"])
def test_every_runner_owns_what_it_compares(impl, watched, ours, tokens, tmp_path, monkeypatch):
    held, measured = watched
    if impl == "testing":
        testing.check_cache_consistency(testing.gpt_step(ours, "fixed"), tokens, chunks=3)
    else:
        args = {"ours": ["--impl", "ours", *SMALL, "--schedules", "chunked,engine,rollback"],
                "nanochat": ["--impl", "nanochat", "--nanochat-path", str(STANDIN), *SMALL,
                             "--schedules", "chunked,engine,speculative"],
                "hf": ["--impl", "hf", "--hf-model", "llama", "--seq-len", "24", "--chunks", "3",
                       "--schedules", "chunked,padded,rollback"],
                "vllm": None}[impl] or fake_vllm(tmp_path, monkeypatch)
        r = cli.invoke(app(), ["compare", *args, "--json"])
        assert r.exit_code == 0, r.output
        assert json.loads(r.stdout)["schema"].startswith("smearcli.")
    assert measured and (held or impl in ("ours", "testing"))  # its runs were measured (ours: uncopied)
    assert shared(held, measured) == []


def test_a_fresh_runner_returns_what_no_later_call_writes(ours, tokens):
    """Our GPT runner declares `fresh_outputs`, so Owned measures its tensors uncopied: every call's
    outputs are new storage, and each is what it was when returned after every later call of the
    run (the cache, a later step, the next run's forward)."""
    from smearcli.gpt.gpt_runners import GPTRunner
    from smearcli.measure.owned import Owned

    runner = GPTRunner(ours, "old")
    assert runner.fresh_outputs
    owned = Owned(runner, "chunked")
    outs, snapshots = [], []

    def received(out):
        outs.extend(tensors(out))
        snapshots.extend(t.clone() for t in tensors(out))  # as it was when returned
    with torch.inference_mode():
        cache = owned.new_cache(tokens.size(0), tokens.size(1))
        for lo, hi in ((0, 1), (1, 9), (9, tokens.size(1))):  # a first token, then chunks
            received(owned.step(tokens[:, lo:hi], cache, True))
        received(owned.forward(tokens, True))
        again = runner.forward(tokens, True)  # one call more, on another cache
        runner.step(tokens[:, :5], runner.new_cache(tokens.size(0), tokens.size(1)), True)
    assert len(outs) == 4 * len(ours.transformer.h) + 8  # logits and every capture point, four calls
    assert all(torch.equal(t, s) for t, s in zip(outs, snapshots))
    storages = [t.untyped_storage().data_ptr() for t in outs]
    assert len(set(storages)) == len(storages)
    assert {t.untyped_storage().data_ptr() for t in tensors(again)}.isdisjoint(storages)


def app():
    from smearcli.cli.app import app as the_app
    return the_app


def test_an_aliased_checkout_is_the_bug_it_has_under_check(tmp_path):
    """Today's stand-in (the old smear) with its logits returned as views of one reused buffer:
    each later call overwrote the reference the audit measured against, so --check said
    'consistent' (exit 0). Owned, the run is what the plain checkout's is: the bug, exit 1."""
    aliased = aliased_checkout(tmp_path)
    docs = {}
    for name, path in (("aliased", aliased), ("plain", STANDIN)):
        r = cli.invoke(app(), ["compare", "--impl", "nanochat", "--nanochat-path", str(path), "--check", "--json",
                               "--schedules", "chunked", *SMALL])
        assert r.exit_code == 1, (name, r.output)
        assert r.stderr.count("smearcli: error: check failed") == 1, r.stderr
        docs[name] = json.loads(r.stdout)
    a, p = docs["aliased"], docs["plain"]
    assert a["passed"] is False and a["nanochat"]["word"] == "bug"
    assert a["verdict"].startswith("BUG: your code has the chunk-boundary smear bug")
    assert a["nanochat"]["runs"][0]["passed"] is False
    # the same numbers, bit for bit, as the checkout that returns fresh tensors
    assert a["nanochat"]["runs"][0]["max_abs_logits"] == p["nanochat"]["runs"][0]["max_abs_logits"] > 0
    assert a["nanochat"]["noise_floor"] == p["nanochat"]["noise_floor"]


class Buffered(Runner):
    """A toy runner whose every call returns views of one buffer it writes again (or, with `reuse`
    False, fresh tensors): h_t = E[x_t] + 0.5 E[x_{t-1}], the cache keeping the last embedding
    (and forgetting it at a multi-token step with `drop`)."""
    label, layers, dtype = "buffered", ("emb", "logits"), torch.float32

    def __init__(self, drop: bool, reuse: bool = True, T: int = 48, V: int = 64, C: int = 16):
        g = torch.Generator().manual_seed(0)
        self.E, self.W, self.drop, self.reuse = torch.randn(V, C, generator=g), torch.randn(C, V, generator=g), drop, reuse
        self.buf_l, self.buf_h = torch.zeros(1, T, V), torch.zeros(1, T, C)

    def _run(self, ids, prev, at):
        e = self.E[ids]
        prev = torch.zeros_like(e[:, :1]) if prev is None else prev
        h = e + 0.5 * torch.cat([prev, e[:, :-1]], dim=1)
        n = ids.size(1)
        if not self.reuse:
            return Output(h @ self.W, [h])
        self.buf_h[:, at:at + n], self.buf_l[:, at:at + n] = h, h @ self.W
        return Output(self.buf_l[:, at:at + n], [self.buf_h[:, at:at + n]])

    def forward(self, ids, capture):
        return self._run(ids, None, 0)

    def new_cache(self, batch, max_len):
        return {"prev": None, "pos": 0}

    def step(self, ids, cache, capture):
        out = self._run(ids, None if self.drop and ids.size(1) > 1 else cache["prev"], cache["pos"])
        cache["prev"], cache["pos"] = self.E[ids[:, -1:]], cache["pos"] + ids.size(1)
        return out


def test_a_runner_returning_views_of_one_buffer_is_measured_as_itself():
    tokens = torch.randint(0, 64, (1, 48), generator=torch.Generator().manual_seed(1))
    schedules = ["chunked", "decode", "speculative"]
    runs = {(drop, reuse): compare_module.compare(Buffered(drop, reuse), tokens, schedules, confirm=False, power=False)
            for drop in (False, True) for reuse in (False, True)}
    for drop in (False, True):  # reused buffers measure exactly what fresh tensors do
        fresh, reused = runs[(drop, False)], runs[(drop, True)]
        assert [m.max_abs_logits for m in reused.metrics] == [m.max_abs_logits for m in fresh.metrics]
        assert torch.equal(reused.reference.logits, fresh.reference.logits)
    assert runs[(False, True)].failures == []
    bad = runs[(True, True)]
    chunked = bad.get("chunked")  # the chunk that forgot its state departs at its start, in the embedding
    assert not chunked.passed and chunked.chunk_starts == [12, 24, 36] and bad.born_at(chunked) == ("emb", 12)
    assert bad.get("decode").passed  # one token at a time, the state is carried
