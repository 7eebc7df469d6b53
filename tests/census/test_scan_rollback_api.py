"""The scan's rollback goes through transformers' own cache API, as assisted generation calls it
("their crop"), beside a copy taken before each draft: a crop their API
accepts but that leaves a recurrent state as the draft left it is a bug of their crop while the
copy passes; attention-only and conv-only caches roll back exactly through their API; an API that
refuses is recorded as refused and changes no verdict; the record says where `generate()` itself
refuses assisted decoding, and the reproducer calls their API the same way."""

from __future__ import annotations

import dataclasses

import pytest
import torch

transformers = pytest.importorskip("transformers", reason="transformers is not installed: pip install 'smearcli[hf]'")

from smearcli.engines.transformers import repro  # noqa: E402
from smearcli.engines.transformers.boundary import PASSED, REFUSED  # noqa: E402
from smearcli.engines.transformers.check import T, build, check_model, split_points  # noqa: E402
from smearcli.census.record import new as record  # noqa: E402
from smearcli.tiny.derive import derive  # noqa: E402
from smearcli.engines.transformers import cache_runner as hf_runner  # noqa: E402
from smearcli.engines.transformers.cache_runner import CacheRunner  # noqa: E402
from smearcli.util.defaults import DRAFT, GEN_LEN, REJECT  # noqa: E402
from smearcli.measure.runner import Holder  # noqa: E402
from smearcli.judging.verdicts import BUG, INCONCLUSIVE, OK, UNSUPPORTED  # noqa: E402


def tiny(model_type: str, **overrides):
    cfg = derive(model_type).config
    for k, v in overrides.items():
        setattr(cfg, k, v)
    return build(cfg, None, 0), cfg


def tokens():
    return torch.randint(0, 256, (1, T), generator=torch.Generator().manual_seed(0))


def scan(model, cfg):
    return check_model(model, tokens(), split_points(cfg, T))


def in_transformers(src: str, name: str):
    """A stand-in function whose frames are in transformers' cache_utils.py (what `frames` reads)."""
    import transformers.cache_utils as cu

    ns: dict = {}
    exec(compile(src, cu.__file__, "exec"), ns)
    return ns[name]


def conv_lfm2():
    """LFM2 with a short-conv layer beside its attention layer: conv taps and keys and values, no
    recurrent state, so `crop` can put the cache back (their `is_croppable` is True). (A conv-only
    LFM2 does not run cached: its model asks the cache for the length of an attention layer.)"""
    return tiny("lfm2", num_hidden_layers=2, layer_types=["conv", "full_attention"], full_attn_idxs=[1])


@pytest.fixture(scope="module")
def mamba2():
    model, cfg = tiny("mamba2")
    return model, cfg, scan(model, cfg)


RELEASE = tuple(int(x) for x in transformers.__version__.split(".")[:2])
BEFORE_525 = pytest.mark.skipif(RELEASE >= (5, 25), reason="5.25's crop restores the recurrent state")


@BEFORE_525
def test_a_crop_their_api_accepts_and_gets_wrong_is_a_finding_with_the_declaration_beside_it(mamba2):
    """5.24 declares the rollback unsupported (`_is_stateful`, `is_croppable` False with its
    docstring), yet their `crop` accepts the call, returns, and leaves the recurrent state as the
    draft left it: the architecture's finding (the rollback heads it, confirmed, counted), the
    declaration quoted beside it, and one finding about their API at the layer's `crop`. The copy
    agrees: the model is right, the crop is not (transformers#49036, fixed in 5.25)."""
    _, _, out = mamba2
    assert out["verdict"] == BUG and out["worst_schedule"] == "rollback", out
    e = out["boundaries"]["rollback"]
    assert e.mode == "crop" and e.status == BUG and e.shape == "state not rolled back"
    theirs, copy = e.their_crop, e.copy
    assert theirs.status == BUG and theirs.multiple > 10
    assert "_is_stateful" in theirs.declared and "is_croppable is False" in theirs.declared
    assert "only supported when there are no recurrent states" in theirs.declared  # their docstring
    found = theirs.api_finding
    assert found.status == BUG and found.at.startswith("transformers/cache_utils.py:")
    assert found.at.endswith(".crop") and "LinearAttention" in found.at
    assert theirs.confirmation.status == BUG  # confirmed like any departure
    assert copy.status == PASSED and copy.multiple <= 10
    assert "their crop: bug" in e.why and "generate() refuses" in e.why


