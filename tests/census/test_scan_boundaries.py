"""The scan runs the padded and rollback boundaries on every architecture: a model that
lets padding leak into a row and a cache whose crop keeps the rejected draft are each a bug with
the boundary's own shape; the tiny llama passes both; a runner that can neither crop nor copy, and
a model that takes no attention mask, are reported as such; a pass on state never shown to matter
is no ok; and the boundary reproducers need torch and transformers only."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("transformers", reason="transformers is not installed: pip install 'smearcli[hf]'")

from smearcli.measure.schedules import shape  # noqa: E402
from smearcli.engines.transformers.cache_runner import CacheRunner  # noqa: E402
from smearcli.engines.transformers import page, repro  # noqa: E402
from smearcli.measure import shapes  # noqa: E402
from smearcli.census import report  # noqa: E402
from smearcli.engines.transformers.check import T, build, check_model, split_points  # noqa: E402
from smearcli.census.record import BoundaryResult, new as record  # noqa: E402
from smearcli.judging.verdicts import BUG, INCONCLUSIVE, OK  # noqa: E402
from smearcli.tiny.derive import derive  # noqa: E402
from smearcli.measure.runner import PADDING  # noqa: E402
from smearcli.judging.verdicts import LEFT_UNSUPPORTED, NOT_JUDGED  # noqa: E402


def tiny_llama(cls=None):
    cfg = derive("llama").config
    if cls is None:
        return build(cfg, None, 0), cfg
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        return cls(cfg).float().eval(), cfg


def tokens(cfg):
    return torch.randint(0, 256, (1, T), generator=torch.Generator().manual_seed(0))


def scan(model, cfg, **kw):
    return check_model(model, tokens(cfg), split_points(cfg, T), **kw)


def no_mask_llama():
    """A llama that takes an attention mask and drops it: left padding leaks into the real tokens."""
    from transformers import LlamaForCausalLM

    class NoMask(LlamaForCausalLM):
        def forward(self, input_ids=None, attention_mask=None, position_ids=None, cache=None,
                    use_cache=None, **kw):
            return super().forward(input_ids=input_ids, position_ids=position_ids, cache=cache,
                                   use_cache=use_cache, **kw)
    return NoMask


def test_the_tiny_llama_passes_padded_and_rollback_cropped():
    model, cfg = tiny_llama()
    out = scan(model, cfg)
    assert out["verdict"] == OK, out
    b = out["boundaries"]
    assert b["padded"].status == OK and b["rollback"].status == OK
    assert b["rollback"].mode == "crop"  # a KV-only DynamicCache is cropped, not copied
    assert out["schedules"]["padded"].passed and out["schedules"]["rollback"].passed
    assert any("cropped back" in n for n in out["notes"])


def test_padding_that_leaks_into_a_row_is_a_bug_with_its_shape():
    model, cfg = tiny_llama(no_mask_llama())
    out = scan(model, cfg)
    assert out["verdict"] == BUG
    assert out["worst_schedule"] == "padded" and out["shape"] == shape("padded")
    assert out["boundaries"]["padded"].status == BUG
    assert out["boundaries"]["padded"].shape == shape("padded")
    rb = out["boundaries"]["rollback"]  # it agreed beside another bug: no power check ran, so no ok
    assert rb.status == NOT_JUDGED and rb.why == "padded failed beside it", rb
    assert out["boundaries"]["padded"].multiple > 10


def test_a_crop_that_keeps_the_rejected_draft_is_state_not_rolled_back(monkeypatch):
    from transformers import DynamicCache

    monkeypatch.setattr(DynamicCache, "crop", lambda self, n: None)  # stale: the draft stays
    model, cfg = tiny_llama()
    out = scan(model, cfg)
    assert out["verdict"] == BUG and out["worst_schedule"] == "rollback"
    assert out["shape"] == shape("rollback")
    e = out["boundaries"]["rollback"]
    assert e.status == BUG and e.mode == "crop" and e.shape == shape("rollback")
    assert out["boundaries"]["padded"].status == NOT_JUDGED


def test_a_crop_their_api_refuses_falls_back_to_a_copy(monkeypatch):
    """A refusal in so many words, raised in their code (any other exception is their crash:
    tests/test_scan_rollback_api.py)."""
    import transformers.cache_utils as cu
    from transformers import DynamicCache

    ns: dict = {}
    exec(compile("def refuse(self, n):\n    raise NotImplementedError('crop is not supported here')\n",
                 cu.__file__, "exec"), ns)
    monkeypatch.setattr(DynamicCache, "crop", ns["refuse"])
    model, cfg = tiny_llama()
    out = scan(model, cfg)
    e = out["boundaries"]["rollback"]
    assert out["verdict"] == OK and e.mode == "copy" and "crop refused" in e.why


class Stuck(CacheRunner):
    """The scan's runner without copy or crop."""

    def can(self, capability):
        return capability == PADDING


