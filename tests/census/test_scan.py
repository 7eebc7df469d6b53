"""smearcli scan: tiny configs derived from defaults, the error's shapes, the report, and the
standalone reproducer (isolation: tests/census/test_scan_isolate.py)."""

from __future__ import annotations

import json

import pytest

from smearcli.measure import shapes
from smearcli.census import record, report
from smearcli.tiny import derive
from smearcli.engines.transformers.check import cycle, split_points

pytest.importorskip("transformers")


# -- derivation ---------------------------------------------------------------------------------
def hybrid_defaults() -> dict:
    kinds = ["mamba"] * 5 + ["attention"] + ["mamba"] * 5 + ["attention"]
    return {"model_type": "toy", "vocab_size": 50000, "hidden_size": 4096, "intermediate_size": 11008,
            "num_hidden_layers": 12, "num_attention_heads": 32, "num_key_value_heads": 8,
            "layer_types": kinds, "full_attn_idxs": [5, 11], "sliding_window": 4096,
            "eos_token_id": 49999, "bos_token_id": 1, "per_layer_config": {5: {"x": 1}, 11: {"x": 2}},
            "text_config": {"model_type": "toy_text", "hidden_size": 2048, "num_hidden_layers": 3}}


def test_shrink_keeps_both_layer_kinds_and_renumbers():
    small, changed, kinds = derive.shrink(hybrid_defaults())
    assert small["num_hidden_layers"] == 2
    assert small["layer_types"] == ["mamba", "attention"]  # the first of each kind, in order
    assert small["full_attn_idxs"] == [1]  # layer 5 is now layer 1
    assert small["per_layer_config"] == {1: {"x": 1}}
    assert small["hidden_size"] == derive.WIDTH and small["vocab_size"] == derive.VOCAB
    assert small["sliding_window"] == derive.WINDOW < 16  # shorter than a chunk
    assert small["eos_token_id"] < derive.VOCAB and small["bos_token_id"] == 1  # in range ones stay
    assert small["text_config"]["hidden_size"] == derive.WIDTH  # sub-configs shrink too
    assert changed["layer_types"] == (hybrid_defaults()["layer_types"], ["mamba", "attention"])
    assert "num_key_value_heads" in changed and small["num_attention_heads"] % small["num_key_value_heads"] == 0


def test_shrink_never_raises_a_small_default():
    small, _, _ = derive.shrink({"hidden_size": 32, "num_attention_heads": 2, "num_hidden_layers": 1})
    assert small == {"hidden_size": 32, "num_attention_heads": 2, "num_hidden_layers": 1}


def test_derive_real_configs():
    d = derive.derive("llama")
    assert d.error is None and d.config.hidden_size == derive.WIDTH and d.config.num_hidden_layers == 2
    j = derive.derive("jamba")  # attention every 8th layer by default: the period brings it in
    assert j.error is None and (j.config.attn_layer_period, j.config.attn_layer_offset) == (2, 1)
    g = derive.derive("granitemoehybrid")  # an override: the defaults have no attention layer
    assert len(set(g.config.layer_types)) == 2 and "linear_attention" in g.config.layer_types
    bad = derive.derive("no_such_architecture")
    assert bad.config is None and "cannot be built" in bad.error


def test_split_points_straddle_conv_window_and_ssm_chunk():
    cfg = derive.derive("mamba2").config
    plans = split_points(cfg, 49)
    assert all(sum(s) == 49 for s in plans.values())
    conv = cfg.conv_kernel
    widths = next(v for k, v in plans.items() if k.startswith("widths") and "conv" in k)
    assert conv - 1 in widths and conv in widths
    ssm = next(v for k, v in plans.items() if "SSM chunk" in k)
    assert {cfg.chunk_size - 1, cfg.chunk_size + 1} <= set(ssm)
    assert cycle([3, 4], 10) == [3, 4, 3]


# -- shapes ------------------------------------------------------------------------------------
STEPS = [16, 16, 17]