def test_a_crop_that_raises_or_agrees_on_a_declared_path_stays_unsupported():
    """`unsupported` is for what their API refuses (it raised) or a crop that agreed: the
    declaration quoted, no finding, the copy decides."""
    from smearcli.engines.transformers import boundary
    from smearcli.census.record import BoundaryResult

    for status in (PASSED, "crashed"):
        way = boundary.Rolled(None, None, BoundaryResult(status, why="x"), None)
        boundary.declared(way, "Model._is_stateful", None, None)
        assert way.entry.status == UNSUPPORTED and way.entry.declared == "Model._is_stateful"
        assert not way.entry.given("api_finding")
    way = boundary.Rolled(None, None, BoundaryResult(REFUSED, why="no crop"), None)
    boundary.declared(way, "Model._is_stateful", None, None)
    assert way.entry.status == REFUSED  # their API said no in so many words: nothing to add


@BEFORE_525
def test_the_api_finding_is_one_for_every_architecture_it_affects(mamba2):
    """Two architectures whose uncroppable layers share one `crop`: one finding about the API,
    both named, and one root cause (the same cache API code), each architecture counted."""
    from smearcli.engines.transformers import groups
    from smearcli.census import report

    _, _, out = mamba2
    a = record("mamba2", **{k: v for k, v in out.items() if k != "verdict"}, verdict=out["verdict"])
    b = dataclasses.replace(a, model_type="zamba2")
    found = groups.api_findings([b, a])
    assert len(found) == 1 and found[0]["architectures"] == ["mamba2", "zamba2"]
    md = report.markdown([a, b], {"transformers_version": "x"})
    assert "findings about the API" in md
    g = groups.groups([a, b])
    assert len(g) == 1 and g[0]["architectures"] == ["mamba2", "zamba2"]
    assert g[0]["by"] == f"the same cache API code: `{found[0]['at']}`"
    assert report.counts([a, b])[BUG] == 2


@pytest.mark.skipif(RELEASE < (5, 25), reason="5.25 records the recurrent states a crop restores")
def test_their_crop_called_as_525_generate_calls_it_rolls_back(mamba2):
    _, _, out = mamba2
    e = out["boundaries"]["rollback"]
    assert e.their_crop.status in (OK, INCONCLUSIVE) and e.their_crop.multiple <= 10
    assert e.generate_refuses is None  # 5.25 declares nothing


@BEFORE_525
def test_their_crop_puts_the_conv_taps_back_and_leaves_the_recurrent_state(mamba2):
    """What the bug is, seen in the cache: after a draft and `crop(-rejected)`, the conv taps equal
    those of a cache that only saw the accepted tokens, the recurrent state does not."""
    model, _, _ = mamba2
    ids = tokens()
    runner = CacheRunner(model, crop=True)
    kept, clean = runner.new_cache(1, T), runner.new_cache(1, T)
    draft = torch.cat([ids[:, 17:19], (ids[:, 19:21] + 1) % 256], dim=1)
    with torch.inference_mode():
        for cache in (kept, clean):
            runner.step(ids[:, :17], cache, False)
        runner.step(draft, kept, False)
        runner.crop(kept, 19)
        runner.step(ids[:, 17:19], clean, False)
        runner.crop(clean, 19)  # crop(0): what generate calls after a draft accepted whole
    a, b = kept.inner.layers[0], clean.inner.layers[0]
    scale = float(b.recurrent_states[0].abs().max())
    assert torch.allclose(a.conv_states[0], b.conv_states[0], atol=1e-6)  # the same taps, to rounding
    assert float((a.recurrent_states[0] - b.recurrent_states[0]).abs().max()) > 1e-3 * scale