def test_a_runner_that_can_neither_crop_nor_copy_is_reported():
    model, cfg = tiny_llama()
    out = scan(model, cfg, make=Stuck)
    e = out["boundaries"]["rollback"]
    assert e.status == "not run" and "neither" in e.why and e.mode is None
    assert any(n.startswith("rollback not run") and "neither" in n for n in out["notes"])
    assert "rollback" not in out["schedules"] and out["boundaries"]["padded"].status == OK
    rec = record("llama", **out)
    assert "rollback: 1 not run" in report.table([rec])
    md = report.markdown([rec])
    assert "| llama | rollback | not run |" in md and "neither" in md


def test_a_model_without_an_attention_mask_says_padded_was_not_run():
    from transformers import LlamaForCausalLM

    class Maskless(LlamaForCausalLM):
        def forward(self, input_ids=None, cache=None, use_cache=None, **kw):
            return super().forward(input_ids=input_ids, cache=cache, use_cache=use_cache, **kw)
    model, cfg = tiny_llama(Maskless)
    out = scan(model, cfg)
    e = out["boundaries"]["padded"]
    assert e.status == "not run" and "attention_mask" in e.why
    assert any(n.startswith("padded not run") for n in out["notes"])
    assert "not run: Maskless.forward takes no attention_mask" in page.boundary_cell(record("x", **out), "padded")


