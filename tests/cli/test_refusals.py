"""Refusals and safe outputs: nothing from a file runs, one error path (one line, --debug for the
traceback), atomic outputs, memory refused up front, and cache steps that fail without changing
the cache."""

from __future__ import annotations

import ast
import errno
import os
import pickle

import pytest
import torch
import typer
from hypothesis import given, settings
from hypothesis import strategies as st

import smearcli.util.preflight as validate
from smearcli.gpt.model import param_shapes
from smearcli.util.formatters import nbytes
from hardening_util import (FAST, PT, copy_checkpoint, invoke, leftovers, malicious_pickle,
                            malicious_state, runner, write_checkpoint)
from smearcli.gpt.cache import CacheFullError
from smearcli.cli.app import app
from smearcli.gpt.config import GPTConfig
from smearcli.cli.errors import DEBUG, describe_unexpected, guarded
from smearcli.util.errors import UserError
from smearcli.util.files import atomic_write
from smearcli.gpt.model import GPT
from smearcli.gpt.weights import load_checkpoint, random_config, random_model
from conftest import ROOT  # noqa: E402 - the clone's root

PKG = ROOT / "smearcli"


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    return write_checkpoint(tmp_path_factory.mktemp("ckpt") / "d1")


# -- nothing from a file runs ----------------------------------------------------------------------
def test_malicious_checkpoint_pickle_is_not_executed(tmp_path, ckpt):
    marker = tmp_path / "PWNED"
    d = copy_checkpoint(ckpt, tmp_path / "evil")
    malicious_state(d, marker)
    # the control: an ordinary unpickling of this very file runs the payload
    control = tmp_path / "control"
    copy_checkpoint(ckpt, control)
    malicious_state(control, tmp_path / "CONTROL")
    torch.load(control / PT, weights_only=False)
    assert (tmp_path / "CONTROL").exists()

    r = invoke(["compare", *FAST, "--checkpoint", d], allowed=(2,))
    assert "refused: loading it would call io.open" in r.stderr
    assert "weights_only=True" in r.stderr
    assert not marker.exists()
    with pytest.raises(UserError, match="refused"):
        load_checkpoint(d)
    assert not marker.exists()


def test_tokenizer_pkl_is_never_unpickled(tmp_path, ckpt):
    # nanochat's layout: base_checkpoints/<tag>/ beside tokenizer/tokenizer.pkl; we also put one
    # inside the checkpoint directory itself
    base = tmp_path / "nanochat"
    d = copy_checkpoint(ckpt, base / "base_checkpoints" / "d1")
    marker = tmp_path / "PWNED"
    malicious_pickle(d / "tokenizer.pkl", marker)
    (base / "tokenizer").mkdir()
    malicious_pickle(base / "tokenizer" / "tokenizer.pkl", marker)
    control = malicious_pickle(tmp_path / "control.pkl", tmp_path / "CONTROL")
    with open(control, "rb") as f:
        pickle.load(f)  # the payload is live
    assert (tmp_path / "CONTROL").exists()

    invoke(["compare", *FAST, "--schedules", "chunked", "--checkpoint", d], allowed=(0,))
    invoke(["compare", *FAST, "--schedules", "chunked", "--checkpoint", d, "--text", "hi there"], allowed=(0,))
    assert not marker.exists()


def test_help_says_how_pickles_are_read():
    r = runner.invoke(app, ["compare", "--help"])
    text = " ".join(r.output.replace("│", " ").split())  # help panels wrap lines inside box borders
    assert "read without running code from it" in text and "weights_only=True" in text


