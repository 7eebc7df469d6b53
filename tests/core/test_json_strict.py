"""Every `--json` document, JSON Lines record and PNG summary is strict JSON (smearcli.util.jsonsafe):
no `NaN` or `Infinity` token, which `jq` and JavaScript refuse; a non-finite number is null and
the document's `non_finite` object names it and why. Checked on models whose numbers overflow:
our checkpoint with a weight scaled to 1e38 (finite, so it loads; its activations overflow), a
transformers model the same way, and a user's nanochat forward that returns NaN."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import pytest
import torch

from hardening_util import FAST, PT, edit_state, invoke, write_checkpoint
from smearcli.util import jsonsafe

STANDIN = Path(__file__).resolve().parents[1] / "standin" / "old"


def strict(text: str):
    """`json.loads` that refuses the NaN / Infinity / -Infinity tokens Python would accept."""
    def refuse(token):
        raise AssertionError(f"not JSON: the token {token} is in the document")
    return json.loads(text, parse_constant=refuse)


@pytest.fixture(scope="module")
def overflowing(tmp_path_factory) -> Path:
    """A checkpoint whose first MLP's output overflows to inf and then NaN (weights finite)."""
    d = write_checkpoint(tmp_path_factory.mktemp("overflow") / "big")
    key = "transformer.h.0.mlp.c_proj.weight"
    edit_state(d, lambda sd: sd.__setitem__(key, sd[key] * 1e38))
    return d


def test_non_finite_numbers_become_null_with_their_pointer():
    doc = {"a": 1.5, "b": float("nan"), "c": [1.0, float("inf"), 2, -math.inf],
           "d": [{"x~/y": float("-inf")}], "e": [[0.0, float("nan")], [1.0]], "f": True, "g": None}
    out = jsonsafe.finite_or_null(doc)
    assert out["b"] is None and out["c"] == [1.0, None, 2, None] and out["d"] == [{"x~/y": None}]
    assert out["e"] == [[0.0, None], [1.0]] and out["f"] is True and out["g"] is None
    assert out["non_finite"] == {"/b": "nan", "/c": "2 of 4: inf, -inf", "/d/0/x~0~1y": "-inf",
                                 "/e/0": "1 of 2: nan"}
    assert math.isnan(doc["b"]) and "non_finite" not in doc  # the caller's object is not changed
    assert strict(jsonsafe.dumps(doc)) == out
    assert "non_finite" not in jsonsafe.finite_or_null({"a": [1.0, 2.0]})  # only when needed


def test_a_scan_record_is_strict_json_lines():
    # the shape of what the scan's children write, one record per line (`default=str` as they use)
    record = {"arch": "llama", "max_abs": float("nan"), "per_step": [0.0, float("inf")], "cfg": object()}
    line = jsonsafe.dumps(record, default=str)
    assert "\n" not in line
    got = strict(line)
    assert got["max_abs"] is None and got["non_finite"] == {"/max_abs": "nan", "/per_step": "1 of 2: inf"}


def test_allow_nan_is_off_at_the_writer():
    class Sneaky(float):  # a float json writes itself, as a subclass: still caught
        pass
    assert strict(jsonsafe.dumps({"v": Sneaky("nan")})) == {"v": None, "non_finite": {"/v": "nan"}}


def test_compare_json_of_an_overflowing_model(overflowing, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    r = invoke(["compare", *FAST, "--checkpoint", overflowing, "--json"], allowed=(0,))
    doc = strict(r.stdout)
    # the floor is now the float64 full pass, which stays finite: what is left non-finite is named
    assert all(p.startswith("/runs/") and v for p, v in doc.get("non_finite", {}).items())


def test_bench_json_and_output_file_of_an_overflowing_model(overflowing, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    r = invoke(["bench", *FAST, "--checkpoint", overflowing, "--json", "--budget", "0.5",
                "--schedules", "prefill", "--output", "b.json"], allowed=(0,))
    assert strict(r.stdout) == strict((tmp_path / "b.json").read_text())


def test_plot_png_summary_of_an_overflowing_model(overflowing, tmp_path, monkeypatch):
    pytest.importorskip("matplotlib")
    from PIL import Image

    from smearcli.render.figures import PNG_SUMMARY_KEY

    monkeypatch.chdir(tmp_path)
    invoke(["plot", *FAST, "--checkpoint", overflowing, "--schedules", "chunked", "--out", "f.png"], allowed=(0,))
    strict(Image.open(tmp_path / "f.png").text[PNG_SUMMARY_KEY])


def test_audit_json_of_a_users_forward_that_returns_nan(tmp_path, monkeypatch):
    root = tmp_path / "mine"
    shutil.copytree(STANDIN, root, ignore=shutil.ignore_patterns("__pycache__"))
    gpt = root / "nanochat" / "gpt.py"
    ret = "        return logits\n"
    assert gpt.read_text().count(ret) == 1
    gpt.write_text(gpt.read_text().replace(ret, "        return logits * float('nan')\n"))
    r = invoke(["compare", "--impl", "nanochat", "--nanochat-path", root, "--depth", "1", "--seq-len", "12",
                "--chunks", "2", "--gen-len", "4", "--draft", "2", "--schedules", "chunked", "--json"])
    doc = strict(r.stdout)
    assert doc["schema"] == "smearcli.audit/1" and doc["non_finite"], doc.keys()


def test_hf_json_of_an_overflowing_model(tmp_path, monkeypatch):
    pytest.importorskip("transformers")
    from smearcli.engines import transformers as hf

    model = hf.tiny_model("llama")
    with torch.no_grad():
        model.model.layers[0].mlp.down_proj.weight.mul_(1e38)
    model.save_pretrained(tmp_path / "big", safe_serialization=True)
    r = invoke(["compare", "--impl", "hf", "--hf-model", tmp_path / "big", "--seq-len", "16", "--json"],
               allowed=(0,))
    doc = strict(r.stdout)
    assert doc["schema"] == "smearcli.compare/1"
    assert all(p.startswith(("/runs/", "/noise_floor/")) for p in doc.get("non_finite", {}))


def test_the_overflowing_checkpoint_is_finite_on_disk(overflowing):
    # the premise: it loads (weights finite), and only its activations overflow
    sd = torch.load(overflowing / PT, weights_only=True)
    assert all(torch.isfinite(v).all() for v in sd.values() if v.is_floating_point())
