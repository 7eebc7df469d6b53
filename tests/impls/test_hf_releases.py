"""Every transformers release from 5.0 on: the cache API
is detected by one detector (`engines.transformers.api`) that the runner, the census and the reproducers all
use; one frame finder (`smearcli.util.frames`) says where their code raised; transformers' fast-kernel
fallbacks are said once per census run; a boundary that agreed beside a failure is "not judged";
every census record names its release. The slow test installs the oldest supported release in a
scratch venv and runs the census there."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("transformers", reason="transformers is not installed: pip install 'smearcli[hf]'")

import transformers  # noqa: E402

from smearcli.util import frames  # noqa: E402
from smearcli.engines.transformers import boundary, repro  # noqa: E402
from smearcli.measure import shapes  # noqa: E402
from smearcli.census import isolate, record, records, report  # noqa: E402
from smearcli.engines import transformers as hf  # noqa: E402
from smearcli.engines.transformers import api, kernels, page  # noqa: E402
from smearcli.engines.transformers.cache_runner import CacheRunner  # noqa: E402
from smearcli.engines.transformers.session import InProcess  # noqa: E402
from smearcli.judging.verdicts import NOT_JUDGED, NOT_JUDGED_WHY, OK  # noqa: E402
from conftest import ROOT, scan_into  # noqa: E402 - the clone's root

OLDEST = "5.0.0"  # the oldest release the hf extra allows (pyproject.toml: transformers>=5.0), run end to end


# -- stand-ins for each release's forward signature ------------------------------------------------
class Out:
    def __init__(self, **kw):
        self.__dict__.update(kw)


class Recorder(torch.nn.Module):
    """A model whose forward has a given release's cache keywords and records how it was called."""

    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.zeros(1))
        self.calls: list = []

    def run(self, kw):
        self.calls.append(kw)
        ids = kw["input_ids"]
        return Out(logits=torch.zeros(*ids.shape, 4), **{k: "theirs" for k in api.KEYWORDS if k in kw})


class PastKeyValues50(Recorder):  # attention models, 5.0 - 5.23
    def forward(self, input_ids=None, past_key_values=None, cache_position=None, position_ids=None,
                attention_mask=None, use_cache=None, **_):
        return self.run(dict(input_ids=input_ids, past_key_values=past_key_values, cache_position=cache_position))


class CacheParams50(Recorder):  # Mamba-style, 5.0 - 5.3: cache_position on every cached step
    def forward(self, input_ids=None, cache_params=None, cache_position=None, attention_mask=None, use_cache=None,
                **_):
        return self.run(dict(input_ids=input_ids, cache_params=cache_params, cache_position=cache_position))


class CacheParams54(Recorder):  # Mamba-style, 5.4 - 5.23: no cache_position any more
    def forward(self, input_ids=None, cache_params=None, attention_mask=None, use_cache=None, **_):
        return self.run(dict(input_ids=input_ids, cache_params=cache_params))


class Cache524(Recorder):  # every model in 5.24
    def forward(self, input_ids=None, cache=None, position_ids=None, attention_mask=None, use_cache=None, **_):
        return self.run(dict(input_ids=input_ids, cache=cache))


class State(Recorder):  # RWKV in every release
    def forward(self, input_ids=None, state=None, attention_mask=None, use_cache=None, **_):
        return self.run(dict(input_ids=input_ids, state=state))


class Internal(Recorder):  # RecurrentGemma 5.0 - 5.3: the model keeps its state itself
    def forward(self, input_ids=None, cache_position=None, position_ids=None, use_cache=None, **_):
        return self.run(dict(input_ids=input_ids))


RELEASES = {PastKeyValues50: ("past_key_values", False), CacheParams50: ("cache_params", True),
            CacheParams54: ("cache_params", False), Cache524: ("cache", False), State: ("state", False)}


@pytest.mark.parametrize("cls", list(RELEASES), ids=lambda c: c.__name__)
def test_the_detector_reads_each_release_from_the_forward(cls):
    keyword, position = RELEASES[cls]
    found = api.detect(cls())
    assert (found.keyword, found.cache_position) == (keyword, position)
    assert found.mask == ("attention_mask" in cls.forward.__code__.co_varnames)
    runner = CacheRunner(cls())
    assert (runner.keyword, runner.cache_position) == (keyword, position)  # the runner uses it