def test_source_never_unpickles_arbitrary_objects():
    """Every torch.load in the package passes weights_only=True; nothing calls pickle directly but
    the tokenizer loader, whose only unpickler is a subclass that overrides find_class (so every
    global a file names goes through its allow-list; tests/core/test_tokenizer.py tests that list)."""
    loads = 0
    tok = (PKG / "gpt" / "tokenizer.py").read_text()
    tree = ast.parse(tok)
    unpicklers = [n for n in ast.walk(tree) if isinstance(n, ast.ClassDef)
                  and any(ast.unparse(b) == "pickle.Unpickler" for b in n.bases)]
    assert len(unpicklers) == 1
    assert "find_class" in {f.name for f in unpicklers[0].body if isinstance(f, ast.FunctionDef)}
    calls = {ast.unparse(n.func) for n in ast.walk(tree) if isinstance(n, ast.Call)}
    assert not {c for c in calls if c.startswith("pickle.") and c not in (
        "pickle.UnpicklingError",)}, calls  # no pickle.load / loads / Unpickler(...) of its own
    for path in PKG.rglob("*.py"):
        if path.name == "tokenizer.py" and path.parent == PKG / "gpt":
            continue
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.Call):
                name = ast.unparse(node.func)
                if name.endswith("torch.load"):
                    loads += 1
                    kw = {k.arg: k.value for k in node.keywords}
                    assert isinstance(kw.get("weights_only"), ast.Constant) and kw["weights_only"].value is True, \
                        f"{path.name}:{node.lineno}: torch.load without weights_only=True"
                assert not name.startswith(("pickle.", "dill.", "cloudpickle.")) and name != "Unpickler", \
                    f"{path.name}:{node.lineno}: {name}"
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                mods = [a.name for a in node.names] + [getattr(node, "module", None) or ""]
                assert not {"pickle", "dill", "cloudpickle", "_pickle"} & set(mods), f"{path.name}: imports pickle"
    assert loads >= 1  # the loader was found (checkpoint.torch_load: the checkpoint and --tokens readers share it)


# -- one error path --------------------------------------------------------------------------------
def test_debug_shows_the_traceback_and_does_not_leak(monkeypatch):
    r = runner.invoke(app, ["--debug", "compare", *FAST, "--chunks", "0"])
    assert isinstance(r.exception, UserError)  # raised, so Python prints the traceback
    r = invoke(["compare", *FAST, "--chunks", "0"], allowed=(2,))  # the next run: one line again
    assert not DEBUG["on"]
    monkeypatch.setenv("SMEARCLI_DEBUG", "1")
    r = runner.invoke(app, ["compare", *FAST, "--chunks", "0"])
    assert isinstance(r.exception, UserError)
    monkeypatch.setenv("SMEARCLI_DEBUG", "0")
    invoke(["compare", *FAST, "--chunks", "0"], allowed=(2,))


def test_internal_error_is_one_line_pointing_to_debug(monkeypatch):
    import smearcli.measure.compare as lib

    def broken(*a, **k):
        raise ValueError("first line\nsecond line\n  third")
    monkeypatch.setattr(lib, "compare", broken)
    r = runner.invoke(app, ["compare", *FAST])
    assert r.exit_code == 1
    lines = r.stderr.strip().splitlines()
    assert lines == ["smearcli: error: internal error (ValueError: first line); this is a bug in smearcli: "
                     "rerun with --debug and report the traceback"]
    r = runner.invoke(app, ["--debug", "compare", *FAST])
    assert isinstance(r.exception, ValueError)


def test_out_of_memory_and_full_disk_are_the_machines_limits():
    msg, status = describe_unexpected(MemoryError())
    assert status == 2 and msg.startswith("out of memory")
    msg, status = describe_unexpected(RuntimeError("CUDA out of memory. Tried to allocate 2 GiB\nmore"))
    assert status == 2 and "\n" not in msg
    msg, status = describe_unexpected(OSError(errno.ENOSPC, "No space left on device", "out.pt"))
    assert (msg, status) == ("out.pt: No space left on device", 2)
    assert describe_unexpected(KeyError("x"))[1] == 1


def test_broken_pipe_stops_quietly(monkeypatch, capsys):
    import io
    import sys

    @guarded
    def cmd():
        raise BrokenPipeError(errno.EPIPE, "Broken pipe")
    monkeypatch.setattr(sys, "stdout", io.StringIO())  # no real descriptor to point at /dev/null
    with pytest.raises(typer.Exit) as e:
        cmd()
    assert e.value.exit_code == 1 and capsys.readouterr().err == ""


def test_step_list_is_short(tmp_path, ckpt):
    d = tmp_path / "many"
    d.mkdir()
    for s in range(1, 21):
        for src in ckpt.iterdir():
            (d / src.name.replace("000001", f"{s:06d}")).symlink_to(src)
    with pytest.raises(UserError, match=r"present: 1, 2, 3, \.\.\., 18, 19, 20 \(20 steps\)"):
        load_checkpoint(d, step=99)


