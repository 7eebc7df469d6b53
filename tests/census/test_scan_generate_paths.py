"""generate's own paths, as users call them (issue #54, item 2): where every cached schedule of
the census agrees, the architecture still runs through greedy `generate` (prompt then decode,
prefill_chunk_size, a left-padded batch, that batch prefilled in chunks with its pads inside the
first chunk, an assistant model, a static cache, beam search against itself without a cache, a
left-padded batch of one row), the short row of each padded batch also token for token against
its own unbatched, unchunked `generate`. A path silently wrong is the architecture's bug only
where it keeps its size in float64, departs on the next seed, departs numbered as generate
numbers, no exact tie decides where its tokens part, and its reproducer exits 1 without
smearcli; anything short of that is unconfirmed, the note naming what failed."""

from __future__ import annotations

import copy
import subprocess
import sys
import types

import pytest
import torch

pytest.importorskip("transformers", reason="transformers is not installed: pip install 'smearcli[hf]'")

from smearcli.engines.transformers import reach, repro  # noqa: E402
from smearcli.engines.transformers.check import T, build  # noqa: E402
from smearcli.tiny.derive import derive  # noqa: E402
from smearcli.census.record import BoundaryResult, new as record  # noqa: E402
from smearcli.judging.verdicts import LEFT_UNSUPPORTED  # noqa: E402
from smearcli.util.defaults import NOISE_MARGIN  # noqa: E402
from smearcli.judging.verdicts import BUG, OK, UNCONFIRMED  # noqa: E402

CFG = derive("llama").config
FLOOR = 1e-6  # a float32 floor of the tiny llama's order (the census measures it; here it only scales)


def tokens_of(s: int):
    return torch.randint(0, 256, (1, T), generator=torch.Generator().manual_seed(s))


def off_when_chunked_and_padded(model):
    """The model, its `generate` moving every step's logits by 0.05 where a padded batch is
    prefilled in chunks: a departure only that meeting of two paths shows (as a chunk's state
    taking in pads would), kept by deepcopy and float64 like a logic error."""
    def generate(self, *args, **kw):
        out = type(self).generate(self, *args, **kw)
        mask = kw.get("attention_mask")
        if kw.get("prefill_chunk_size") and mask is not None and not bool(mask.all()):
            out.logits = tuple(x + 0.05 for x in out.logits)
        return out
    model.generate = types.MethodType(generate, model)
    return model


def ok_record(padded_status="ok"):
    return record("llama", OK, floor=FLOOR, notes=[], vocab=256,
                  boundaries={"padded": BoundaryResult(padded_status)})


def test_a_clean_model_agrees_on_every_generate_path_and_keeps_its_verdict():
    rec = ok_record()
    reach.through_generate(rec, lambda s: build(CFG, None, s), tokens_of, NOISE_MARGIN)
    assert rec.verdict == OK and rec.worst_schedule is None
    assert list(rec.reach) == list(reach.PATHS)
    assert all(e.result == reach.AGREES for e in rec.reach.values()), rec.reach
    for name in reach.PADDED_PATHS:  # the short row, token for token with its own generate alone
        assert rec.reach[name].tokens == "same"


def test_a_departure_only_chunked_padding_shows_is_found_through_generate_and_held_unconfirmed():
    """Kept in float64, on the next seed, numbered as generate numbers and with no tie: all but the
    reproducer hold. The record has no config to rebuild (the departure is a patch of this process's
    `generate`, which no standalone reproducer could see), so it stays unconfirmed, saying why."""
    rec = ok_record()
    reach.through_generate(rec, lambda s: off_when_chunked_and_padded(build(CFG, None, s)), tokens_of, NOISE_MARGIN)
    assert rec.verdict == UNCONFIRMED, rec.notes
    assert rec.worst_schedule == reach.GENERATE + "prefill_chunk_size, left-padded batch"
    assert rec.shape == reach.THROUGH and rec.max_abs == pytest.approx(0.05, rel=0.01)
    assert rec.reach["left-padded batch"].result == reach.AGREES  # unchunked, the batch agrees
    said = " ".join(rec.notes)
    assert "in float64 lifted" in said and "on the next seed" in said
    failed = next(n for n in rec.notes if n.startswith("through generate only, unconfirmed: "))
    assert failed.endswith("reproducer: no config to rebuild, no reproducer written"), failed
    assert rec.confirmation.status == str(BUG)  # the float64 condition itself held


