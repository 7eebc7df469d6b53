"""generate's own paths, as users call them (issue #54, item 2): where every cached schedule of
the census agrees, the architecture still runs through greedy `generate` (prompt then decode,
prefill_chunk_size, a left-padded batch, that batch prefilled in chunks with its pads inside the
first chunk, an assistant model), the short row of each padded batch also token for token against
its own unbatched, unchunked `generate`. A path silently wrong that keeps its size in float64 and
on the next seed is the architecture's bug, with a reproducer that needs no smearcli."""

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
from smearcli.census.derive import derive  # noqa: E402
from smearcli.census.record import BoundaryResult, new as record  # noqa: E402
from smearcli.census.shapes import LEFT_UNSUPPORTED  # noqa: E402
from smearcli.defaults import NOISE_MARGIN  # noqa: E402
from smearcli.verdicts import BUG, OK, UNCONFIRMED  # noqa: E402

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
    assert all(e["result"] == reach.AGREES for e in rec.reach.values()), rec.reach
    for name in reach.PADDED_PATHS:  # the short row, token for token with its own generate alone
        assert rec.reach[name]["tokens"] == "same"


def test_a_departure_only_chunked_padding_shows_is_found_through_generate_and_held_unconfirmed():
    rec = ok_record()
    reach.through_generate(rec, lambda s: off_when_chunked_and_padded(build(CFG, None, s)), tokens_of, NOISE_MARGIN)
    assert rec.verdict == UNCONFIRMED, rec.notes  # kept in float64 and on seed 1, yet not read in their source
    assert rec.worst_schedule == reach.GENERATE + "prefill_chunk_size, left-padded batch"
    assert rec.shape == reach.THROUGH and rec.max_abs == pytest.approx(0.05, rel=0.01)
    assert rec.reach["left-padded batch"]["result"] == reach.AGREES  # unchunked, the batch agrees
    said = " ".join(rec.notes)
    assert "in float64" in said and "on seed 1" in said and "held unconfirmed" in said and "(and not" not in said


def test_left_padding_the_model_cannot_number_is_not_judged_through_generate():
    rec = ok_record(LEFT_UNSUPPORTED)
    reach.through_generate(rec, lambda s: off_when_chunked_and_padded(build(CFG, None, s)), tokens_of, NOISE_MARGIN)
    assert rec.verdict == OK and rec.reach["prefill_chunk_size, left-padded batch"]["result"] == reach.SILENT


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
        assert e["result"] == reach.SILENT and e["max_abs"] > 0.1 and e["numbered"] <= threshold, (name, e)
    assert rec.verdict == UNCONFIRMED and rec.shape == reach.THROUGH
    assert any("not a cache" in n for n in rec.notes), rec.notes


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
