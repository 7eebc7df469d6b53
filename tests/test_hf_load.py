"""A Hugging Face model directory is never trusted (smearcli.impls.hf_load): no code from it runs,
no pickle in it is read, and every bad file is exit 2 with one line naming it, by class:
foreign code, JSON files, config values, safetensors headers, weights against the model.

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

import pytest
import torch

pytest.importorskip("transformers", reason="transformers is not installed: pip install 'smearcli[hf]'")

from hardening_util import malicious_torch_file  # noqa: E402
from smearcli.checkpoint import META_MAX_BYTES  # noqa: E402
from smearcli.errors import UserError  # noqa: E402
from smearcli.impls import hf, hf_load  # noqa: E402

ST = "model.safetensors"


# -- building bad directories -------------------------------------------------------------------------
def st_parts(path: Path) -> tuple[dict, bytes]:
    data = path.read_bytes()
    n = int.from_bytes(data[:8], "little")
    return json.loads(data[8:8 + n]), data[8 + n:]


def st_write(path: Path, header: dict, body: bytes, length: int | None = None) -> None:
    h = json.dumps(header).encode()
    path.write_bytes((len(h) if length is None else length).to_bytes(8, "little") + h + body)


def edit_config(fn):
    def edit(d: Path):
        cfg = json.loads((d / "config.json").read_text())
        out = fn(cfg)
        (d / "config.json").write_text(json.dumps(out if isinstance(out, dict) else cfg))
    return edit


def edit_weights(fn):
    from safetensors.torch import load_file, save_file

    def edit(d: Path):
        sd = load_file(d / ST)
        fn(sd)
        save_file(sd, d / ST, metadata={"format": "pt"})
    return edit


def edit_header(fn):
    def edit(d: Path):
        header, body = st_parts(d / ST)
        fn(header)
        st_write(d / ST, header, body)
    return edit


def two_same_size(header: dict) -> tuple[str, str]:
    a, b = sorted(k for k in header if k.endswith("layernorm.weight"))[:2]
    return a, b


def overlap(header):
    a, b = two_same_size(header)
    header[b]["data_offsets"] = header[a]["data_offsets"]


def header_too_long(d: Path):
    header, body = st_parts(d / ST)
    st_write(d / ST, header, body, length=(d / ST).stat().st_size * 2)


def nested(depth):
    return lambda d: (d / "config.json").write_text("[" * depth + "]" * depth)


def huge_config(d: Path):
    with open(d / "config.json", "r+b") as f:  # sparse: 200 MiB on disk costs nothing
        f.truncate(200 << 20)


def deep_object(d: Path):
    cfg = json.loads((d / "config.json").read_text())
    x = cfg["rope_parameters"]
    for _ in range(40):
        x["more"] = {}
        x = x["more"]
    (d / "config.json").write_text(json.dumps(cfg))


MODULE_CODE = "open({marker!r}, 'w').write('ran')\n"


def remote_code(d: Path):
    """An unknown model_type whose auto_map names .py files in the directory; importing either
    writes the marker."""
    marker = str(d / "RAN")
    for name in ("configuration_evil.py", "modeling_evil.py"):
        (d / name).write_text(MODULE_CODE.format(marker=marker) + "class EvilConfig: pass\nclass EvilLM: pass\n")
    edit_config(lambda c: c.update(model_type="evilmodel", architectures=["EvilLM"],
                                   auto_map={"AutoConfig": "configuration_evil.EvilConfig",
                                             "AutoModelForCausalLM": "modeling_evil.EvilLM"}))(d)


def index_to_bin(d: Path):
    header, _ = st_parts(d / ST)
    (d / ST).unlink()
    shard = "pytorch_model-00001-of-00001.bin"
    malicious_torch_file(d / shard, d / "RAN")
    (d / "model.safetensors.index.json").write_text(json.dumps(
        {"metadata": {}, "weight_map": {k: shard for k in header if k != "__metadata__"}}))


def index_names_absent(d: Path):
    header, _ = st_parts(d / ST)
    shard = "model-00001-of-00001.safetensors"
    (d / ST).rename(d / shard)
    wmap = {k: shard for k in header if k != "__metadata__"}
    wmap["model.layers.9.mlp.up_proj.weight"] = shard
    (d / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": wmap}))


def drop_layer(sd):
    for k in [k for k in sd if k.startswith("model.layers.1.")]:
        del sd[k]


def poke(value):
    def fn(sd):
        sd["model.layers.0.mlp.up_proj.weight"][3, :2] = value
    return fn


# name -> (corruption, fragment of the message, the file the message names)
CASES = {
    "foreign code": {
        "remote_code": (remote_code, "never runs code from a model directory", "config.json"),
        "index_to_bin": (index_to_bin, "is not a .safetensors file", "model.safetensors.index.json"),
        "adapter": (lambda d: (d / "adapter_config.json").write_text("{}"), "PEFT adapter", "adapter_config.json"),
    },
    "JSON files": {
        "nested_100k": (nested(100_000), "nested too deeply", "config.json"),
        "deep_object": (deep_object, "nested more than 32 levels", "config.json"),
        "config_200mib": (huge_config, f"at most {META_MAX_BYTES >> 20} MiB", "config.json"),
        "nan_literal": (lambda d: (d / "config.json").write_text('{"model_type": "llama", "rms_norm_eps": NaN}'),
                        "NaN is not a JSON number", "config.json"),
        "not_object": (lambda d: (d / "config.json").write_text("[1, 2]"), "expected a JSON object", "config.json"),
        "generation_invalid": (lambda d: (d / "generation_config.json").write_text("{"), "invalid JSON",
                               "generation_config.json"),
    },
    "config values": {
        "bitsandbytes": (edit_config(lambda c: c.__setitem__(
            "quantization_config", {"quant_method": "bitsandbytes", "load_in_4bit": True})),
            "bitsandbytes quantized", "config.json"),
        "flash_attention_2": (edit_config(lambda c: c.__setitem__("attn_implementation", "flash_attention_2")),
                              "'flash_attention_2'", "config.json"),
        "layers_two": (edit_config(lambda c: c.__setitem__("num_hidden_layers", "two")),
                       'num_hidden_layers is "two"', "config.json"),
        "layers_negative": (edit_config(lambda c: c.__setitem__("num_hidden_layers", -1)),
                            "num_hidden_layers is -1", "config.json"),
        "hidden_bool": (edit_config(lambda c: c.__setitem__("hidden_size", True)), "hidden_size is true",
                        "config.json"),
        "no_model_type": (edit_config(lambda c: c.pop("model_type")), "no model_type", "config.json"),
        "unknown_model_type": (edit_config(lambda c: c.__setitem__("model_type", "nosuchmodel")),
                               "transformers cannot read it", "config.json"),
    },
    "safetensors headers": {
        "header_too_long": (header_too_long, "truncated, or not a safetensors file", ST),
        "overlap": (edit_header(overlap), "overlap", ST),
        "beyond_file": (edit_header(lambda h: h[two_same_size(h)[0]].__setitem__("data_offsets", [0, 1 << 40])),
                        "outside the file", ST),
        "bytes_vs_shape": (edit_header(lambda h: h[two_same_size(h)[0]].__setitem__("shape", [65])),
                           "needs 260", ST),
        "unknown_dtype": (edit_header(lambda h: h[two_same_size(h)[0]].__setitem__("dtype", "F12")),
                          "unknown dtype", ST),
        "too_short": (lambda d: (d / ST).write_bytes(b"\x01\x02"), "too short", ST),
        "header_garbage": (lambda d: (d / ST).write_bytes((4).to_bytes(8, "little") + b"\xff\xfe{[" + b"\0" * 8),
                           "not UTF-8", ST),
    },
    "weights against the model": {
        "missing_layer": (edit_weights(drop_layer), "initialise them at random", "model.layers.1."),
        "unexpected_key": (edit_weights(lambda sd: sd.__setitem__("model.extra.weight", torch.zeros(3))),
                           "model.extra.weight", "does not have"),
        "wrong_shape": (edit_weights(lambda sd: sd.__setitem__("model.norm.weight", torch.zeros(65))),
                        "model.norm.weight has shape (65,)", ST),
        "int64": (edit_weights(lambda sd: sd.__setitem__("model.norm.weight", torch.ones(64, dtype=torch.int64))),
                  "model.norm.weight is I64", ST),
        "nan": (edit_weights(poke(float("nan"))), "contains NaN or Inf (2 of 8,192", ST),
        "inf": (edit_weights(poke(float("-inf"))), "contains NaN or Inf (2 of 8,192", ST),
        "index_absent": (index_names_absent, "model.layers.9.mlp.up_proj.weight", "model.safetensors.index.json"),
    },
}
ALL = {name: case for group in CASES.values() for name, case in group.items()}


@pytest.fixture(scope="module")
def dirs(tmp_path_factory):
    """name -> a corrupted copy of a tiny llama directory (and "good", untouched)."""
    root = tmp_path_factory.mktemp("hfdirs")
    good = root / "good"
    hf.tiny_model("llama").save_pretrained(good)
    out = {"good": good}
    for name, (corrupt, _, _) in ALL.items():
        out[name] = shutil.copytree(good, root / name)
        corrupt(out[name])
    return out


def check_refused(d: Path, name: str):
    _, fragment, names = ALL[name]
    with pytest.raises(UserError) as e:
        hf.load(str(d))
    msg = str(e.value)
    assert fragment in msg and names in msg and "\n" not in msg, msg
    assert not (d / "RAN").exists()
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
    model, info = hf.load(str(d))
    assert type(model).__name__ == "LlamaForCausalLM" and not (d / "RAN").exists()
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


def test_header_parser_agrees_with_safetensors_on_a_good_file(dirs):
    """read_header's offsets and shapes are those the safetensors library reads."""
    from safetensors import safe_open

    tensors = hf_load.read_header(dirs["good"] / ST, ST)
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


def test_every_bad_directory_through_the_cli(dirs, tmp_path):
    env = {**os.environ, "HF_MODULES_CACHE": str(tmp_path / "modules"), "HF_HUB_OFFLINE": "1",
           "PYTHONPATH": os.pathsep.join([str(Path(__file__).resolve().parents[1])] + sys.path)}
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
    assert not any((d / "RAN").exists() for d in dirs.values()), "code from a model directory ran"
    assert not (tmp_path / "modules").exists() or not any((tmp_path / "modules").rglob("*evil*"))