def test_the_newest_keyword_wins_and_a_forward_without_one_is_refused_with_why():
    class Both(Recorder):
        def forward(self, input_ids=None, past_key_values=None, cache=None, use_cache=None, **_):
            return self.run(dict(input_ids=input_ids))
    assert api.cache_keyword(Both()) == "cache"
    assert api.detect(Internal()) is None
    with pytest.raises(TypeError, match="Internal.forward takes no cache"):
        CacheRunner(Internal())
    with pytest.raises(Exception, match="none of cache, past_key_values, cache_params, state"):
        hf.cache_api(Internal())


@pytest.mark.parametrize("cls", list(RELEASES), ids=lambda c: c.__name__)
def test_the_runner_passes_the_cache_back_as_the_release_takes_it(cls):
    keyword, position = RELEASES[cls]
    model = cls()
    runner = CacheRunner(model)
    cache = runner.new_cache(1, 5)
    with torch.inference_mode():
        runner.step(torch.zeros(1, 3, dtype=torch.long), cache, False)
        runner.step(torch.zeros(1, 2, dtype=torch.long), cache, False)
    second = model.calls[-1]
    assert second[keyword] == "theirs"  # the cache the first call returned, under the right keyword
    if position:
        assert second["cache_position"].tolist() == [3, 4]
    elif "cache_position" in second:
        assert second["cache_position"] is None


def test_the_caller_made_cache_takes_the_config_only_where_the_release_does(monkeypatch):
    class WithConfig:
        def __init__(self, config=None):
            self.config = config

    class Bare:
        def __init__(self):
            self.config = "none taken"
    model = Out(config="the model's config")
    tf = sys.modules["transformers"]  # building a model may re-import it: patch the one in use
    monkeypatch.setattr(tf, "DynamicCache", WithConfig)
    assert api.caller_cache(model).config == "the model's config"
    monkeypatch.setattr(tf, "DynamicCache", Bare)
    assert api.caller_cache(model).config == "none taken"


# -- the reproducer detects with the same code ------------------------------------------------------
def reproducer_namespace() -> dict:
    """The reproducer's model fragment, run as a reproducer runs it (no smearcli in it)."""
    ns: dict = {}
    source = "import contextlib, copy, inspect, json, sys\nimport torch\nimport transformers\n" + repro.MODEL.format()
    assert "smearcli" not in source
    exec(compile(source, "<reproducer>", "exec"), ns)
    return ns


def test_the_reproducer_embeds_the_one_detector_and_agrees_with_it():
    ns = reproducer_namespace()
    assert ns["KEYWORDS"] == api.KEYWORDS
    models = [cls() for cls in (*RELEASES, Internal)] + [hf.tiny_model(n) for n in ("llama", "mamba")]
    for m in models:
        kw = api.cache_keyword(m)
        assert ns["cache_keyword"](m) == kw, type(m).__name__
        assert ns["passes_cache_position"](m, kw) == api.passes_cache_position(m, kw)
    out = Out(past_key_values=None, cache_params="c")
    assert ns["out_cache"](out) == api.out_cache(out) == "c"


# -- past recording: what each release's generate passes activate_past_recording ------------------
class Layer524:  # 5.0 - 5.24: a layer records its past, no count
    def activate_past_recording(self):
        self.said = {}


class Layer525:  # 5.25: a linear-attention layer keeps the last N recurrent states
    def activate_past_recording(self, recurrent_states_to_keep=None):
        self.said = {"recurrent_states_to_keep": recurrent_states_to_keep}


class Sliding525:  # 5.25: a sliding-window layer records its past, takes any keywords, keeps no count
    def activate_past_recording(self, **kwargs):
        self.said = {}


class Forwarding:  # 5.25's DynamicCache: **kwargs, handed to each layer that records
    def __init__(self, *layers):
        self.layers = list(layers)

    def activate_past_recording(self, **kwargs):
        for layer in self.layers:
            layer.activate_past_recording(**kwargs)

    def crop(self, n):
        pass


class Plain524(Forwarding):  # 5.24's DynamicCache: no arguments at all
    def activate_past_recording(self):
        for layer in self.layers:
            layer.activate_past_recording()


