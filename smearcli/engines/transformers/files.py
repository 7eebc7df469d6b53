"""The files of a Hugging Face model directory, read as data before transformers sees them (for
`smearcli.engines.transformers.loading`; no transformers here).

- **JSON files** (config.json, generation_config.json, the index) are capped at the meta files'
  size (`checkpoint.META_MAX_BYTES`), checked before reading, nested at most `JSON_MAX_DEPTH`
  deep, without NaN, Infinity or a repeated key.
- **The config** (`check_config`): a `model_type`; an `auto_map` only for a model_type
  transformers has built in (its code is never run); sizes (`SIZE_KEYS`) positive integers; no
  `quantization_config`; no `attn_implementation` other than eager or sdpa.
- **Weights** (`weight_files`): `model.safetensors`, else the shards a
  `model.safetensors.index.json` names, each a `.safetensors` file in the directory (an index
  naming a `.bin` is refused: no pickle is read).
- **Each safetensors header is parsed here** (`read_header`): 8-byte little-endian length, a JSON
  object, known dtypes, byte ranges that match dtype x shape, lie inside the file and tile it
  without overlap or gap. Only then does the safetensors library read data (`check_weights`):
  every tensor float32, bfloat16, float16 or float64 (an int64 weight is refused, not cast) and
  finite (NaN or Inf is refused, as under --impl nanochat).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import torch

from ...gpt.checkpoint import META_MAX_BYTES, one_line_reason
from ...util.errors import UserError
from ...util.files import regular_file

JSON_MAX_BYTES = META_MAX_BYTES  # the same cap as a nanochat meta file: a config is kilobytes
JSON_MAX_DEPTH = 32  # real configs nest 3 or 4 levels (text_config -> rope_scaling)
HEADER_MAX_BYTES = 100 << 20  # the safetensors format's own limit on its JSON header
CONFIG, INDEX, SINGLE, GENERATION = ("config.json", "model.safetensors.index.json", "model.safetensors",
                                     "generation_config.json")
ATTENTION_OK = ("eager", "sdpa")
# config fields that size the model: a positive integer (or null) wherever they appear
SIZE_KEYS = frozenset({"num_hidden_layers", "hidden_size", "intermediate_size", "num_attention_heads",
                       "num_key_value_heads", "vocab_size", "head_dim", "max_position_embeddings",
                       "n_layer", "n_head", "n_embd", "n_positions", "num_layers", "d_model", "state_size",
                       "num_heads", "conv_kernel"})
SIZE_MAX = 1 << 31
# safetensors dtype -> (bytes per element, torch's name); the first four are the floats a model may hold
DTYPES = {"F32": (4, "float32"), "BF16": (2, "bfloat16"), "F16": (2, "float16"), "F64": (8, "float64"),
          **{f"{k}{b}": (b // 8, f"{n}{b}") for k, n in (("I", "int"), ("U", "uint")) for b in (8, 16, 32, 64)},
          "BOOL": (1, "bool"), "F8_E4M3": (1, "float8_e4m3fn"), "F8_E5M2": (1, "float8_e5m2"),
          "E8M0": (1, "float8_e8m0")}
FLOATS = ("F32", "BF16", "F16", "F64")


# -- JSON files -------------------------------------------------------------------------------------
def _no_constant(name: str):
    raise ValueError(f"{name} is not a JSON number")


def _no_duplicates(pairs):
    out = {}
    for k, v in pairs:
        if k in out:
            raise ValueError(f"key {k!r} appears twice")
        out[k] = v
    return out


def _depth(value) -> int:
    """How deep `value` nests (iteratively: a deep value must not overflow the stack here)."""
    deepest, todo = 0, [(value, 1)]
    while todo:
        v, d = todo.pop()
        if isinstance(v, (dict, list)):
            deepest = max(deepest, d)
            todo.extend((x, d + 1) for x in (v.values() if isinstance(v, dict) else v))
    return deepest


def parse_json(data: bytes, name: str):
    """JSON text as data: not UTF-8, invalid, too deep, NaN/Infinity or duplicate keys are refused."""
    try:
        value = json.loads(data.decode("utf-8"), parse_constant=_no_constant, object_pairs_hook=_no_duplicates)
    except UnicodeDecodeError as e:
        raise UserError(f"{name}: not UTF-8 text (byte {e.start})") from None
    except json.JSONDecodeError as e:
        raise UserError(f"{name}: invalid JSON ({e.msg} at line {e.lineno} column {e.colno})") from None
    except RecursionError:
        raise UserError(f"{name}: invalid JSON (nested too deeply)") from None
    except ValueError as e:  # NaN, a repeated key, an integer beyond Python's digit limit
        raise UserError(f"{name}: invalid JSON ({one_line_reason(e)})") from None
    if _depth(value) > JSON_MAX_DEPTH:
        raise UserError(f"{name}: nested more than {JSON_MAX_DEPTH} levels deep; not a model configuration")
    return value


def read_json(path: Path, name: str) -> dict:
    """A JSON object from a file of at most JSON_MAX_BYTES (the size checked before reading)."""
    size = regular_file(path, name)
    if size > JSON_MAX_BYTES:
        raise UserError(f"{name}: {size:,} bytes is too large for a JSON file of a model directory "
                        f"(at most {JSON_MAX_BYTES >> 20} MiB)")
    try:
        data = path.read_bytes()
    except OSError as e:
        raise UserError(f"{name}: cannot read ({e.strerror or e})") from None
    value = parse_json(data, name)
    if not isinstance(value, dict):
        kind = "a list" if isinstance(value, list) else "a string" if isinstance(value, str) else "a scalar"
        raise UserError(f"{name}: expected a JSON object, got {kind}")
    return value


def _dicts(value, where: str = ""):
    """(where, dict) for `value` and every dict inside it."""
    todo = [(where, value)]
    while todo:
        w, v = todo.pop()
        if isinstance(v, dict):
            yield w, v
            todo.extend((f"{w}.{k}" if w else str(k), x) for k, x in v.items())
        elif isinstance(v, list):
            todo.extend((f"{w}[{i}]", x) for i, x in enumerate(v))


def check_config(cfg: dict, name: str, known_types) -> list[str]:
    """Refuse what transformers would fail on, or would need foreign code or kernels for; returns
    notes on what was ignored (an auto_map of a built-in model_type)."""
    mt = cfg.get("model_type")
    if not isinstance(mt, str) or not mt:
        raise UserError(f"{name}: no model_type (a string naming the architecture, such as \"llama\")")
    notes = []
    auto_map = cfg.get("auto_map")
    if auto_map is not None:
        targets = auto_map.values() if isinstance(auto_map, dict) else [auto_map]
        code = ", ".join(sorted({str(t).split("--")[-1].split(".")[0] + ".py" for t in targets
                                 if isinstance(t, str)})) or json.dumps(auto_map)
        if mt not in known_types:
            raise UserError(f"{name}: model_type {mt!r} is not built into the installed transformers, and "
                            f"auto_map points at the directory's own code ({code}); "
                            "smearcli never runs code from a model directory (trust_remote_code stays off)")
        notes.append(f"{name}'s auto_map ({code}) ignored: transformers' built-in {mt} code ran")
    for where, d in _dicts(cfg):
        at = f" ({where})" if where else ""
        q = d.get("quantization_config")
        if q is not None:
            method = q.get("quant_method", "unknown method") if isinstance(q, dict) else q
            raise UserError(f"{name}: quantization_config{at} asks for {method} quantized weights; smearcli "
                            "compares float models: use the unquantized weights")
        for key in ("attn_implementation", "_attn_implementation"):
            a = d.get(key)
            if a is not None and a not in ATTENTION_OK:
                raise UserError(f"{name}: {key}{at} is {a!r}; smearcli runs transformers' own "
                                f"{' or '.join(ATTENTION_OK)} attention (kernel packages are not loaded): "
                                "remove the field")
        for key in SIZE_KEYS & d.keys():
            v = d[key]
            if v is not None and (type(v) is not int or not 0 < v <= SIZE_MAX):
                raise UserError(f"{name}: {where + '.' if where else ''}{key} is {json.dumps(v)}, "
                                "expected a positive integer")
    return notes


def listed(keys, n: int = 4) -> str:
    keys = sorted(keys)
    return ", ".join(keys[:n]) + (f", ... ({len(keys)} in all)" if len(keys) > n else "")


# -- safetensors ------------------------------------------------------------------------------------
def read_header(path: Path, name: str) -> dict[str, tuple[str, tuple, int, int]]:
    """A safetensors file's tensors, name -> (dtype, shape, begin, end), from its header alone,
    after checking that the header describes the file exactly (no byte of data is read)."""
    size = regular_file(path, name)
    if size < 8:
        raise UserError(f"{name}: {size} bytes, too short for a safetensors file")
    try:
        with open(path, "rb") as f:
            n = int.from_bytes(f.read(8), "little")
            if n > size - 8:
                raise UserError(f"{name}: its header claims {n:,} bytes but the file holds only {size - 8:,} "
                                "after the length: truncated, or not a safetensors file")
            if n > HEADER_MAX_BYTES:
                raise UserError(f"{name}: a header of {n:,} bytes, beyond the format's limit of "
                                f"{HEADER_MAX_BYTES >> 20} MiB")
            raw = f.read(n)
    except OSError as e:
        raise UserError(f"{name}: cannot read ({e.strerror or e})") from None
    header = parse_json(raw, f"{name} (header)")
    if not isinstance(header, dict):
        raise UserError(f"{name}: the header is not a JSON object")
    data_len = size - 8 - n
    tensors = {}
    for k, v in header.items():
        if k == "__metadata__":
            if v is not None and not (isinstance(v, dict) and all(isinstance(x, str) for x in v.values())):
                raise UserError(f"{name}: __metadata__ must map names to strings")
            continue
        if not isinstance(v, dict) or set(v) != {"dtype", "shape", "data_offsets"}:
            raise UserError(f"{name}: {k} is not described by dtype, shape and data_offsets")
        dtype, shape, offs = v["dtype"], v["shape"], v["data_offsets"]
        if dtype not in DTYPES:
            raise UserError(f"{name}: {k} has an unknown dtype {dtype!r}")
        if not isinstance(shape, list) or not all(type(d) is int and d >= 0 for d in shape):
            raise UserError(f"{name}: {k} has shape {json.dumps(shape)}, not a list of sizes")
        if not (isinstance(offs, list) and len(offs) == 2 and all(type(o) is int for o in offs)
                and 0 <= offs[0] <= offs[1] <= data_len):
            raise UserError(f"{name}: {k} has data_offsets {json.dumps(offs)}, outside the file's "
                            f"{data_len:,} bytes of data")
        need = math.prod(shape) * DTYPES[dtype][0]
        if offs[1] - offs[0] != need:
            raise UserError(f"{name}: {k} spans {offs[1] - offs[0]:,} bytes, but {dtype} of shape "
                            f"{tuple(shape)} needs {need:,}")
        tensors[k] = (dtype, tuple(shape), offs[0], offs[1])
    at, prev = 0, None
    for k, (_, _, begin, end) in sorted(tensors.items(), key=lambda kv: kv[1][2:]):
        if begin < at:
            raise UserError(f"{name}: the bytes of {k} overlap those of {prev}")
        if begin > at:
            raise UserError(f"{name}: {begin - at:,} unused bytes before {k}; not a well-formed safetensors file")
        at, prev = end, k
    if at != data_len:
        raise UserError(f"{name}: {data_len - at:,} bytes after the last tensor; not a well-formed safetensors file")
    return tensors


def weight_files(path: Path) -> tuple[list[Path], dict]:
    """The safetensors files transformers would read (model.safetensors first, as it does, else the
    index's shards) and the index's weight_map ({} without one); a directory without them, or an
    index naming anything else, is refused."""
    if (path / SINGLE).exists() or (path / SINGLE).is_symlink():
        return [path / SINGLE], {}
    if not (path / INDEX).exists():
        bins = sorted(p.name for p in path.glob("*.bin"))
        if bins:
            raise UserError(f"{path} holds only pickled weights ({', '.join(bins[:3])}); smearcli loads "
                            "safetensors only, since unpickling can run code: convert the weights to "
                            "safetensors (save_pretrained writes them by default)")
        loose = sorted(p.name for p in path.glob("*.safetensors"))
        held = (f" ({', '.join(loose[:3])} without the {INDEX} that names the shards)" if loose else
                f" (neither {SINGLE} nor {INDEX})")
        raise UserError(f"{path} has no safetensors weights{held}; save the model there with "
                        "save_pretrained, which writes them")
    index = read_json(path / INDEX, str(path / INDEX))
    wmap = index.get("weight_map")
    if not isinstance(wmap, dict) or not wmap or not all(isinstance(v, str) for v in wmap.values()):
        raise UserError(f"{path / INDEX}: no weight_map from tensor names to shard files")
    shards = []
    for shard in sorted(set(wmap.values())):
        if Path(shard).name != shard or shard in (".", ".."):
            raise UserError(f"{path / INDEX}: shard {shard!r} is not a file in the model directory")
        if not shard.endswith(".safetensors"):
            raise UserError(f"{path / INDEX}: shard {shard} is not a .safetensors file; smearcli never reads pickled "
                            "weights (unpickling can run code): convert the weights to safetensors")
        shards.append(path / shard)
    return shards, wmap


def check_weights(files: list[Path], wmap: dict) -> dict[str, tuple[str, tuple, int]]:
    """Every tensor's header (and the index's `wmap` against them), then its values: float and
    finite. name -> (file, shape, bytes per element)."""
    from safetensors import safe_open

    found: dict[str, tuple[str, tuple, int]] = {}
    headers = {f: read_header(f, str(f)) for f in files}  # every header before any data
    for f, tensors in headers.items():
        for k, (dtype, shape, _, _) in tensors.items():
            if dtype not in FLOATS:
                raise UserError(f"{f}: {k} is {DTYPES[dtype][1]}, expected float weights "
                                f"({', '.join(DTYPES[d][1] for d in FLOATS)}); "
                                "transformers would cast it silently")
            if k in found:
                raise UserError(f"{f}: {k} is also in {found[k][0]}")
            found[k] = (str(f), shape, DTYPES[dtype][0])
    absent = [k for k, shard in wmap.items() if k not in found or Path(found[k][0]).name != shard]
    if absent:
        raise UserError(f"{files[0].parent / INDEX}: names tensors its shards do not hold ({listed(absent)})")
    for f, tensors in headers.items():
        with safe_open(str(f), framework="pt") as st:
            for k in tensors:
                t = st.get_tensor(k)
                bad = int(t.numel() - torch.isfinite(t).sum())
                if bad:
                    raise UserError(f"{f}: {k} contains NaN or Inf ({bad:,} of {t.numel():,} values); "
                                    "refusing to run on it")
    return found