@BEFORE_525
def test_generate_refusing_assisted_decoding_is_in_the_record_and_matches_generate(mamba2):
    model, _, out = mamba2
    refuses = out["boundaries"]["rollback"].generate_refuses
    assert "_is_stateful" in refuses and "is_croppable is False after the prefill" in refuses
    assert "a recurrent state" in refuses
    ids = tokens()[:, :8]
    with pytest.raises(ValueError, match="stateful"):
        model.generate(ids, prompt_lookup_num_tokens=2, max_new_tokens=3, do_sample=False)
    # without the flag, generate reaches its own check of the cache after the prefill
    model._is_stateful = False
    try:
        with pytest.raises(ValueError, match="cropped"):
            model.generate(ids, prompt_lookup_num_tokens=2, max_new_tokens=3, do_sample=False)
        alone = hf_runner.assisted_refusal(CacheRunner(model), ids)
        assert "_is_stateful" not in alone and alone.startswith("its DynamicCache.is_croppable is False")
    finally:
        del model._is_stateful  # the class's flag again


def test_an_attention_only_cache_rolls_back_exactly_through_their_api():
    model, cfg = tiny("llama")
    out = scan(model, cfg)
    e = out["boundaries"]["rollback"]
    assert out["verdict"] == OK and e.mode == "crop"
    assert e.their_crop.status == OK and e.copy.status == OK
    assert e.their_crop.multiple <= 10 and e.generate_refuses is None and e.why is None
    ids = tokens()[:, :8]  # generate itself runs assisted decoding on it
    assert model.generate(ids, prompt_lookup_num_tokens=2, max_new_tokens=3, do_sample=False).shape[1] == 11


def test_a_conv_cache_rolls_back_exactly_through_their_api():
    model, cfg = conv_lfm2()
    out = scan(model, cfg)
    e = out["boundaries"]["rollback"]
    assert out["verdict"] in (OK, INCONCLUSIVE), out
    assert e.mode == "crop" and e.their_crop.status == out["verdict"], e
    assert e.their_crop.multiple <= 10 and e.generate_refuses is None


def test_their_crop_calls_the_api_as_assisted_generation_does(monkeypatch):
    """Past recording before the prefill, then crop(0) after a forward nothing was rejected in and
    crop(-REJECT) after each partly rejected draft: the calls in order, derived from the schedule."""
    from transformers import DynamicCache

    from smearcli.measure.schedules import run_schedule

    calls, real_record, real_crop = [], DynamicCache.activate_past_recording, DynamicCache.crop

    def spy_record(self):
        calls.append(("record",))
        return real_record(self)

    def spy_crop(self, n):
        calls.append(("crop", n))
        return real_crop(self, n)
    monkeypatch.setattr(DynamicCache, "activate_past_recording", spy_record)
    monkeypatch.setattr(DynamicCache, "crop", spy_crop)
    model, cfg = conv_lfm2()
    runner = CacheRunner(model, crop=True)
    forward = model.forward

    def spy_forward(input_ids=None, **kw):
        calls.append(("forward", input_ids.size(1)))
        return forward(input_ids=input_ids, **kw)
    monkeypatch.setattr(model, "forward", spy_forward)
    run_schedule(runner, tokens(), "rollback", capture=False)
    prompt = T - min(GEN_LEN, T - 1)
    expected, pos = [("record",), ("forward", prompt)], prompt
    while pos < T:
        n = min(DRAFT, T - pos)
        expected += [("crop", 0)] if expected[-1][0] == "forward" else []  # after the prefill, an accepted draft
        expected.append(("forward", n))
        if n == DRAFT:
            expected.append(("crop", -REJECT))
        pos += n - REJECT if n == DRAFT else n
    assert calls == expected


def test_their_crop_on_a_release_whose_generate_records_nothing_is_called_as_that_generate_calls_it(monkeypatch):
    """Up to 5.13 `generate` records no past and crops once per verify step to the length it keeps:
    no `activate_past_recording` (the release has none; the census had called every crop refused
    and `generate` refusing assisted decoding for it) and no `crop(0)`, which there keeps 0 tokens.
    The same rollback, judged: within the floor, as the copy."""
    from transformers import DynamicCache

    from smearcli.engines.transformers import api
    from smearcli.measure.schedules import run_schedule

    calls, real_crop = [], DynamicCache.crop
    monkeypatch.setattr(api, "generate_records", lambda: False)
    monkeypatch.setattr(DynamicCache, "activate_past_recording",
                        lambda self, **kw: calls.append(("record",)), raising=False)

    def spy_crop(self, n):
        calls.append(("crop", n))
        return real_crop(self, n)
    monkeypatch.setattr(DynamicCache, "crop", spy_crop)
    model, cfg = tiny("llama")
    runner = CacheRunner(model, crop=True)
    assert hf_runner.assisted_refusal(runner, tokens()) is None
    run_schedule(runner, tokens(), "rollback", capture=False)
    assert ("record",) not in calls and ("crop", 0) not in calls
    assert calls and all(c == ("crop", -REJECT) for c in calls), calls
    e = scan(model, cfg)["boundaries"]["rollback"]
    assert e.mode == "crop" and e.their_crop.status == OK and e.generate_refuses is None, e


