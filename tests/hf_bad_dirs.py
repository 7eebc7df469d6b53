"""Bad Hugging Face model directories, by class, for tests/impls/test_hf_load.py and the errors table:
a tiny llama saved with save_pretrained (`good_dir`), then corrupted in place by one of `CASES`."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch

from hardening_util import malicious_torch_file
from smearcli.gpt.checkpoint import META_MAX_BYTES

ST = "model.safetensors"


def good_dir(d: Path) -> Path:
    """A tiny random llama (smearcli's built-in config), saved with save_pretrained into `d`."""
    from smearcli.engines import transformers as hf

    hf.tiny_model("llama").save_pretrained(d)
    return d


def bad_dir(src: Path, d: Path, name: str) -> Path:
    """A copy of the good directory `src` at `d`, corrupted by the case `name`."""
    shutil.copytree(src, d)
    ALL[name][0](d)
    return d


# -- corruptions ----------------------------------------------------------------------------------
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
    marker = str(d / "PWNED")
    for name in ("configuration_evil.py", "modeling_evil.py"):
        (d / name).write_text(MODULE_CODE.format(marker=marker) + "class EvilConfig: pass\nclass EvilLM: pass\n")
    edit_config(lambda c: c.update(model_type="evilmodel", architectures=["EvilLM"],
                                   auto_map={"AutoConfig": "configuration_evil.EvilConfig",
                                             "AutoModelForCausalLM": "modeling_evil.EvilLM"}))(d)


def index_to_bin(d: Path):
    header, _ = st_parts(d / ST)
    (d / ST).unlink()
    shard = "pytorch_model-00001-of-00001.bin"
    malicious_torch_file(d / shard, d / "PWNED")
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
                  "model.norm.weight is int64", ST),
        "nan": (edit_weights(poke(float("nan"))), "contains NaN or Inf (2 of 8,192", ST),
        "inf": (edit_weights(poke(float("-inf"))), "contains NaN or Inf (2 of 8,192", ST),
        "index_absent": (index_names_absent, "model.layers.9.mlp.up_proj.weight", "model.safetensors.index.json"),
    },
}
ALL = {name: case for group in CASES.values() for name, case in group.items()}