# -- atomic outputs ----------------------------------------------------------------------------------
def test_atomic_write_leaves_nothing_on_failure(tmp_path):
    target = tmp_path / "out.json"
    with pytest.raises(RuntimeError):
        with atomic_write(target) as f:
            f.write("partial")
            raise RuntimeError("boom")
    assert not target.exists() and not leftovers(tmp_path)
    target.write_text("old")
    with pytest.raises(RuntimeError):
        with atomic_write(target) as f:
            f.write("new, partial")
            raise RuntimeError("boom")
    assert target.read_text() == "old" and not leftovers(tmp_path)


def test_atomic_write_gives_normal_permissions(tmp_path):
    old = os.umask(0o022)
    try:
        with atomic_write(tmp_path / "a.json") as f:
            f.write("{}")
    finally:
        os.umask(old)
    assert (tmp_path / "a.json").stat().st_mode & 0o777 == 0o644  # not mkstemp's 0600


def _failing_after_partial_write(real_writer):
    def fail(obj, f, *a, **k):
        f.write(b"PK\x03\x04partial" if "b" in getattr(f, "mode", "b") else "{partial")
        raise OSError(errno.ENOSPC, "No space left on device")
    return fail


def test_compare_save_failing_midway_leaves_old_file(tmp_path, monkeypatch):
    out = tmp_path / "runs.pt"
    out.write_bytes(b"previous")
    monkeypatch.setattr(torch, "save", _failing_after_partial_write(torch.save))
    r = invoke(["compare", *FAST, "--schedules", "chunked", "--save", out], allowed=(2,))
    assert "No space left on device" in r.stderr
    assert out.read_bytes() == b"previous" and not leftovers(tmp_path)


def test_bench_output_failing_midway_leaves_nothing(tmp_path, monkeypatch):
    import smearcli.cli.commands.bench as bench_cmd

    out = tmp_path / "b.json"
    monkeypatch.setattr(bench_cmd.jsonsafe, "dump", _failing_after_partial_write(None))
    invoke(["bench", *FAST, "--schedules", "prefill", "--logic", "old", "--warmup", "0", "--repeats", "1",
            "--no-micro", "--no-peak", "--output", out], allowed=(2,))
    assert not out.exists() and not leftovers(tmp_path)


def test_plot_failing_midway_leaves_nothing(tmp_path, monkeypatch):
    from matplotlib.figure import Figure

    def savefig(self, f, *a, **k):
        f.write(b"\x89PNG partial")
        raise OSError(errno.ENOSPC, "No space left on device")
    monkeypatch.setattr(Figure, "savefig", savefig)
    out = tmp_path / "fig.png"
    invoke(["plot", *FAST, "--schedules", "chunked", "--out", out], allowed=(2,))
    assert not out.exists() and not leftovers(tmp_path)


# -- memory refused up front ---------------------------------------------------------------------------
CONFIGS = st.builds(
    lambda L, heads, per_head, V, pat: GPTConfig(sequence_len=64, vocab_size=V, n_layer=L, n_head=heads[0],
                                                 n_kv_head=heads[1], n_embd=heads[0] * per_head,
                                                 window_pattern=pat),
    st.integers(1, 5), st.sampled_from([(1, 1), (2, 1), (2, 2), (4, 1), (4, 2), (4, 4)]),
    st.sampled_from([24, 32]), st.integers(1, 300), st.sampled_from(["L", "SL", "SSSL"]),
)


@settings(max_examples=20, deadline=None, derandomize=True, database=None)
@given(CONFIGS)
def test_sizes_from_config_match_the_model(cfg):
    model = GPT(cfg)
    assert param_shapes(cfg) == {k: tuple(v.shape) for k, v in model.state_dict().items()}
    assert validate.param_count(cfg) == sum(p.numel() for p in model.parameters())


def test_checkpoint_too_large_is_refused_before_reading(tmp_path, ckpt, monkeypatch):
    monkeypatch.setattr(validate, "host_available", lambda: 100_000)  # 100 kB free
    monkeypatch.setattr(torch, "load", lambda *a, **k: pytest.fail("torch.load ran"))
    import json
    n = validate.param_count(GPTConfig.from_dict(json.loads((ckpt / "meta_000001.json").read_text())["model_config"]))
    with pytest.raises(UserError, match=rf"model_000001.pt: loading it \(.* of tensors, {n:,} parameters\) "
                                        r"needs about .* of memory, 97.7 KiB available"):
        load_checkpoint(ckpt)


