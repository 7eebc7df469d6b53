"""Real model sizes (presets), the progress bar, memory-mapped checkpoints and the preflight at real
sizes (decode sharing and progress counts are tests/core/test_compare.py's)."""

import io
import json

import pytest
import torch
from typer.testing import CliRunner

from smearcli.gpt import smear
from smearcli.cli.app import app
from smearcli.cli.options import RunSpec
from smearcli.gpt.config import PRESETS, preset_config
from smearcli.gpt.model import param_shapes
from smearcli.gpt.weights import random_config, random_model


# -- presets --------------------------------------------------------------------------------------
@pytest.mark.parametrize("name,width,heads", [("d12", 768, 6), ("d20", 1280, 10), ("d26", 1664, 13),
                                              ("d32", 2048, 16)])
def test_presets_are_nanochats_shapes(name, width, heads):
    # widths and head counts as nanochat's training logs print them (model_dim, num_heads)
    c = preset_config(name)
    assert (c.n_layer, c.n_embd, c.n_head, c.n_kv_head, c.head_dim) == (int(name[1:]), width, heads, heads, 128)
    assert (c.vocab_size, c.sequence_len, c.window_pattern) == (65536, 2048, "SSSL")
    assert PRESETS[name].seq_len == 2048


def test_d20_has_the_issues_561m_matmul_parameters():
    shapes = param_shapes(preset_config("d20"))
    n = sum(a * b for k, (a, b, *_) in ((k, s) for k, s in shapes.items() if len(s) == 2)
            if "value_embeds" not in k and "gate" not in k)
    assert 560e6 < n < 562e6  # the issue: "561M matmul parameters" for nanochat's d20


def test_small_preset_is_the_small_default():
    assert preset_config("small") == random_config(4)
    assert PRESETS["small"].seq_len == RunSpec().seq_len_value() == 256


def test_preset_refused_with_checkpoint_or_tiny(tmp_path):
    r = CliRunner().invoke(app, ["compare", "--preset", "d12", "--model", "tiny"])
    assert r.exit_code == 2 and "--preset d12" in r.output and "--model tiny" in r.output
    r = CliRunner().invoke(app, ["plot", "--preset", "d20", "--checkpoint", str(tmp_path), "-o", str(tmp_path / "a.png")])
    assert r.exit_code == 2 and "--checkpoint" in r.output


def test_preset_builds_the_shape_in_compare():
    # --depth 1 keeps it fast: the preset's rule (vocab, context) at one layer
    r = CliRunner().invoke(app, ["compare", "--preset", "d12", "--depth", "1", "--seq-len", "8",
                                 "--schedules", "prefill", "--json", "--quiet"])
    assert r.exit_code == 0, r.output
    cfg = json.loads(r.stdout)["model"]["config"]
    assert (cfg["vocab_size"], cfg["sequence_len"], cfg["n_embd"], cfg["n_head"]) == (65536, 2048, 128, 1)


# -- decode shared between logics -----------------------------------------------------------------
@pytest.mark.parametrize("B,C,dtype", [(1, 32, torch.float32), (3, 64, torch.float32), (2, 48, torch.bfloat16)])
@pytest.mark.parametrize("with_prev", [False, True])
def test_one_token_step_is_the_same_code_for_every_logic(B, C, dtype, with_prev):
    g = torch.Generator().manual_seed(B * C)
    for _ in range(5):
        x = torch.randn(B, 1, C, generator=g).to(dtype)
        prev = torch.randn(B, 1, C, generator=g).to(dtype) if with_prev else None
        w, lam = torch.randn(1, 24, generator=g), torch.rand(1, generator=g)
        outs = {name: fn(x, w, lam, prev, True) for name, fn in smear.LOGICS.items() if name in smear.ONE_TOKEN_STEP}
        for name, out in outs.items():
            assert torch.equal(out, smear.ONE_TOKEN_STEP[name](x, w, lam, prev)), name
        assert torch.equal(outs["old"], outs["fixed"])


class FakeTTY(io.StringIO):
    def isatty(self):
        return True


