"""A Hugging Face model directory is never trusted (smearcli.engines.transformers.loading and hf_files): no code
from it runs, no pickle in it is read, and every bad file is exit 2 with one line naming it, by
class: foreign code, JSON files, config values, safetensors headers, weights against the model.

Each bad directory is a tiny llama saved with save_pretrained, then corrupted. The classes run
in-process through `hf.load`; then every directory goes through the CLI in one subprocess that
holds its stdout and stderr file descriptors (transformers' logging writes to the real stderr)
and answers "y" on stdin to any prompt."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from conftest import ROOT  # noqa: E402 - the clone's root
import pytest

pytest.importorskip("transformers", reason="transformers is not installed: pip install 'smearcli[hf]'")

from hf_bad_dirs import ALL, CASES, ST, bad_dir, edit_config, good_dir, remote_code  # noqa: E402
from smearcli.util.errors import UserError  # noqa: E402
from smearcli.engines import transformers as hf
from smearcli.engines.transformers import files as hf_files  # noqa: E402


@pytest.fixture(scope="module")
def dirs(tmp_path_factory):
    """name -> a corrupted copy of a tiny llama directory (and "good", untouched)."""
    root = tmp_path_factory.mktemp("hfdirs")
    good = good_dir(root / "good")
    return {"good": good, **{name: bad_dir(good, root / name, name) for name in ALL}}


def check_refused(d: Path, name: str):
    _, fragment, names = ALL[name]
    with pytest.raises(UserError) as e:
        hf.load(str(d))
    msg = str(e.value)
    assert fragment in msg and names in msg and "\n" not in msg, msg
    assert not (d / "PWNED").exists()
    return msg


@pytest.mark.parametrize("name", CASES["foreign code"])
def test_foreign_code_never_runs(dirs, name):
    check_refused(dirs[name], name)


def test_auto_map_of_a_builtin_type_is_ignored_and_trust_remote_code_stays_off(dirs, tmp_path, monkeypatch):
    """A known model_type with an auto_map loads transformers' own class; the directory's .py never
    runs, and every transformers entry point is called with trust_remote_code=False."""
    import transformers as tf

    d = shutil.copytree(dirs["good"], tmp_path / "automap")
    remote_code(d)
    edit_config(lambda c: c.update(model_type="llama", architectures=["LlamaForCausalLM"]))(d)
    calls = []
    for cls, meth in ((tf.AutoConfig, "from_pretrained"), (tf.AutoModelForCausalLM, "from_pretrained"),
                      (tf.AutoModelForCausalLM, "from_config")):
        real = getattr(cls, meth)
        monkeypatch.setattr(cls, meth, lambda *a, _real=real, _m=meth, **k: (calls.append((_m, k)), _real(*a, **k))[1])
    log = tf.utils.logging
    before = log.get_verbosity(), log.is_progress_bar_enabled()
    model, info = hf.load(str(d))
    assert (log.get_verbosity(), log.is_progress_bar_enabled()) == before  # silenced while loading only
    assert type(model).__name__ == "LlamaForCausalLM" and not (d / "PWNED").exists()
    assert len(calls) == 3 and all(k.get("trust_remote_code") is False for _, k in calls), calls
    assert any("auto_map" in n and "modeling_evil.py" in n for n in info.notes), info.notes


@pytest.mark.parametrize("name", CASES["JSON files"])
def test_json_files_are_data_with_a_cap(dirs, name, monkeypatch):
    if name == "config_200mib":  # refused from its size: the file is never read
        monkeypatch.setattr(Path, "read_bytes", lambda self: pytest.fail(f"{self} was read"))
    check_refused(dirs[name], name)


@pytest.mark.parametrize("name", CASES["config values"])
def test_config_values_transformers_would_fail_on(dirs, name):
    check_refused(dirs[name], name)


@pytest.mark.parametrize("name", CASES["safetensors headers"])
def test_safetensors_headers_are_parsed_before_any_library_reads_them(dirs, name, monkeypatch):
    import safetensors

    monkeypatch.setattr(safetensors, "safe_open", lambda *a, **k: pytest.fail("safe_open reached"))
    check_refused(dirs[name], name)


@pytest.mark.parametrize("name", CASES["weights against the model"])
def test_weights_that_do_not_fit_the_model(dirs, name):
    check_refused(dirs[name], name)


def test_a_config_beyond_memory_is_refused_before_loading(dirs, tmp_path, monkeypatch):
    """40 layers in config.json, 2 in the weights: the model it describes is sized on the meta
    device and refused before transformers allocates it (2 MiB free, simulated)."""
    import smearcli.util.preflight as preflight

    monkeypatch.setattr(preflight, "host_available", lambda: 2 << 20)
    hf.load(str(dirs["good"]))  # 2 layers fit
    d = shutil.copytree(dirs["good"], tmp_path / "deep")
    edit_config(lambda c: c.__setitem__("num_hidden_layers", 40))(d)
    with pytest.raises(UserError, match=r"config.json's LlamaForCausalLM \([\d,]+ parameters\) needs about"):
        hf.load(str(d))


def test_good_directories_still_load(tmp_path):
    """The checks refuse none of what save_pretrained writes: shards with an index, tied embeddings
    (gemma3 saves no lm_head), bfloat16 weights; every tensor loads as it was saved."""
    import torch

    model = hf.tiny_model("gemma3")
    for name, dtype in (("sharded", torch.float32), ("bf16", torch.bfloat16)):
        model.to(dtype).save_pretrained(tmp_path / name, max_shard_size="100KB" if name == "sharded" else "5GB")
        loaded, info = hf.load(str(tmp_path / name))
        assert (tmp_path / name / "model.safetensors.index.json").exists() == (name == "sharded")
        assert info.dtype == str(dtype).removeprefix("torch.")
        saved, got = model.state_dict(), loaded.state_dict()
        assert saved.keys() == got.keys() and all(torch.equal(saved[k], got[k]) for k in saved), name


def test_header_parser_agrees_with_safetensors_on_a_good_file(dirs):
    """read_header's offsets and shapes are those the safetensors library reads."""
    from safetensors import safe_open

    tensors = hf_files.read_header(dirs["good"] / ST, ST)
    with safe_open(str(dirs["good"] / ST), framework="pt") as f:
        assert set(f.keys()) == set(tensors)
        for k in f.keys():  # noqa: SIM118 - a safe_open handle is not a dict
            t = f.get_tensor(k)
            _, shape, begin, end = tensors[k]
            assert tuple(t.shape) == shape and end - begin == t.numel() * t.element_size()