def test_run_too_large_is_refused_before_any_input(monkeypatch):
    import smearcli.cli.build as setup

    cfg = random_config(1)
    room = validate.model_bytes(cfg) + (1 << 20)
    monkeypatch.setattr(validate, "host_available", lambda: room)
    monkeypatch.setattr(setup, "random_tokens", lambda *a, **k: pytest.fail("input generated"))
    r = invoke(["compare", "--depth", "1", "--seq-len", "512", "--batch", "64"], allowed=(2,))
    assert "the run (64 x 512 tokens" in r.stderr and "lower --seq-len" in r.stderr


def test_gpu_memory_is_checked_on_cuda(monkeypatch):
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (1 << 20, 80 << 30))
    monkeypatch.setattr(validate, "host_available", lambda: 1 << 40)
    with pytest.raises(UserError, match=r"needs about .* of GPU memory, 1.0 MiB available"):
        validate.check_model_memory(random_config(4), torch.device("cuda"))


def test_run_estimate_bounds_what_compare_keeps():
    """The estimate covers every tensor compare keeps, and is not absurdly above it."""
    from smearcli.measure.compare import compare
    from smearcli.measure.inputs import random_tokens
    from smearcli.measure.schedules import ScheduleOptions

    cfg = random_config(2)
    lm = random_model(cfg, seed=0)
    for B, T, scheds, S in [(1, 64, ["chunked", "engine"], 3), (2, 96, ["prefill", "decode"], 1)]:
        res = compare(lm.model, random_tokens(cfg, T, B), scheds, ["old", "fixed"],
                      ScheduleOptions(chunks=4, samples=S, gen_len=8))
        kept = 0
        for r in [res.reference, *res.runs]:
            kept += r.logits.numel() * 4 + sum(h.numel() * 4 for h in r.hiddens)
        est = validate.run_bytes(cfg, B, T, scheds, ["old", "fixed"], S, -(-T // 4), torch.float32)
        assert kept <= est - validate.RUN_OVERHEAD <= 10 * kept


def test_byte_sizes():
    assert [nbytes(n) for n in (0, 1023, 1536, 5 << 30, 3 << 60, 1 << 80)] == \
        ["0 B", "1023 B", "1.5 KiB", "5.0 GiB", "3.0 EiB", "1.05e+06 EiB"]


def test_unrunnable_dtype_is_refused(monkeypatch):
    import torch.nn.functional as F

    real = F.linear

    def linear(x, w, *a):
        if x.dtype == torch.bfloat16:
            raise NotImplementedError('"addmm" not implemented for \'BFloat16\'')
        return real(x, w, *a)
    monkeypatch.setattr(F, "linear", linear)
    monkeypatch.setattr(validate, "_PROBED", {})
    validate.check_dtype(torch.device("cpu"), torch.float32)
    with pytest.raises(UserError, match=r"^bfloat16: cpu cannot run it \(\"addmm\" not implemented"):
        validate.check_dtype(torch.device("cpu"), torch.bfloat16)


# -- transactional cache steps ---------------------------------------------------------------------------
_MODEL: dict = {}


def small_model():
    if "m" not in _MODEL:
        _MODEL["m"] = random_model(random_config(2, sequence_len=64), seed=5).model
    return _MODEL["m"]


def _snapshot(cache):
    pos = cache.get_pos()
    pe = None if cache.prev_embedding is None else cache.prev_embedding.clone()
    return pos, cache.seqlens.clone(), pe, cache.k[:, :, :pos].clone(), cache.v[:, :, :pos].clone()


def _same(a, b):
    assert a[0] == b[0] and torch.equal(a[1], b[1])
    assert (a[2] is None) == (b[2] is None) and (a[2] is None or torch.equal(a[2], b[2]))
    assert torch.equal(a[3], b[3]) and torch.equal(a[4], b[4])


@settings(max_examples=15, deadline=None, derandomize=True, database=None)
@given(st.lists(st.integers(1, 6), min_size=1, max_size=4), st.integers(1, 6),
       st.sampled_from(["block", "mlp", "head", "full", "rotary"]), st.integers(0, 1), st.sampled_from(["old", "fixed"]))
def test_failed_step_leaves_cache_as_before(before_steps, failing_len, where, layer, logic):
    model = small_model()
    T = sum(before_steps) + failing_len
    tokens = torch.randint(0, 256, (1, T), generator=torch.Generator().manual_seed(T))
    cap = T if where != "full" else sum(before_steps) + failing_len - 1
    cache = model.new_cache(1, cap)
    pos = 0
    for n in before_steps:
        model(tokens[:, pos:pos + n], cache=cache, smear=logic)
        pos += n
    snap = _snapshot(cache)
    step = tokens[:, pos:pos + failing_len]
    mp = pytest.MonkeyPatch()
    if where == "block":
        mp.setattr(model.transformer.h[layer].attn, "forward", lambda *a, **k: (_ for _ in ()).throw(RuntimeError("x")))
    elif where == "mlp":
        mp.setattr(model.transformer.h[layer].mlp, "forward", lambda *a, **k: (_ for _ in ()).throw(RuntimeError("x")))
    elif where == "head":
        mp.setattr(model.lm_head, "forward", lambda *a, **k: (_ for _ in ()).throw(RuntimeError("x")))
    elif where == "rotary":
        mp.setattr(type(model.config), "rotary_len", property(lambda self: pos))
    try:
        with pytest.raises((RuntimeError, CacheFullError, ValueError)):
            model(step, cache=cache, smear=logic)
    finally:
        mp.undo()
    _same(snap, _snapshot(cache))
    if where != "full":  # the caller recovers: the retried step gives what an unbroken run gives
        out = model(step, cache=cache, smear=logic)
        clean = model.new_cache(1, cap)
        p = 0
        for n in before_steps:
            model(tokens[:, p:p + n], cache=clean, smear=logic)
            p += n
        ref = model(step, cache=clean, smear=logic)
        assert torch.equal(out, ref)


def test_bad_arguments_are_refused_before_the_checkpoint_is_read(ckpt, monkeypatch):
    monkeypatch.setattr(torch, "load", lambda *a, **k: pytest.fail("the checkpoint was read"))
    for args, fragment in [(["--chunks", "0"], "--chunks"), (["--chunk-sizes", "8,4"], "sum to 12"),
                           (["--samples", "0"], "--samples"), (["--seed", "-1"], "--seed"),
                           (["--text", "a", "--tokens", "x.json"], "only one")]:
        r = invoke(["compare", "--seq-len", "16", "--checkpoint", ckpt, *args], allowed=(2,))
        assert fragment in r.stderr


@pytest.mark.parametrize("args", [
    ["compare", *FAST, "--save", "FILE/runs.pt"],
    ["plot", *FAST, "--out", "FILE/fig.png"],
    ["bench", *FAST, "--output", "FILE/deeper/b.json"],
    ["scan", "--only", "llama", "--out", "FILE/scan.jsonl"],
    ["scan", "--only", "llama", "--markdown", "FILE/census.md"],
], ids=lambda a: " ".join(a[-2:]))
def test_an_output_under_a_file_says_the_parent_is_a_file(tmp_path, monkeypatch, args):
    """`--save FILE/runs.pt`: FILE is there, a file; "directory FILE does not exist" was wrong."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "FILE").write_text("a file")
    r = invoke(args, allowed=(2,))
    flag = f"{args[-2]} " if args[0] == "scan" else ""
    assert r.stderr.strip() == f"smearcli: error: {flag}{args[-1]}: FILE is a file, not a directory", r.stderr
    assert sorted(os.listdir(tmp_path)) == ["FILE"] and (tmp_path / "FILE").read_text() == "a file"


def test_a_record_file_under_a_file_says_the_parent_is_a_file(tmp_path):
    from smearcli.census import records

    (tmp_path / "FILE").write_text("a file")
    with pytest.raises(UserError, match=f"^{tmp_path}/FILE/scan.jsonl: {tmp_path}/FILE is a file, not a directory$"):
        records.Sink(tmp_path / "FILE" / "scan.jsonl")