class EncDec:  # an EncoderDecoderCache: its self-attention cache decides
    def __init__(self, inner):
        self.self_attention_cache = inner

    def activate_past_recording(self, **kwargs):
        self.self_attention_cache.activate_past_recording(**kwargs)


@pytest.mark.parametrize("cache,expected", [
    (Plain524(Layer524()), {}),
    (Forwarding(Sliding525()), {}),  # forwards kwargs, but no layer names a count
    (Forwarding(Sliding525(), Layer525()), {"recurrent_states_to_keep": 3}),
    (Layer525(), {"recurrent_states_to_keep": 3}),
    (EncDec(Forwarding(Layer525())), {"recurrent_states_to_keep": 3}),
    (EncDec(Plain524(Layer524())), {}),
], ids=["5.24 cache", "attention-only 5.25", "hybrid 5.25", "a 5.25 layer", "enc-dec 5.25", "enc-dec 5.24"])
def test_past_recording_passes_the_drafted_count_where_the_release_takes_it(cache, expected):
    from smearcli.engines.transformers import cache_runner

    assert api.recording(cache, 3) == expected
    assert reproducer_namespace()["recording"](cache, 3) == expected  # the embedded copy agrees
    cache_runner.record(cache, 3)  # the runner calls it so: each recording layer heard the count
    inner = getattr(cache, "self_attention_cache", cache)
    for layer in getattr(inner, "layers", [inner]):
        assert layer.said == ({"recurrent_states_to_keep": 3} if isinstance(layer, Layer525) else {})


def test_the_runner_records_the_tokens_generate_drafts_per_verify_step():
    """generate's verify step feeds the last accepted token and `num_drafting_tokens` candidates;
    the rollback boundary feeds DRAFT tokens, so the runner keeps DRAFT - 1 states."""
    from smearcli.util.defaults import DRAFT

    runner = CacheRunner(hf.tiny_model("llama"), crop=True)
    assert runner.drafted == DRAFT - 1


@pytest.mark.parametrize("cls", [CacheParams50, Cache524], ids=lambda c: c.__name__)
def test_the_reproducer_steps_pass_the_cache_as_the_runner_does(cls):
    ns = reproducer_namespace()
    model = cls()
    _, got = ns["step"](model, torch.zeros(1, 2, dtype=torch.long), "held", 3)
    keyword, position = RELEASES[cls]
    call = model.calls[-1]
    assert call[keyword] == "held" and got == "theirs"
    assert (call.get("cache_position") is not None) == position
    if position:
        assert call["cache_position"].tolist() == [3, 4]


