"""The boundaries in combination (issue #54, item 1): a left-padded batch fed in chunks the padding
ends inside, a right-padded prefill then decode, and drafts held for one crop across a sliding
window. A model whose pads reach the real tokens through the cache is caught by padded-chunks
(and by padded-decode, where the release does not declare right padding wrong) and named in the
record; the tiny llama passes all three; the held drafts cross the window; a crop that mishandles
held drafts is caught by rollback-window and not by the rollback; the reproducer rebuilds the
combination."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("transformers", reason="transformers is not installed: pip install 'smearcli[hf]'")

from smearcli.measure import boundaries  # noqa: E402

from smearcli.judging import evidence
from smearcli.engines.transformers import boundary, repro  # noqa: E402
from smearcli.measure import shapes  # noqa: E402
from smearcli.engines.transformers.check import T, build, check_model, split_points  # noqa: E402
from smearcli.tiny.derive import derive  # noqa: E402
from smearcli.census.record import BoundaryResult, new as record  # noqa: E402
from smearcli.engines.transformers.cache_runner import CacheRunner, full_run  # noqa: E402
from smearcli.measure.schedules import run_schedule, shape  # noqa: E402
from smearcli.judging.verdicts import BUG, CRASHED, NOT_RUN, UNSUPPORTED  # noqa: E402

COMBINED = ("padded-chunks", "padded-decode", "rollback-window")


def tiny(model_type, cls=None):
    cfg = derive(model_type).variants[0].config
    if cls is None:
        return build(cfg, None, 0), cfg
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        return cls(cfg).float().eval(), cfg


def tokens():
    return torch.randint(0, 256, (1, T), generator=torch.Generator().manual_seed(0))


def run_boundaries(model):
    """Every census boundary on `model`, against its float32 full pass and float64 floor."""
    ids = tokens()
    runner = CacheRunner(model)
    ref = full_run(runner, ids)
    noise = evidence.floor(runner, ref, ids, torch.float32, evidence.Float64(runner, ids, capture=False))
    return boundary.run_boundaries(model, CacheRunner, runner.layers, ids, ref, noise)


def mask_dropped_when_cached():
    """A llama whose cached calls drop the attention mask: one forward masks its pads, but a chunk
    or a decode step after it attends to the pads in its cache (pads reaching real tokens through
    the cache, as a conv or recurrent state that takes them in does)."""
    from transformers import LlamaForCausalLM

    class Leaky(LlamaForCausalLM):
        def forward(self, input_ids=None, attention_mask=None, position_ids=None, cache=None, **kw):
            if cache is not None and cache.get_seq_length() > 0:
                attention_mask = None
            return super().forward(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                                   cache=cache, **kw)
    return Leaky


def test_the_combinations_are_census_boundaries_with_shapes_and_reproducers():
    names = boundary.SCHEDULES
    assert set(COMBINED) <= set(names) and names.index("padded-chunks") > names.index("rollback")
    for name in COMBINED:
        assert shape(name) and shape(name) in shapes.all_shapes()
        assert boundaries.COMBINATIONS[COMBINED.index(name)].repro is not None


def test_compare_neither_offers_nor_names_them_once_the_census_is_imported():
    # this module imported the census, which registered them: what compare accepts, and the
    # schedules its refusal lists (docs/errors.md), must still be what a fresh `smearcli compare` has
    from smearcli.util.errors import UserError
    from smearcli.cli.options import RunSpec
    from smearcli.util.defaults import SCHEDULE_NAMES
    from smearcli.measure.schedules import SCHEDULES, compare_schedules

    # (other schedules may be registered too: llama.cpp's runners bring ubatch and batched)
    assert set(COMBINED) <= set(SCHEDULES) and set(SCHEDULE_NAMES) <= set(compare_schedules())
    assert not set(COMBINED) & set(compare_schedules())
    for name in COMBINED:
        with pytest.raises(UserError) as e:
            RunSpec(schedules=f"chunked,{name}").schedule_list()
        assert f"unknown schedule {name!r}" in str(e.value) and "padded-chunks" not in str(e.value).split(";")[1]


def test_padding_ends_inside_a_chunk_after_a_chunk_of_pads():
    for pads in range(3, 40):
        w = boundaries.chunk_width(pads)
        assert 1 < w < pads and pads % w, (pads, w)  # a chunk of pads alone, then the end inside one
    assert boundaries.chunk_width(T - boundaries.padded_length(T)) == 8


def test_the_second_pad_id_embeds_to_something_not_zero():
    model, _ = tiny("llama")
    with torch.no_grad():
        model.get_input_embeddings().weight[:3] = 0  # the pad token (0) and the next ids embed to zero
    runner = CacheRunner(model)
    runner.pad_id = 0
    own, loud = boundaries.pad_ids(runner, tokens())
    assert own == 0 and loud == 3
    assert float(model.get_input_embeddings().weight[loud].detach().abs().max()) > 0


def test_the_tiny_llama_passes_every_combination():
    out = run_boundaries(tiny("llama")[0])
    for name in COMBINED:
        e = out.entries[name]
        assert e.status == boundary.PASSED, (name, e)
        assert name in out.metrics and out.metrics[name].passed
    pc = out.entries["padded-chunks"]
    assert len(set(pc.extra["pad_ids"])) == 2 and set(pc.rows) == {"the row", "left-padded, pad 0",
                                                                   "left-padded, pad 1"}
    assert out.steps["padded-chunks"] == [8] * 6 + [1]


def test_pads_reaching_the_real_tokens_through_the_cache_are_caught_and_named(monkeypatch):
    model, cfg = tiny("llama", mask_dropped_when_cached())
    out = check_model(model, tokens(), split_points(cfg, T))
    assert out["verdict"] == BUG and out["worst_schedule"] == "padded-chunks"  # one forward masks them: padded passes
    assert out["shape"] == shape("padded-chunks")
    b = out["boundaries"]
    pc = b["padded-chunks"]
    assert pc.status == BUG and pc.shape == shape("padded-chunks")
    assert out["schedules"]["padded-chunks"].status == "bug"  # confirmed in float64, lifted
    assert out["schedules"]["padded-chunks"].confirmation
    assert "off: left-padded, pad 0, left-padded, pad 1" in pc.why and pc.rows["the row"] < 1e-4
    assert b["padded"].status not in (BUG, CRASHED)
    # right padding then decode leaks too, but generate() declares right padding wrong: no finding
    pd = b["padded-decode"]
    assert pd.status == UNSUPPORTED and "right-padding" in pd.declared and pd.multiple > 10
    assert "padded-decode" not in out["schedules"] or out["schedules"]["padded-decode"].passed is not False
    monkeypatch.setattr(boundary, "right_padding_declared", lambda: None)  # a release that accepts it
    out = run_boundaries(model)  # the boundaries alone: a departure waits for the check's float64 rerun
    assert out.entries["padded-decode"].status == boundary.DEPARTS
    assert out.entries["padded-decode"].shape == shape("padded-decode")
    out = check_model(model, tokens(), split_points(cfg, T))  # the check gives it the judge's status
    assert out["boundaries"]["padded-decode"].status == BUG and out["schedules"]["padded-decode"].status == "bug"
    assert all(e.status != boundary.DEPARTS for e in out["boundaries"].values())


def test_a_forward_without_a_mask_runs_no_padded_combination():
    from transformers import LlamaForCausalLM

    class Maskless(LlamaForCausalLM):
        def forward(self, input_ids=None, cache=None, use_cache=None, **kw):
            return super().forward(input_ids=input_ids, cache=cache, use_cache=use_cache, **kw)
    out = run_boundaries(tiny("llama", Maskless)[0])
    for name in ("padded-chunks", "padded-decode"):
        e = out.entries[name]
        assert e.status == NOT_RUN and "attention_mask" in e.why
        assert any(n.startswith(f"{name} not run") for n in out.notes)


def test_held_drafts_cross_the_sliding_window():
    model, _ = tiny("mistral")
    runner = CacheRunner(model, crop=True)
    runner.window = boundary.window_of(model)
    assert runner.window == 8
    run = run_schedule(runner, tokens(), "rollback-window", capture=False)
    prompt = boundaries.window_prompt(T, 8)
    forwards, width, reject = boundaries.HELD
    assert prompt < 8 < prompt + forwards * width  # the first round's held drafts cross it
    assert run.steps[:1 + forwards] == [prompt] + [width] * forwards
    assert run.marks["rollback"][0] == prompt + forwards * width - reject
    assert "crossing the window of 8" in run.notes[0]
    rest = T - (prompt + boundaries.ROUNDS * (forwards * width - reject))
    assert run.steps[-1] == rest and len(run.marks["rollback"]) == boundaries.ROUNDS  # then the rest at once
    ref = full_run(runner, tokens())
    assert float((run.logits - ref.logits).abs().max()) < 1e-4


def test_a_crop_that_mishandles_held_drafts_is_caught_by_rollback_window_alone(monkeypatch):
    """A sliding-window layer that returns every recorded key while drafts are held (no slice to
    what the mask expects: the shape mismatch users reported) breaks only where several forwards
    are recorded before one crop; the rollback, which crops after every forward, passes."""
    from transformers.cache_utils import DynamicSlidingWindowLayer

    update = DynamicSlidingWindowLayer.update

    def unsliced(self, key_states, value_states, *args, **kwargs):
        seen = update(self, key_states, value_states, *args, **kwargs)
        return (self.keys, self.values) if self.record_past else seen  # every recorded key, past the mask's
    monkeypatch.setattr(DynamicSlidingWindowLayer, "update", unsliced)
    model, _ = tiny("mistral")
    out = run_boundaries(model)
    assert out.entries["rollback"].status == boundary.PASSED
    e = out.entries["rollback-window"]
    assert e.status in (BUG, CRASHED) and e.extra["window"] == 8 and e.mode == "crop"
    if e.status == CRASHED:
        assert "transformers/" in e.why


def test_rollback_window_is_not_run_where_generate_refuses_assisted_decoding():
    rb = BoundaryResult("unsupported", generate_refuses="M._is_stateful (\"not supported with stateful models\")",
                        their_crop=BoundaryResult("unsupported"))
    m, run, e, r = boundary.run_rollback_window(None, None, None, None, None, None, None, rb)
    assert m is None and e.status == NOT_RUN and "refuses assisted decoding" in e.why


@pytest.mark.parametrize("name", COMBINED)
def test_the_reproducer_rebuilds_the_combination(tmp_path, name):
    import ast

    e = BoundaryResult(BUG, max_abs=1.0, shape=shape(name), positions=True,
                       extra={"pad_ids": [0, 3]} if name != "rollback-window" else {"window": 8})
    rec = record("mistral", BUG, worst_schedule=name, steps=[T], max_abs=1.0, boundaries={name: e})
    path = repro.write(rec, derive("mistral").config, tmp_path / "mistral.py", total=T)
    src = path.read_text()
    ast.parse(src)
    assert f"SCHEDULE = {name!r}" in src and f"return {repro.function_name(name)}(model, ids)" in src
    if name == "padded-chunks":
        assert "CHUNK, PAD_IDS, POSITIONS = 37, 8, (0, 3), True" in src and "padded_rows(ids[0], L, left=True)" in src
    elif name == "padded-decode":
        assert "W, L, DECODED, PAD_IDS, POSITIONS = 43, 33, 6, (0, 3), True" in src
    else:
        assert f"PROMPT, HELD, ROUNDS, DRAFTED = {boundaries.window_prompt(T, 8)}, (3, 3, 4), 3" in src
        assert "cache.crop(keep - n)" in src and "activate_past_recording" in src


@pytest.mark.slow
def test_the_combination_reproducers_run_clean_on_the_tiny_llama(tmp_path):
    for name in COMBINED:
        e = BoundaryResult(BUG, max_abs=1.0, shape=shape(name), positions=True, extra={"pad_ids": [0, 1]})
        rec = record("llama", BUG, worst_schedule=name, steps=[T], max_abs=1.0, boundaries={name: e})
        got, line = repro.run(repro.write(rec, derive("llama").config, tmp_path / f"{name}.py", total=T))
        assert got == 0 and name in line, line


def test_a_combination_failing_where_a_part_fails_alone_is_not_judged():
    from smearcli.judging.verdicts import NOT_JUDGED

    entries = {"padded": BoundaryResult("passed"), "rollback": BoundaryResult(BUG),
               "padded-chunks": BoundaryResult(CRASHED, why="sdpa_attention.py:182: RuntimeError"),
               "padded-decode": BoundaryResult(BUG), "rollback-window": BoundaryResult(BUG)}
    assert boundary.parts_fail(entries, []) == ["rollback-window"]  # the rollback fails alone
    assert "'rollback' fails alone" in entries["rollback-window"].why
    assert entries["padded-chunks"].status == CRASHED  # its parts pass: its own raise, a finding
    assert boundary.parts_fail(entries, ["decode"]) == ["padded-chunks", "padded-decode"]
    pc = entries["padded-chunks"]
    assert pc.status == NOT_JUDGED and "'decode' fails alone" in pc.why and "RuntimeError" in pc.why