# -- through the CLI: exit 2, one line, nothing on stdout, whatever stdin holds -------------------------
DRIVER = r"""
import json, os, sys, tempfile
from smearcli.cli.app import app
results = {}
for name, d in json.loads(sys.argv[1]).items():
    out, err = tempfile.TemporaryFile(), tempfile.TemporaryFile()
    saved = os.dup(1), os.dup(2)
    os.dup2(out.fileno(), 1); os.dup2(err.fileno(), 2)
    try:
        app(["compare", "--impl", "hf", "--hf-model", d, "--seq-len", "8", "--chunks", "2", "--json", "--check"])
        code = 0
    except SystemExit as e:
        code = e.code
    finally:
        sys.stdout.flush(); sys.stderr.flush()
        os.dup2(saved[0], 1); os.dup2(saved[1], 2)
    out.seek(0); err.seek(0)
    results[name] = [code, out.read().decode(errors="replace"), err.read().decode(errors="replace")]
print(json.dumps(results))
"""


@pytest.mark.slow  # a subprocess of its own, seconds each (the fast loop leaves it out)
def test_every_bad_directory_through_the_cli(dirs, tmp_path):
    env = {**os.environ, "HF_MODULES_CACHE": str(tmp_path / "modules"), "HF_HUB_OFFLINE": "1",
           "PYTHONPATH": os.pathsep.join([str(ROOT)] + sys.path)}
    p = subprocess.run([sys.executable, "-c", DRIVER, json.dumps({n: str(dirs[n]) for n in ALL})],
                       input="y\n" * 50, capture_output=True, text=True, env=env, timeout=300, check=False)
    assert p.returncode == 0, p.stderr[-3000:]
    results = json.loads(p.stdout.strip().splitlines()[-1])
    for name, (code, out, err) in results.items():
        _, fragment, names = ALL[name]
        lines = err.strip().splitlines()
        assert code == 2 and out == "", (name, code, out, err)
        assert len(lines) == 1 and lines[0].startswith("smearcli: error: --hf-model "), (name, err)
        assert fragment in lines[0] and names in lines[0] and "internal error" not in lines[0], (name, err)
    assert not any((d / "PWNED").exists() for d in dirs.values()), "code from a model directory ran"
    assert not (tmp_path / "modules").exists() or not any((tmp_path / "modules").rglob("*evil*"))