def test_a_written_reproducer_prints_its_release(tmp_path):
    cfg = transformers.LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                   num_attention_heads=2, num_key_value_heads=2)
    rec = record.bare("llama", "bug", model_class="LlamaForCausalLM", worst_schedule="chunks",
                      steps=[4, 4], max_abs=1.0, shape="x")
    path = repro.write(rec, cfg, tmp_path / "llama.py", vocab=64, total=8)
    text = path.read_text()
    assert api.standalone() in text.replace("{{", "{").replace("}}", "}")
    p = subprocess.run([sys.executable, "-I", str(path)], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr  # the tiny llama has no bug: the reproducer ran to its end
    assert p.stdout.startswith(f"transformers {transformers.__version__}, torch ")


# -- one frame finder -------------------------------------------------------------------------------
def raiser(filename: str, body: str = "raise ValueError('their message\\nsecond line')"):
    """A function whose code says it lives in `filename` (a frame there when it raises)."""
    ns: dict = {}
    exec(compile(f"def f(g=None):\n    if g is not None:\n        return g()\n    {body}\n", filename, "exec"), ns)
    return ns["f"]


THEIRS = "/venv/lib/python3.11/site-packages/transformers/models/m/modeling_m.py"
TORCH = "/venv/lib/python3.11/site-packages/torch/nn/modules/module.py"


def caught(fn):
    try:
        fn()
    except Exception as e:
        return e
    raise AssertionError("it did not raise")



def test_an_environment_folder_named_after_the_package_does_not_make_torch_theirs():
    """A venv at ~/envs/transformers (or ~/envs/vllm) holds torch's files under a folder of the
    package's name: an installed frame is theirs only from its last site-packages on."""
    env = "/envs/transformers/lib/python3.11/site-packages/"
    theirs, torch_there = raiser(env + "transformers/models/m/modeling_m.py"), raiser(env + "torch/_ops.py")
    e = caught(lambda: theirs(torch_there))
    assert frames.raised_in(e, "transformers") == "transformers/models/m/modeling_m.py:3 in f"
    assert frames.describe(e, "transformers").startswith("transformers/models/m/modeling_m.py:3 in f: ")
    assert frames.raised_in(caught(torch_there), "transformers") is None

def test_frames_names_the_deepest_frame_in_their_code():
    e = caught(raiser(THEIRS))
    assert frames.raised_in(e, "transformers") == "transformers/models/m/modeling_m.py:4 in f"
    assert frames.describe(e, "transformers") == \
        "transformers/models/m/modeling_m.py:4 in f: ValueError: their message"
    # torch raising under their call is still theirs; smearcli's own raise is not
    in_torch = raiser(TORCH)
    e = caught(lambda: raiser(THEIRS)(in_torch))
    assert frames.raised_in(e, "transformers") == "transformers/models/m/modeling_m.py:3 in f"
    # our engine folder is named after their package: a frame there is still ours, installed anywhere
    for mine in (frames.OWN + "engines/transformers/check.py", "/repo/smearcli/engines/transformers/boundary.py"):
        assert frames.raised_in(caught(lambda: raiser(THEIRS)(raiser(mine))), "transformers") is None
    ours = raiser("/repo/smearcli/engines/transformers/check.py")
    e = caught(lambda: raiser(THEIRS)(ours))
    assert frames.raised_in(e, "transformers") is None
    assert frames.describe(e, "transformers").startswith("transformers/models/m/modeling_m.py:3 in f: ValueError")
    e = caught(ours)
    assert frames.describe(e, "transformers").startswith("smearcli/engines/transformers/check.py:4 in f: ValueError")
    e = caught(raiser("/tmp/tf/5.3.0/transformers/models/m/modeling_m.py"))  # pip install --target
    assert frames.raised_in(e, "transformers") == "transformers/models/m/modeling_m.py:4 in f"


def test_their_refusal_to_crop_a_sliding_window_is_a_declared_limit():
    # 5.14's DynamicSlidingWindowLayer.crop raises on purpose once the window has slid (the census
    # counted it as their crash on mistral); other "Cannot ..." errors of theirs stay crashes: some
    # name an internal mismatch ("Cannot call `update_conv_state` on a non-LinearAttention layer!")
    cache = "/venv/lib/python3.11/site-packages/transformers/cache_utils.py"
    crop = ("raise ValueError('Cannot `crop` a `DynamicSlidingWindowLayer` after it has seen more tokens than its"
            "sliding window (otherwise some states are lost)')")
    said = frames.declared_limit(caught(raiser(cache, crop)), "transformers")
    assert said and said.startswith("ValueError: Cannot `crop`")
    conv = "raise ValueError('Cannot call `update_conv_state` on a non-LinearAttention layer!')"
    assert frames.declared_limit(caught(raiser(cache, conv)), "transformers") is None


def test_every_surface_uses_the_one_frame_finder(tmp_path):
    from smearcli.engines.transformers.compare_check import their_frame
    from smearcli.engines.nanochat import guard

    e = caught(lambda: raiser(THEIRS)(raiser(TORCH)))
    assert boundary.transformers_frame(e) == frames.describe(e, "transformers")
    assert their_frame(e) == frames.raised_in(e, "transformers")
    checkout = tmp_path.resolve() / "nanochat"
    (checkout / "nanochat").mkdir(parents=True)
    e = caught(raiser(str(checkout / "nanochat" / "gpt.py")))
    assert guard.their_frame(e, checkout) == frames.innermost(frames.frames(e), frames.under(checkout)) \
        == "nanochat/gpt.py:4"
    assert guard.their_frame(caught(raiser(THEIRS)), checkout) == ""


# -- the fast-kernel fallbacks, said once -------------------------------------------------------------
OLD = ("The fast path is not available because one of `(selective_state_update, selective_scan_fn, "
       "causal_conv1d_fn, causal_conv1d_update, mamba_inner_fn)` is None. Falling back to the sequential "
       "implementation of Mamba. To install follow https://github.com/state-spaces/mamba/#installation and "
       "https://github.com/Dao-AILab/causal-conv1d")  # transformers 5.0
NEW = ("`causal_conv1d_fn` is falling back to its reference PyTorch implementation because `causal_conv1d` "
       "is not installed. This is correct but much slower; install `causal_conv1d` for the optimized kernel.")


def test_each_releases_fallback_message_names_what_is_missing():
    assert kernels.missing_in(OLD) == {"causal_conv1d", "mamba_ssm"}
    assert kernels.missing_in(NEW) == {"causal_conv1d"}
    assert kernels.missing_in("Setting `pad_token_id` to `eos_token_id`") == set()
    line = kernels.note({"mamba_ssm", "causal_conv1d"})
    assert line == ("note: transformers' fast SSM kernels are not installed (causal_conv1d, mamba_ssm): "
                    "the census runs their slow paths")


class Kept(logging.Handler):
    def __init__(self):
        super().__init__()
        self.messages: list[str] = []

    def emit(self, record):
        self.messages.append(record.getMessage())


def test_the_fallbacks_are_kept_out_of_transformers_log_and_other_warnings_pass():
    from transformers.utils import logging as tf_logging

    root, kept = tf_logging.get_logger("transformers"), Kept()
    root.addHandler(kept)
    try:
        with kernels.collected() as seen:
            log = tf_logging.get_logger("transformers.models.mamba.modeling_mamba")
            log.warning(OLD)
            log.warning("something else")
        log.warning(NEW)  # outside the block: printed again
    finally:
        root.removeHandler(kept)
    assert kept.messages == ["something else", NEW]
    assert seen.missing == {"causal_conv1d", "mamba_ssm"}


def falls_back(name: str) -> record.Record:
    """A census check that warns as an SSM does in transformers 5.0 (in its child process)."""
    from transformers.utils import logging as tf_logging

    tf_logging.get_logger("transformers.models.mamba.modeling_mamba").warning(OLD if name != "qwen" else NEW)
    return record.new(name, "ok")


def test_a_census_run_says_the_fallbacks_once_and_records_its_release(tmp_path, capfd):
    said: list[str] = []
    session = InProcess()  # what the census passes the loop: the session's gathering, said once, and its stamp
    recs = scan_into(["mamba", "mamba2", "qwen"], falls_back, tmp_path / "scan.jsonl", on_note=said.append,
                     gathering=session.gathering, gathered=session.gathered, stamp=session.stamp())
    assert said == [kernels.note({"causal_conv1d", "mamba_ssm"})]  # once, for the whole run
    err = capfd.readouterr().err
    assert "fast path" not in err and "falling back" not in err, err
    assert {r.transformers_version for r in recs} == {transformers.__version__}
    on_disk = records.read(tmp_path / "scan.jsonl").records
    assert all(r.transformers_version == transformers.__version__ for r in on_disk)
    assert report.document(on_disk)["architectures"][0]["transformers_version"] == transformers.__version__
    said.clear()
    scan_into(["quiet"], lambda n: record.new(n, "ok"), tmp_path / "b.jsonl", on_note=said.append,
              gathering=session.gathering, gathered=session.gathered)
    assert said == []  # nothing fell back: nothing to say


# -- not judged ---------------------------------------------------------------------------------------
def test_a_boundary_that_agreed_beside_a_failure_is_not_judged():
    entries = {"padded": boundary.entry(boundary.PASSED), "rollback": boundary.entry("bug")}
    boundary.beside(entries, "chunks of 16")
    assert entries["padded"].status == NOT_JUDGED
    assert entries["padded"].why == f"{NOT_JUDGED_WHY} (chunks of 16)"
    assert "'chunks of 16' fails too" in entries["rollback"].why
    settled = boundary.settle({"padded": boundary.entry(boundary.PASSED)}, OK)
    assert settled["padded"].status == OK  # with every schedule agreeing, the verdict is its own


def test_the_census_report_names_not_judged():
    rec = record.bare("mamba", "bug", boundaries={
        "padded": {"status": NOT_JUDGED, "why": f"{NOT_JUDGED_WHY} (chunks of 16)"},
        "rollback": {"status": "bug", "multiple": 30.0, "mode": "copy"}})
    ok = record.bare("llama", "ok", boundaries={"padded": {"status": "ok"}})
    table = report.table([rec, ok])
    assert "padded: 1 not judged, 1 ok" in table and "passed" not in table
    assert page.boundary_cell(rec, "padded") == f"not judged: {NOT_JUDGED_WHY} (chunks of 16)"
    md = report.markdown([rec, ok])
    assert f"- not judged: the boundary agreed, but {NOT_JUDGED_WHY}" in md


# -- the oldest supported release, installed ----------------------------------------------------------
UNREACHABLE = ("No matching distribution", "Could not find a version", "Temporary failure", "timed out",
               "Connection", "Network is unreachable", "Name or service not known")


@pytest.mark.slow
def test_the_census_runs_under_the_oldest_supported_release(tmp_path):
    """transformers OLDEST in a scratch venv (torch from this Python's site, as the local wheel
    installed it): llama ok, Mamba's chunked step raising in its own code, Mamba-2 forgetting its
    state at chunk starts (its multi-token cached forward, transformers#46084, fixed in 5.13.0), each
    record and reproducer naming the release. (Mamba-2 rather than Qwen3-Next, which forgets its state
    there too: the same finding checked in half the time.)"""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", str(venv)], check=True, timeout=120)
    py = venv / "bin" / "python"
    pip = subprocess.run([str(py), "-m", "pip", "install", "-q", "--timeout", "30", "torch==2.13.0",
                          f"transformers=={OLDEST}"], capture_output=True, text=True, timeout=300)
    if pip.returncode != 0:
        said = pip.stdout + pip.stderr
        if any(w in said for w in UNREACHABLE):
            pytest.skip(f"the package index cannot be reached for transformers {OLDEST}: {said.strip()[-200:]}")
        raise AssertionError(said)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    out = tmp_path / "scan.jsonl"
    p = subprocess.run([str(py), "-m", "smearcli", "scan", "--only", "llama,mamba,mamba2", "--out", str(out),
                        "--repro-dir", str(tmp_path / "repro")], capture_output=True, text=True, env=env, timeout=600)
    assert p.returncode == 0, p.stderr
    by = {r["model_type"]: r for r in map(json.loads, out.read_text().splitlines())}
    assert {r["transformers_version"] for r in by.values()} == {OLDEST}
    assert by["llama"]["verdict"] == "ok"
    assert by["mamba"]["verdict"] == "crashed" and by["mamba"]["reason"].startswith(
        "transformers/models/mamba/modeling_mamba.py"), by["mamba"]["reason"]
    q = by["mamba2"]
    assert q["verdict"] == "bug" and q["shape"] == shapes.STATE_DROPPED and q["reproducer_status"] == 1
    assert Path(q["reproducer"]).read_text().count(f"transformers {OLDEST}") == 1  # its docstring
    assert p.stderr.count("note: transformers' fast SSM kernels are not installed") == 1
    assert "fast path is not available" not in p.stderr


class EmptyWhenCached(Recorder):
    """A model whose cached step returns logits of no position (as CPM-Ant does)."""

    def forward(self, input_ids=None, cache=None, use_cache=None, **_):
        n = 0 if cache is not None else input_ids.size(1)
        return Out(logits=torch.zeros(input_ids.size(0), n, 4), cache="theirs")


def test_empty_logits_from_a_cached_step_are_the_models_failure_at_its_forward():
    from smearcli.engines.transformers.cache_runner import ModelOutputError
    from smearcli.measure.runner import Holder

    runner = CacheRunner(EmptyWhenCached())
    held = Holder()
    runner.step(torch.zeros(1, 3, dtype=torch.long), held, False)  # the first call makes the cache
    with pytest.raises(ModelOutputError) as caught:
        runner.step(torch.zeros(1, 1, dtype=torch.long), held, False)
    said = boundary.transformers_frame(caught.value)
    assert said.startswith(caught.value.where) and "in EmptyWhenCached.forward" in said
    assert "test_hf_releases.py:" in said and "schedules.py" not in said
    assert "returned logits of shape (1, 0, 4)" in said