def profile(kind: str) -> list[float]:
    e = [1e-7] * 49
    if kind == "dropped":
        e[16:] = [1e-2] * 33
    elif kind == "lost":
        for s in (16, 32):
            e[s:s + 4] = [1e-2, 5e-3, 1e-3, 2e-4]
    elif kind == "mask":
        e[3:] = [1e-2] * 46
    return e


@pytest.mark.parametrize("kind, shape", [("dropped", shapes.STATE_DROPPED), ("lost", shapes.CONTEXT_LOST),
                                         ("mask", shapes.MASK), ("clean", shapes.OTHER)])
def test_profile_shapes(kind, shape):
    assert shapes.profile_shape(profile(kind), STEPS, threshold=1e-5) == shape


def test_decode_path_and_reruns_decide_first():
    e = [1e-7] + [1e-2] * 48
    assert shapes.profile_shape(e, [1] * 49, 1e-5) == shapes.DECODE_PATH
    assert shapes.profile_shape([1e-7] * 40 + [1e-2] * 9, [40] + [1] * 9, 1e-5) == shapes.DECODE_PATH
    dropped = profile("dropped")
    assert shapes.classify(dropped, STEPS, 1e-5, fixed_by="position_ids") == shapes.POSITIONS
    assert shapes.classify(dropped, STEPS, 1e-5, fixed_by="attention_mask") == shapes.MASK
    assert shapes.classify(dropped, STEPS, 1e-5, decode_fails=True, chunks_pass=True) == shapes.DECODE_PATH
    assert shapes.classify(profile("lost"), STEPS, 1e-5, matches_dropped_state=True) == shapes.STATE_DROPPED


# -- report --------------------------------------------------------------------------------------
RECORDS = [record.bare(**r) for r in [
    {"model_type": "averyveryverylongarchitecturename", "verdict": "bug", "worst_schedule": "widths around the SSM chunk 8",
     "max_abs": 0.5, "shape": shapes.STATE_DROPPED, "born_at": "logits@16", "reproducer": "/x/a.py", "reproducer_status": 1},
    {"model_type": "b", "verdict": "crashed", "reason": "transformers/models/b/modeling_b.py:12 in f: ValueError: no"},
    {"model_type": "c", "verdict": "ok"},
    {"model_type": "d", "verdict": "inconclusive"},
    {"model_type": "e", "verdict": "not built", "reason": "the config class cannot be built"},
]]


def test_table_fits_80_columns_and_counts():
    text = report.table(RECORDS)
    assert all(len(line) <= 80 for line in text.splitlines())
    lines = text.splitlines()
    assert lines[2].startswith("averyveryverylo~") and "state dropped" in lines[2]  # bugs first
    assert "modeling_b.py:12" in text
    assert lines[-1].startswith("5 architectures: 1 bug, 1 crashed, 1 inconclusive, 1 ok, 1 not built")


def test_document_and_markdown():
    doc = report.document(RECORDS, {"transformers_version": "x"})
    assert doc["schema"] == report.SCHEMA
    assert [r["model_type"] for r in doc["architectures"]] == sorted(r.model_type for r in RECORDS)
    first = doc["architectures"][0]
    for key in ("model_type", "verdict", "worst_schedule", "max_abs", "shape", "reproducer"):
        assert key in first
    json.dumps(doc)
    md = report.markdown(RECORDS, {"transformers_version": "x"})
    assert "## Findings" in md and "`a.py` (1)" in md and md.count("\n| ") >= len(RECORDS) + 2


def test_suspect_lines_in_a_modeling_file(tmp_path):
    from smearcli.engines.transformers import draft

    src = tmp_path / "modeling_toy.py"
    src.write_text("\n".join([
        "x = 1",
        "if recurrent_state is not None and seq_len == 1:",
        "    position_ids = torch.arange(hidden_states.shape[1]).unsqueeze(0)",
        "position_ids = torch.arange(T) + past_seen_tokens",
        "out = scan(x, initial_state=None)",
        "if cache.has_previous_state:",
    ]))
    found = {n: what for what, n, _ in draft.suspects(src)}
    assert set(found) == {2, 3, 5, 6}  # line 4 adds the cache offset
    assert "arange" in found[3] and "one-token" in found[2]
