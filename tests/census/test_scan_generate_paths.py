"""generate's own paths, as users call them (issue #54, item 2): where every cached schedule of
the census agrees, the architecture still runs through greedy `generate` (prompt then decode,
prefill_chunk_size, a left-padded batch, that batch prefilled in chunks with its pads inside the
first chunk, an assistant model), the short row of each padded batch also token for token against
its own unbatched, unchunked `generate`. A path silently wrong that keeps its size in float64 and
on the next seed is the architecture's bug, with a reproducer that needs no smearcli."""

from __future__ import annotations

import subprocess
import sys
import types

import pytest
import torch

pytest.importorskip("transformers", reason="transformers is not installed: pip install 'smearcli[hf]'")

from smearcli.census import reach, repro  # noqa: E402
from smearcli.census.check import T, build  # noqa: E402
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