def test_left_padding_the_model_cannot_number_is_not_judged_through_generate():
    rec = ok_record(LEFT_UNSUPPORTED)
    reach.through_generate(rec, lambda s: off_when_chunked_and_padded(build(CFG, None, s)), tokens_of, NOISE_MARGIN)
    assert rec.verdict == OK and rec.reach["prefill_chunk_size, left-padded batch"].result == reach.SILENT


def recording_prompts(model, seen: list):
    """The model, its `generate` noting every prompt it is called with (the unmasked tokens of each row)."""
    def generate(self, *args, **kw):
        ids, mask = kw["input_ids"], kw.get("attention_mask")
        seen.extend(row[m.bool()] if mask is not None else row for row, m in
                    zip(ids, mask if mask is not None else ids))
        return type(self).generate(self, *args, **kw)
    model.generate = types.MethodType(generate, model)
    return model


def test_the_prompts_fed_through_generate_hold_no_pad_id():
    """A config whose pad id the seeded draw reaches: RoBERTa's family numbers positions skipping
    it, generate numbers from the mask, so a prompt holding it is numbered two ways (an artifact).
    Every prompt of every path is the draw with the pad id replaced, the same each time (the
    float64 and next-seed reruns go through the same `reach.measure`)."""
    drawn = tokens_of(0)
    cfg = copy.deepcopy(CFG)
    cfg.pad_token_id = int(drawn[0, 5])  # an id seed 0's prompt holds
    assert bool((drawn == cfg.pad_token_id).any())
    seen = []
    rec = ok_record()
    reach.through_generate(rec, lambda s: recording_prompts(build(cfg, None, s), seen), tokens_of, NOISE_MARGIN)
    assert rec.verdict == OK and len(seen) >= len(reach.PATHS), len(seen)
    assert not any(bool((row == cfg.pad_token_id).any()) for row in seen)
    want = drawn.masked_fill(drawn == cfg.pad_token_id, cfg.pad_token_id + 1)[0]
    assert torch.equal(seen[0], want)  # the plain path's prompt: the draw, its pad id moved one up


def test_roberta_departs_through_generate_by_its_numbering_not_a_cache():
    """RoBERTa numbers positions from padding_idx + 1 where it is given none; generate passes
    0 to n-1 from the mask. Every path departs from the forward's own full pass and agrees with
    the full pass given generate's numbering (`numbered`): held unconfirmed, the note says why."""
    cfg = derive("roberta").variants[0].config
    rec = ok_record()
    reach.through_generate(rec, lambda s: build(cfg, None, s), tokens_of, NOISE_MARGIN)
    threshold = NOISE_MARGIN * FLOOR
    for name, e in rec.reach.items():
        if name in ("beam search", "static cache, early-initialized"):  # both sides numbered alike (by
            assert e.result == reach.AGREES, e  # generate; by the forward itself, no generate in it)
            continue
        assert e.result == reach.SILENT and e.max_abs > 0.1 and e.numbered <= threshold, (name, e)
    assert rec.verdict == UNCONFIRMED and rec.shape == reach.THROUGH
    assert any("not a cache" in n for n in rec.notes), rec.notes
    assert any(n.startswith("through generate only, unconfirmed: ") and "numbered: agrees" in n for n in rec.notes)