def test_no_ok_for_the_boundaries_when_the_state_never_moves_the_logits(monkeypatch):
    from smearcli.judging import evidence

    weak = lambda runner, tokens, threshold, **kw: evidence.Power(T // 2, threshold, {"kv": threshold})  # noqa: E731
    monkeypatch.setattr(evidence, "power", weak)
    model, cfg = tiny_llama()
    out = scan(model, cfg)
    assert out["verdict"] == INCONCLUSIVE
    assert {e.status for e in out["boundaries"].values()} == {INCONCLUSIVE}


def test_classify_names_the_boundaries_and_the_report_knows_them():
    e = [0.0] * 10
    assert shapes.classify(e, [10], 1e-5, schedule="padded") == shape("padded")
    assert shapes.classify(e, [10], 1e-5, schedule="rollback") == shape("rollback")
    assert {shape("padded"), shape("rollback")} <= set(shapes.all_shapes())
    rec = record("m", "bug", worst_schedule="padded", shape=shape("padded"), max_abs=1.0,
                 boundaries={"padded": BoundaryResult("bug", multiple=3e4, mode=None),
                             "rollback": BoundaryResult("crashed", mode="copy",
                                                        why="transformers/models/m/modeling_m.py:7 in f: E: x")})
    text = report.table([rec])
    assert "padding leaks" in text and "padded: 1 bug" in text and "rollback: 1 crashed (copy)" in text
    assert "boundaries" in report.document([rec])["architectures"][0]
    assert "crashed: modeling_m.py:7 (copy)" in report.markdown([rec])


@pytest.mark.slow
@pytest.mark.parametrize("model_type, schedule, status", [("rwkv", "padded", 1), ("llama", "padded", 0),
                                                           ("llama", "rollback", 0)])
def test_boundary_reproducers(tmp_path, model_type, schedule, status):
    import ast

    e = BoundaryResult(BUG, max_abs=1.0, shape=shape(schedule), mode="crop" if model_type == "llama" else None)
    rec = record(model_type, BUG, worst_schedule=schedule, steps=[T], max_abs=1.0, boundaries={schedule: e})
    path = repro.write(rec, derive(model_type).config, tmp_path / f"{model_type}.py", total=T)
    src = path.read_text()
    imported = {n.names[0].name.split(".")[0] for n in ast.walk(ast.parse(src)) if isinstance(n, ast.Import)}
    assert imported <= {"contextlib", "copy", "inspect", "json", "sys", "torch", "transformers"}
    got, line = repro.run(path)
    assert got == status, line
    assert schedule in line


def test_padded_runs_as_the_model_numbers_positions_and_says_which_rows_are_off():
    from smearcli.engines.transformers.check import check

    rob = check("roberta")  # positions from its padding id on: explicit 0-based ones would be wrong
    e = rob.boundaries["padded"]
    assert e.status == OK and e.positions is False and e.pad_id == 1
    assert "numbers positions its own way" in e.why
    bart = check("bart")  # learned absolute positions and no position_ids: left padding shifts them
    e = bart.boundaries["padded"]
    assert e.status == LEFT_UNSUPPORTED and e.shape is None  # what its API allows, no bug
    assert bart.verdict in (OK, INCONCLUSIVE), bart.verdict
    assert e.rows["the row"] == 0.0 or e.rows["the row"] < e.rows["left-padded"] / 1e3
    assert "off: left-padded" in e.why and "takes no position_ids" in e.why


def no_positions_gpt2():
    """GPT-2 (learned absolute positions) with a forward that takes no position_ids, as BART's or
    Whisper's: it numbers every row from the cache, so a left-padded row is numbered after its
    padding (rotary models do not mind the shift; absolute positions do)."""
    from transformers import GPT2LMHeadModel

    class NoPositions(GPT2LMHeadModel):
        def forward(self, input_ids=None, attention_mask=None, cache=None, use_cache=None, **kw):
            kw.pop("position_ids", None)
            return super().forward(input_ids=input_ids, attention_mask=attention_mask, cache=cache,
                                   use_cache=use_cache, **kw)
    return NoPositions


def test_left_padding_a_model_cannot_number_is_its_own_status_not_a_bug():
    """Off only in the left-padded row, with no position_ids to give: what the model's API allows,
    shown with why (right padding passes), and not counted as a bug: the verdict stays ok."""
    cfg = derive("gpt2").config
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = no_positions_gpt2()(cfg).float().eval()
    out = scan(model, cfg)
    e = out["boundaries"]["padded"]
    assert e.status == LEFT_UNSUPPORTED, e
    rows = e.rows
    assert rows["left-padded"] > 10 * out["floor"] >= rows["right-padded"], rows
    assert "right padding passes" in e.why
    assert out["verdict"] == OK and "padded" not in out["schedules"], out
    md = "\n".join(page.boundaries_md([record("gpt2-nopos", **out)]))
    assert "gpt2-nopos | padded | left padding unsupported" in md


def test_their_crop_heads_the_rollback_where_both_ways_fail_alike():
    """Their crop and the copy measure one error where both fail alike (2.3e4x the floor each for
    mamba); which of two equal sizes is larger is rounding, and on another CPU the other way headed
    (notebook 06 read "bug (copy)" on one machine, "bug (crop)" on the next). The crop, the API users
    call, heads; the copy heads only where the crop does not fail as badly (a bug beats unconfirmed)."""
    import types

    from smearcli.engines.transformers import boundary

    def way(status, size):
        return boundary.Rolled(types.SimpleNamespace(max_abs_logits=size), None, BoundaryResult(status), None)
    crop, copy = way(str(BUG), 0.0440), way(str(BUG), 0.0441)
    assert boundary.headline({"crop": crop, "copy": copy}) is crop
    crop = way("unconfirmed", 0.9)
    assert boundary.headline({"crop": crop, "copy": copy}) is copy