def test_a_crop_their_api_refuses_is_refused_and_changes_no_verdict(monkeypatch):
    from transformers import DynamicCache

    model, cfg = tiny("llama")
    before = scan(model, cfg)["verdict"]

    refuse = in_transformers("def refuse(self, n):\n    raise NotImplementedError('crop is not supported for this cache')\n",
                             "refuse")
    monkeypatch.setattr(DynamicCache, "crop", refuse)
    out = scan(model, cfg)
    e = out["boundaries"]["rollback"]
    assert out["verdict"] == before == OK
    assert e.their_crop.status == REFUSED and "is not supported for this cache" in e.their_crop.why
    assert e.mode == "copy" and e.copy.status == OK and e.status == OK
    assert "their crop: refused" in e.why


def test_an_exception_inside_their_crop_is_their_crash_with_the_copy_beside_it(monkeypatch):
    """An IndexError deep inside their crop is no refusal: it heads the rollback entry and the
    architecture's verdict (crashed, the frame in transformers), and the copy's pass is reported
    beside it, not in its place."""
    from transformers import DynamicCache

    model, cfg = tiny("llama")

    broken = in_transformers("def broken(self, n):\n    return [][n - 100]\n", "broken")  # an IndexError in their frame
    monkeypatch.setattr(DynamicCache, "crop", broken)
    out = scan(model, cfg)
    e = out["boundaries"]["rollback"]
    assert out["verdict"] == "crashed" and out["worst_schedule"] == "rollback", out
    assert e.status == "crashed" and e.mode == "crop"
    assert e.their_crop.status == "crashed" and "IndexError" in e.their_crop.why
    assert e.copy.status in (PASSED, "not judged") and e.copy.multiple <= 10
    assert "their crop: crashed" in e.why and "copy: " in e.why
    assert "IndexError" in out["reason"]


def test_a_cache_with_no_crop_is_refused_not_a_failure():
    runner = CacheRunner(tiny("llama")[0], crop=True)
    with pytest.raises(hf_runner.CropRefused, match="list has no crop"):
        runner.crop(Holder([torch.zeros(1)], True, 4), 2)


def test_a_cache_with_no_recording_api_is_refused_and_generate_makes_none():
    """RWKV passes its state back as a list: no `activate_past_recording`, no `crop`. Their crop is
    refused, the copy decides, and the record says why generate() would refuse it too."""
    model, cfg = tiny("rwkv")
    out = scan(model, cfg)
    e = out["boundaries"]["rollback"]
    assert e.their_crop.status == REFUSED and "has no activate_past_recording" in e.their_crop.why
    # the copy decides (not judged beside padded-decode's crash: RWKV's batched one-token decode)
    assert e.mode == "copy" and e.status in (e.copy.status, "not judged")
    assert "_is_stateful" in e.generate_refuses and "generate makes no cache" in e.generate_refuses


@BEFORE_525
@pytest.mark.slow
def test_the_reproducer_takes_the_draft_back_through_their_api(tmp_path, mamba2):
    model, cfg, out = mamba2
    e = out["boundaries"]["rollback"].but(mode="crop")  # their crop's run, as the API finding's
    rec = record("mamba2", **{k: v for k, v in out.items() if k not in ("verdict", "boundaries")},
                 boundaries={"rollback": e}, verdict=out["verdict"])
    path = repro.write(rec, cfg, tmp_path / "mamba2.py", total=T, schedule="rollback")
    src = path.read_text()
    assert "REJECT, MODE = " in src and ", 'crop'  # rollback" in src
    assert "activate_past_recording(**recording(made, drafted))" in src and "cache.crop(keep - n)" in src
    got, line = repro.run(path)
    assert got == 1, line  # the recurrent state is left behind in transformers itself too