@pytest.mark.slow
def test_the_reproducer_of_a_generate_finding_runs_without_smearcli(tmp_path):
    """Written for a finding on the chunked padded path; on the real (unpatched) llama the path
    agrees, so it runs to the end and exits 0, importing neither smearcli nor anything beyond
    torch and transformers."""
    rec = record("llama", BUG, model_class="LlamaForCausalLM", worst_schedule=reach.GENERATE
                 + "prefill_chunk_size, left-padded batch", shape=reach.THROUGH, max_abs=0.05, built_from=CFG)
    path = repro.write(rec, CFG, tmp_path / "llama.py", vocab=256, total=T)
    text = path.read_text()
    assert "smearcli" not in text.split('"""', 2)[2] and "prefill_chunk_size=CHUNK" in text
    p = subprocess.run([sys.executable, "-I", str(path)], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "generate, prefill_chunk_size, left-padded batch: max |dlogit|" in p.stdout


NEW_PATHS = ("static cache", "beam search", "left-padded batch of one")


def test_a_clean_llama_agrees_on_the_static_cache_beam_search_and_a_padded_batch_of_one():
    rec = ok_record()
    reach.through_generate(rec, lambda s: build(CFG, None, s), tokens_of, NOISE_MARGIN)
    assert rec.verdict == OK, rec.notes
    for name in NEW_PATHS:
        e = rec.reach[name]
        assert e.result == reach.AGREES and e.tokens == "same" and e.gap is None, (name, e)
    early = rec.reach["static cache, early-initialized"]
    assert early.result == reach.AGREES and early.lazy <= FLOOR * NOISE_MARGIN, early


# A StaticLayer that writes half of every decoded token's values: a static cache broken on purpose,
# the dynamic cache untouched. A module, so the reproducer's Python can break itself the same way.
BREAK_STATIC = """
import transformers.cache_utils as cu

_update = cu.StaticLayer.update


def update(self, key_states, value_states, *args, **kwargs):
    if key_states.shape[-2] == 1:
        value_states = value_states * 0.5
    return _update(self, key_states, value_states, *args, **kwargs)


def apply():
    cu.StaticLayer.update = update
"""


# The same, only in a cache initialized in advance (`Cache.early_initialization`, as the export
# recipes call it): a lazily initialized static cache, and generate's, stay right.
BREAK_EARLY = """
import transformers.cache_utils as cu

_update = cu.StaticLayer.update
_early = cu.Cache.early_initialization


def update(self, key_states, value_states, *args, **kwargs):
    if getattr(self, "early", False) and key_states.shape[-2] == 1:
        value_states = value_states * 0.5
    return _update(self, key_states, value_states, *args, **kwargs)


def early_initialization(self, *args, **kwargs):
    _early(self, *args, **kwargs)
    for layer in self.layers:
        layer.early = True


def apply():
    cu.StaticLayer.update = update
    cu.Cache.early_initialization = early_initialization
"""


def broken(tmp_path, monkeypatch, source: str):
    """`source` (a module with `update` and `apply`) applied here, and the reproducer run in a Python
    that applies it first (the library as broken as in this process; `repro.run` isolates)."""
    import importlib.util
    import transformers.cache_utils as cu

    (tmp_path / "breaker.py").write_text(source)
    spec = importlib.util.spec_from_file_location("breaker", tmp_path / "breaker.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    monkeypatch.setattr(cu.StaticLayer, "update", mod.update)
    if hasattr(mod, "early_initialization"):
        monkeypatch.setattr(cu.Cache, "early_initialization", mod.early_initialization)
    ran = []

    def run(path):
        code = (f"import sys, runpy; sys.path.insert(0, {str(tmp_path)!r}); import breaker; breaker.apply(); "
                f"sys.argv = [{str(path)!r}]; runpy.run_path({str(path)!r}, run_name='__main__')")
        p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
        ran.append(p.stdout + p.stderr)
        return p.returncode, (p.stdout.strip().splitlines() or [""])[-1]
    monkeypatch.setattr(reach, "run_reproducer", run)
    return ran


@pytest.mark.slow  # confirmation reruns and a reproducer in its own Python: 7 to 9 s
def test_a_broken_static_cache_is_found_through_generate_and_confirmed_a_bug(tmp_path, monkeypatch):
    ran = broken(tmp_path, monkeypatch, BREAK_STATIC)
    rec = record("llama", OK, floor=FLOOR, notes=[], vocab=256, model_class="LlamaForCausalLM", built_from=CFG,
                 boundaries={"padded": BoundaryResult("ok")})
    reach.through_generate(rec, lambda s: build(CFG, None, s), tokens_of, NOISE_MARGIN)
    assert rec.reach["static cache"].result == reach.SILENT and rec.reach["generate"].result == reach.AGREES
    assert rec.verdict == BUG, rec.notes
    assert rec.worst_schedule == reach.GENERATE + "static cache" and rec.shape == reach.THROUGH
    assert rec.confirmation.status == str(BUG)
    assert any(n.startswith("through generate only, confirmed") for n in rec.notes), rec.notes
    assert len(ran) == 1 and "generate, static cache: the bug is there" in ran[0], ran
    # broken however the cache is initialized: not early initialization's finding
    early = rec.reach["static cache, early-initialized"]
    assert early.result == reach.NOT_RUN and "lazily initialized static cache departs as well" in early.why


@pytest.mark.slow  # confirmation reruns and a reproducer in its own Python: 8 to 10 s
def test_a_broken_early_initialization_is_found_on_its_own_path_and_confirmed_a_bug(tmp_path, monkeypatch):
    """A static cache wrong only when initialized in advance: generate's static cache agrees, the
    early-initialized one departs, confirmed (float64, the next seed), with a reproducer that
    initializes the cache the same way and exits 1."""
    ran = broken(tmp_path, monkeypatch, BREAK_EARLY)
    rec = record("llama", OK, floor=FLOOR, notes=[], vocab=256, model_class="LlamaForCausalLM", built_from=CFG,
                 boundaries={"padded": BoundaryResult("ok")})
    reach.through_generate(rec, lambda s: build(CFG, None, s), tokens_of, NOISE_MARGIN)
    early = rec.reach["static cache, early-initialized"]
    assert rec.reach["static cache"].result == reach.AGREES and early.result == reach.SILENT, rec.reach
    assert early.lazy <= FLOOR * NOISE_MARGIN  # the same cache initialized lazily agrees
    assert rec.verdict == BUG and rec.worst_schedule == reach.GENERATE + "static cache, early-initialized", rec.notes
    assert len(ran) == 1 and "generate, static cache, early-initialized: the bug is there" in ran[0], ran


def test_a_release_whose_early_initialization_takes_only_ints_is_given_ints(monkeypatch):
    """5.0.0's early_initialization takes one (heads, head_dim) for every layer, as ints (a list
    raises TypeError inside it, our input's fault, not theirs): where every layer's shape is the
    same the path passes ints, and agrees; where layers differ on such a release it is not run."""
    import transformers.cache_utils as cu

    original = cu.Cache.early_initialization

    def ints_only(self, batch_size, num_heads, head_dim, dtype, device):
        if not isinstance(num_heads, int) or not isinstance(head_dim, int):
            raise TypeError("zeros(): argument 'size' failed to unpack the object at pos 2")
        return original(self, batch_size, num_heads, head_dim, dtype, device)
    monkeypatch.setattr(cu.Cache, "early_initialization", ints_only)
    model = build(CFG, None, 0)
    with torch.inference_mode():
        got = reach.measure(reach.RUNS["static cache, early-initialized"], model, tokens_of(0))
    assert got["max_abs"] <= FLOOR * NOISE_MARGIN, got
    layers = len(model.config.layer_types) if getattr(model.config, "layer_types", None) else model.config.num_hidden_layers
    monkeypatch.setattr(reach, "early_shapes", lambda cache, config: ([4] * layers, [16] * (layers - 1) + [8]))
    with torch.inference_mode(), pytest.raises(reach.NotRun, match="takes one shape for all"):
        reach.measure(reach.RUNS["static cache, early-initialized"], model, tokens_of(0))


def test_an_early_initialization_that_cannot_take_a_layers_shapes_is_not_run():
    """Multi-head latent attention keeps keys and values of different widths; early_initialization
    takes one head_dim for both, so the path cannot be built as the model needs: not run, with why."""
    model = build(derive("deepseek_v3").config, None, 0)
    run = reach.RUNS["static cache, early-initialized"]
    with torch.inference_mode(), pytest.raises(reach.NotRun, match="keys and values differ in shape"):
        reach.measure(run, model, tokens_of(0)[:, :12] % model.config.vocab_size)


def test_an_assistant_whose_drafts_are_all_accepted_is_rolled_so_that_a_crop_runs(monkeypatch):
    """The model as its own assistant: every draft accepted, no crop would run, and a crop that
    takes nothing back would pass unseen. The run is made again with the assistant's head rolled
    (its drafts rejected), and the broken crop shows; with the crop intact it agrees."""
    import transformers.cache_utils as cu

    model = build(CFG, None, 0)
    with torch.inference_mode():
        fine = reach.measure(reach.assisted, model, tokens_of(0), copy.deepcopy(model))
        monkeypatch.setattr(cu.DynamicLayer, "crop", lambda self, *a, **k: None)  # takes nothing back
        broke = reach.measure(reach.assisted, model, tokens_of(0), copy.deepcopy(model))
    assert fine["assistant"].startswith("its head rolled by one token") and fine["max_abs"] <= FLOOR * NOISE_MARGIN
    assert broke["assistant"] == fine["assistant"] and broke["max_abs"] > 1e-3, broke


def off_in_float32(model, wide: float):
    """The model, its static-cache `generate` off by 1e-3 in float32 and by `wide` in float64."""
    def generate(self, *args, **kw):
        out = type(self).generate(self, *args, **kw)
        if kw.get("cache_implementation") == "static":
            out.logits = tuple(x + (wide if x.dtype == torch.float64 else 1e-3) for x in out.logits)
        return out
    model.generate = types.MethodType(generate, model)
    return model


def test_a_departure_that_shrinks_in_float64_stays_unconfirmed_and_one_that_vanishes_is_rounding():
    rec = ok_record()
    reach.through_generate(rec, lambda s: off_in_float32(build(CFG, None, s), 2e-4), tokens_of, NOISE_MARGIN)
    assert rec.verdict == UNCONFIRMED and rec.worst_schedule == reach.GENERATE + "static cache", rec.notes
    failed = next(n for n in rec.notes if n.startswith("through generate only, unconfirmed: "))
    assert "float64: shrinks in float64 without vanishing" in failed, failed
    gone = ok_record()
    reach.through_generate(gone, lambda s: off_in_float32(build(CFG, None, s), 0.0), tokens_of, NOISE_MARGIN)
    assert gone.verdict == OK and gone.worst_schedule is None, gone.notes
    assert any("static cache is off by" in n and n.endswith("rounding") for n in gone.notes), gone.notes


def test_the_census_check_hands_its_own_seed_to_generates_paths(monkeypatch):
    """A check on seed 3 holds generate's paths on seed 3 too: the reproducer of a generate-only
    finding rebuilds the seed it is given, so a check that dropped its seed would hand over a
    reproducer of other weights."""
    from smearcli.engines.transformers import check

    seen = {}
    monkeypatch.setattr(reach, "through_generate", lambda rec, make, tokens_of, tolerance, seed=0: seen.update(seed=seed))
    rec = check.check("llama", seed=3)
    assert rec.verdict in ("ok", "inconclusive") and seen == {"seed": 3}


def test_a_departure_the_next_seed_does_not_repeat_is_unconfirmed_not_a_crash():
    """The second seed's rerun agreeing is the check's `ok` (hy_v4 on 5.24 crashed the whole record
    with "'rounding' is not a valid Verdict" when its next seed agreed)."""
    rec = ok_record()
    reach.through_generate(rec, lambda s: off_in_float32(build(CFG, None, s), 1e-3) if s == 0 else build(CFG, None, s),
                           tokens_of, NOISE_MARGIN)
    assert rec.verdict == UNCONFIRMED and rec.worst_schedule == reach.GENERATE + "static cache", rec.notes
    failed = next(n for n in rec.notes if n.startswith("through generate only, unconfirmed: "))
    assert "second seed: within the threshold" in failed and "float64" not in failed, failed


# A StaticLayer whose decode step fails inside transformers: generate accepts the static cache,
# then their code raises (as Qwen3-Next's KeyError: 'linear_attention' did on 5.12.1, #46441).
RAISE_STATIC = """
import transformers.cache_utils as cu

_update = cu.StaticLayer.update


def update(self, key_states, value_states, *args, **kwargs):
    if key_states.shape[-2] == 1:
        return {}["linear_attention"]
    return _update(self, key_states, value_states, *args, **kwargs)


def apply():
    cu.StaticLayer.update = update
"""


def test_a_generate_path_that_raises_inside_their_code_is_a_crash_on_that_path(tmp_path, monkeypatch):
    """A call generate accepted and then failed inside transformers is their crash on a public path:
    the record is `crashed`, named as the path, its reason the frame that raised, the next seed's
    rerun said; the reproducer of that path exits 1 without smearcli, saying it raises."""
    ran = broken(tmp_path, monkeypatch, RAISE_STATIC)
    rec = record("llama", OK, floor=FLOOR, notes=[], vocab=256, model_class="LlamaForCausalLM", built_from=CFG,
                 boundaries={"padded": BoundaryResult("ok")})
    reach.through_generate(rec, lambda s: build(CFG, None, s), tokens_of, NOISE_MARGIN)
    assert rec.reach["static cache"].result == reach.RAISES and rec.reach["generate"].result == reach.AGREES
    assert rec.verdict == "crashed", rec.notes
    assert rec.worst_schedule == reach.GENERATE + "static cache" and rec.shape == reach.THROUGH
    assert rec.reason.startswith("transformers/cache_utils.py:") and "KeyError" in rec.reason, rec.reason
    assert rec.max_abs is None and rec.confirmation is None
    assert f"{reach.GENERATE}static cache raised; the full pass runs" in rec.notes
    assert any("after generate accepted the call (again on the next seed)" in n for n in rec.notes), rec.notes
    assert not ran  # a crash is not confirmed by a reproducer run inside the census; it is written on demand
    path = repro.write(rec, CFG, tmp_path / "llama.py", vocab=256, margin=NOISE_MARGIN, total=T)
    status, line = reach.run_reproducer(path)
    assert status == 1 and "generate, static cache: raises: KeyError" in ran[-1], ran[-1]


def raiser(tmp_path, rel: str, body: str):
    """A function defined in a file at `rel` under `tmp_path` (a path inside a package named
    transformers), so its frames carry that file and its source lines."""
    import importlib.util

    path = tmp_path / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(body)
    spec = importlib.util.spec_from_file_location(f"raiser{abs(hash(rel))}", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.f


def caught(f) -> BaseException:
    try:
        f()
    except Exception as e:
        return e
    raise AssertionError("did not raise")


def test_only_generates_own_raise_statement_is_a_refusal(tmp_path):
    """`refused`: a `raise` statement of transformers' generation code is generate declining the use;
    an operation failing there, or a cache's own refusal that generate called into, is a crash."""
    declines = raiser(tmp_path, "transformers/generation/utils.py",
                      "def f():\n    raise ValueError('assisted generation is not supported with stateful models')\n")
    fails = raiser(tmp_path, "transformers/generation/other.py", "def f():\n    return {}['linear_attention']\n")
    cache = raiser(tmp_path, "transformers/cache_utils.py",
                   "def f():\n    raise ValueError('Cannot `crop` a `DynamicSlidingWindowLayer` after it has seen more')\n")
    assert reach.refused(caught(declines))
    assert not reach.refused(caught(fails))
    assert not reach.refused(caught(cache))


def test_a_crashed_record_says_its_reach_against_the_floor_measured_before_the_crash(monkeypatch):
    """A cached schedule that raises ends the check, but the floor was measured before it: the crash
    is run through generate's paths like any finding (mamba on 5.12.1 crashed on a chunked schedule
    while its beam search was silently wrong, #46612), so the record says whether users reach it."""
    from smearcli.engines.transformers import check

    def raising(*a, **k):
        e = RuntimeError("a cached schedule raised")
        e.schedule = "chunks of 16"
        raise e
    monkeypatch.setattr(check, "run_all", raising)
    rec = check.check("llama")
    assert rec.verdict == "crashed" and rec.notes[0] == "chunks of 16 raised; the full pass runs", rec.notes
    assert rec.floor and rec.floor > 0
    assert list(rec.reach) == list(reach.PATHS)
    assert all(e.result == reach.AGREES for e in rec.reach.values()), rec.reach


def test_beam_search_permutes_its_beams_so_a_skipped_reorder_shows(monkeypatch):
    """A cache that beam search never reorders (#46612: Mamba's state kept every beam's old order)
    departs only where the kept beams change order. Two beams of the tiny Mamba keep theirs on seed
    0, so the skipped reorder agreed to the floor; the census's beams (`GENERATE_BEAMS`) permute."""
    import transformers.cache_utils as cu

    monkeypatch.setattr(cu.Cache, "reorder_cache", lambda self, beam_idx: None)
    model = build(derive("mamba").config, None, 0)
    with torch.inference_mode():
        got = reach.measure(reach.beam, model, tokens_of(0))
    assert got["max_abs"] > 1.0, got


def test_generate_runs_with_transformers_warnings_off(monkeypatch):
    """Each of the census's generate calls makes transformers warn about how it was called (a
    generation config and its options together): under `scan --quiet` those lines were printed once
    per path and architecture. generate runs inside `reach.quiet`, which turns them off."""
    import contextlib
    import logging

    import transformers

    with reach.quiet():
        assert transformers.utils.logging.get_verbosity() == logging.ERROR
    entered = []
    real = reach.quiet

    @contextlib.contextmanager
    def noting():
        with real():
            entered.append(transformers.utils.logging.get_verbosity())
            yield
    monkeypatch.setattr(reach, "quiet", noting)
    with torch.inference_mode():
        reach.greedy(build(CFG, None, 0), tokens_of(0))
    assert entered == [logging.ERROR]