def test_bar_draws_tokens_rate_and_time_left_on_a_terminal_only(monkeypatch):
    from smearcli.cli import progress
    assert progress.wants_bar(False, FakeTTY()) and not progress.wants_bar(True, FakeTTY())
    assert not progress.wants_bar(False, io.StringIO())
    assert progress.token_rate(1234.4) == "1,234 tok/s" and progress.token_rate(None) == ""
    tty = FakeTTY()
    monkeypatch.setattr("sys.stderr", tty)
    with progress.progress_bar("compare", unit="tokens") as bar:
        assert bar.shown
        bar.label("decode / old")
        bar.tokens(500, 1000)
        bar._p.refresh()
        text = tty.getvalue()
    assert "500/1,000 tokens" in text and "decode / old" in text
    with progress.progress_bar("compare", unit="tokens", quiet=True) as bar:
        assert not bar.shown


# -- memory-mapped loading and the preflight at real sizes ----------------------------------------
def test_zip_checkpoints_are_memory_mapped_and_legacy_ones_read(tmp_path, monkeypatch):
    from smearcli.gpt import weights
    m = random_model(random_config(1, sequence_len=64), seed=3).model
    weights.save_checkpoint(m, tmp_path / "zip", 5)
    legacy = tmp_path / "legacy"
    weights.save_checkpoint(m, legacy, 5)
    torch.save(torch.load(legacy / "model_000005.pt"), legacy / "model_000005.pt",
               _use_new_zipfile_serialization=False)
    seen = []
    real = torch.load
    monkeypatch.setattr(torch, "load", lambda *a, **k: seen.append(k.get("mmap")) or real(*a, **k))
    a = weights.load_checkpoint(tmp_path / "zip").model
    b = weights.load_checkpoint(legacy).model
    assert seen == [True, False]
    for (k, x), y in zip(m.state_dict().items(), b.state_dict().values()):
        assert torch.equal(x, a.state_dict()[k]) and torch.equal(x, y), k


def test_preflight_counts_no_file_copy_when_mapped():
    from smearcli.util import preflight
    c = preset_config("d12")
    assert preflight.load_bytes(c, 10**9) - preflight.load_bytes(c, 10**9, mmap=True) == 10**9


def test_d20_at_2048_is_refused_with_its_estimate_where_memory_is_short(monkeypatch):
    from smearcli.util import preflight
    c = preset_config("d20")
    need = preflight.run_bytes(c, 1, 2048, ["prefill", "decode", "chunked"], ["old", "fixed"])
    # every run keeps 2048 x (65,536 logits + 21 x 1280 hidden) fp32 values: 757 MB a run, 7 runs
    assert need > 7 * 2048 * (65536 + 21 * 1280) * 4
    monkeypatch.setattr(preflight, "available", lambda device: 4 << 30)
    r = CliRunner().invoke(app, ["compare", "--preset", "d20", "--quiet"])
    assert r.exit_code == 2 and "needs about" in r.output and "4.0 GiB available" in r.output, r.output


def test_d20_run_estimate_refuses_where_the_model_fits_but_the_run_does_not(monkeypatch):
    from smearcli.util import preflight
    from smearcli.util.errors import UserError
    from smearcli.util.defaults import DEFAULT_SCHEDULES
    c = preset_config("d20")
    monkeypatch.setattr(preflight, "available", lambda device: 12 << 30)
    preflight.check_model_memory(c, "cpu")  # 5.2 GiB of fp32 weights fit
    with pytest.raises(UserError, match=r"1 x 2048 tokens.*needs about [\d.]+ GiB of memory, 12.0 GiB available"):
        preflight.check_run_memory(c, "cpu", 1, 2048, list(DEFAULT_SCHEDULES), ["old", "fixed"], 2, None, "float32")


def test_a_process_that_keeps_freed_memory_needs_more_room_for_the_same_run(monkeypatch):
    """`allocator.keep_freed` holds blocks it cannot coalesce: the run's estimate grows by
    KEPT_SLACK on the CPU, so a run that would just fit with glibc's defaults is refused."""
    from smearcli.util import preflight
    from smearcli.util.errors import UserError
    from smearcli.util.defaults import DEFAULT_SCHEDULES
    c = preset_config("d12")
    args = (c, "cpu", 1, 1024, list(DEFAULT_SCHEDULES), ["old", "fixed"], 2, None, "float32")
    need = preflight.run_bytes(*args[:1], *args[2:])
    monkeypatch.setattr(preflight, "available", lambda device: int(need * (1 + preflight.KEPT_SLACK / 2)))
    preflight.check_run_memory(*args)  # fits with glibc's defaults
    with pytest.raises(UserError, match=r"1 x 1024 tokens.*needs about"):
        preflight.check_run_memory(*args, kept=True)
