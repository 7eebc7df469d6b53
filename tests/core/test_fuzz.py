"""Fuzzing the CLI: hypothesis-generated argument lists and corrupted checkpoint directories.

Whatever the input, smearcli must exit 0, 1 (only under --check) or 2, never print a traceback
or an "internal error", print exactly one error line on failure, and never leave a partial
output file (a --save/--output/--out target either does not exist or loads completely).
Examples are few and models tiny (depth 1, 16 tokens) so the whole file runs in well under a
minute; the examples are derandomized so every run checks the same ones.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hardening_util import (META, PT, Payload, invoke, leftovers, malicious_pickle, write_checkpoint)

# SMEARCLI_FUZZ_EXAMPLES=500 runs a longer, randomized hunt (what was done before committing)
_LONG = int(os.environ.get("SMEARCLI_FUZZ_EXAMPLES", "0"))
FUZZ = settings(max_examples=_LONG or 30, deadline=None, derandomize=not _LONG, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

_GOOD: dict = {}


def good_checkpoint() -> Path:
    """One valid depth-1 checkpoint for the whole module (written once, copied per example)."""
    if "dir" not in _GOOD:
        root = Path(tempfile.mkdtemp(prefix="smearcli-fuzz-"))
        _GOOD["dir"] = write_checkpoint(root / "good")
    return _GOOD["dir"]


# -- argument lists ------------------------------------------------------------------------------
INTS = st.one_of(st.sampled_from(["0", "1", "2", "3", "-1", "16", "17", "99999999999999999999999"]),
                 st.integers(-3, 20).map(str))
TEXT = st.text(alphabet=st.characters(codec="utf-8", exclude_categories=["Cs"]), max_size=12)
VALUES = {
    "--depth": st.sampled_from(["1", "0", "-2", "x", "100000"]),
    "--seq-len": st.sampled_from(["16", "8", "2", "1", "0", "-4", "5121", "1000000000000", "abc"]),
    "--batch": st.sampled_from(["1", "2", "0", "-1", "100000000"]),
    "--seed": st.sampled_from(["0", "7", "-1", "18446744073709551616", "1e3"]),
    "--chunks": INTS,
    "--chunk-sizes": st.one_of(st.sampled_from(["8,8", "16", "1,15", "0,16", "8,-8,16", "a,b", "", ",", "8,8,"]),
                               st.lists(st.integers(-2, 17), min_size=1, max_size=5).map(lambda v: ",".join(map(str, v)))),
    "--samples": INTS,
    "--gen-len": INTS,
    "--draft": INTS,
    "--schedules": st.one_of(st.sampled_from(["chunked", "decode,chunked", "engine", "speculative", "full",
                                              "", "nope", "chunked,,prefill", "engine,engine"]),
                             TEXT),
    "--logic": st.sampled_from(["old", "fixed", "both", "new", ""]),
    "--dtype": st.sampled_from(["float32", "bfloat16", "float16", "auto", "float64"]),
    "--device": st.sampled_from(["cpu", "auto", "cuda", "mps", "tpu"]),
    "--tolerance": st.sampled_from(["10", "1e-30", "0", "-1", "nan", "inf", "x"]),
    "--step": st.sampled_from(["1", "0", "-1", "x"]),
    "--text": TEXT,
    "--model": st.sampled_from(["random", "nope"]),
    "--threads": st.sampled_from(["1", "0", "100000", "99999999999999999999"]),  # bench's own
}
FLAGS = ["--json", "--check", "--no-json", "--help", "--frobnicate"]
FILES = ["--tokens", "--save", "--checkpoint", "--text-file"]


def token_file(d: Path, kind: str) -> Path:
    p = d / {"ok": "ids.json", "bad_id": "ids.json", "garbage": "ids.json", "ragged": "ids.json",
             "evil": "ids.pt", "tensor": "ids.pt", "float": "ids.pt", "missing": "nope.json",
             "deep": "ids.json", "empty": "ids.json"}[kind]
    if kind == "ok":
        p.write_text(json.dumps(list(range(1, 17))))
    elif kind == "bad_id":
        p.write_text(json.dumps([1, 2, 3, 2**70]))
    elif kind == "garbage":
        p.write_bytes(b"\xff\x00[1,")
    elif kind == "ragged":
        p.write_text(json.dumps([[1, 2], [3]]))
    elif kind == "deep":
        p.write_text("[" * 50000 + "]" * 50000)
    elif kind == "empty":
        p.write_text("[]")
    elif kind == "evil":
        torch.save({"x": Payload(d / "PWNED")}, p)
    elif kind == "tensor":
        torch.save(torch.arange(12).view(2, 6), p)
    elif kind == "float":
        torch.save(torch.rand(10), p)
    return p


@st.composite
def arg_lists(draw):
    command = draw(st.sampled_from(["compare"] * 6 + ["plot", "bench"]))
    args = [command, "--depth", "1", "--seq-len", "16", "--gen-len", "4"]
    if command == "bench":
        args += ["--warmup", "0", "--repeats", "1", "--no-micro", "--no-peak"]
    files = {}
    for _ in range(draw(st.integers(0, 4))):
        kind = draw(st.sampled_from(["value", "value", "value", "flag", "file", "junk"]))
        if kind == "value":
            opt = draw(st.sampled_from(sorted(VALUES)))
            args += [opt, draw(VALUES[opt])]
        elif kind == "flag" and command == "compare":
            args.append(draw(st.sampled_from(FLAGS)))
        elif kind == "file":
            opt = draw(st.sampled_from(FILES))
            if opt == "--tokens":
                files["tokens"] = draw(st.sampled_from(["ok", "bad_id", "garbage", "ragged", "evil", "tensor",
                                                        "float", "missing", "deep", "empty"]))
            elif opt == "--save" and command == "compare":
                files["save"] = draw(st.sampled_from(["out.pt", "nodir/out.pt", "out.txt", ".", "out.PT"]))
            elif opt == "--checkpoint":
                files["checkpoint"] = draw(st.sampled_from(["good", "missing", "empty"]))
            elif opt == "--text-file":
                files["text_file"] = draw(st.sampled_from(["text.txt", "nope.txt"]))
        elif kind == "junk":
            args.append(draw(st.sampled_from(["--", "-x", "extra", "--seq-len=", "--chunks=2", "-h"])))
    if command == "plot":
        files["out"] = draw(st.sampled_from(["fig.png", "fig.svg", "fig.bmp", "nodir/fig.png"]))
    if command == "bench" and draw(st.booleans()):
        files["output"] = draw(st.sampled_from(["b.json", "b.txt", "nodir/b.json"]))
    return args, files


def materialize(args: list, files: dict, d: Path) -> tuple[list, list]:
    """Create the files an argument list names; return the full list and the outputs to check."""
    args, outputs = list(args), []
    if "tokens" in files:
        args += ["--tokens", str(token_file(d, files["tokens"]))]
    if "checkpoint" in files:
        name = files["checkpoint"]
        if name == "good":
            shutil.copytree(good_checkpoint(), d / "good")
        elif name == "empty":
            (d / "empty").mkdir()
        args += ["--checkpoint", str(d / name)]
    if "text_file" in files:
        if files["text_file"] == "text.txt":
            (d / "text.txt").write_text("hello, world; héllo")
        args += ["--text-file", str(d / files["text_file"])]
    for key, flag in (("save", "--save"), ("out", "--out"), ("output", "--output")):
        if key in files:
            out = d / files[key]
            args += [flag, str(out)]
            outputs.append(out)
    return args, outputs


def check_outputs(outputs: list[Path], d: Path) -> None:
    assert not leftovers(d), leftovers(d)
    assert not (d / "PWNED").exists(), "a pickle payload ran"
    for out in outputs:
        if out.is_file():  # complete, or not there at all
            if out.suffix.lower() == ".pt":
                torch.load(out, weights_only=True)
            elif out.suffix == ".json":
                json.loads(out.read_text())
            elif out.suffix == ".png":
                assert out.read_bytes().startswith(b"\x89PNG") and out.read_bytes().endswith(b"IEND\xaeB`\x82")
            elif out.suffix == ".svg":
                assert out.read_text().rstrip().endswith("</svg>")


@FUZZ
@given(arg_lists())
def test_cli_arguments_never_crash(case):
    args, files = case
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp)
        full, outputs = materialize(args, files, d)
        allowed = (0, 1, 2) if "--check" in full else (0, 2)
        invoke(full, allowed=allowed)
        check_outputs(outputs, d)


# -- corrupted checkpoint directories --------------------------------------------------------------
JSON_VALUES = st.recursive(st.none() | st.booleans() | st.integers(-2**70, 2**70) | st.floats() | TEXT,
                           lambda inner: st.lists(inner, max_size=3) | st.dictionaries(TEXT, inner, max_size=3),
                           max_leaves=6)
CONFIG_KEYS = ["sequence_len", "vocab_size", "n_layer", "n_head", "n_kv_head", "n_embd", "window_pattern"]
DTYPES = [torch.int64, torch.int8, torch.bool, torch.float16, torch.bfloat16, torch.float64,
          torch.complex64, torch.float8_e4m3fn, torch.uint8]


BENIGN = st.one_of(  # changes a real checkpoint may carry, which must load and run
    st.tuples(st.just("noop"), st.just(0)),
    st.tuples(st.just("dtype"), st.integers(0, 99), st.sampled_from([torch.bfloat16, torch.float16, torch.float64])),
    st.tuples(st.just("compiled_prefix"), st.just(0)),
    st.tuples(st.just("drop_lambdas"), st.just(0)),
    st.tuples(st.just("tokenizer_pkl"), st.just(0)),
    st.tuples(st.just("extra_file"), st.sampled_from(["optim_000001_rank0.pt", "model_000001.pt.part", "README"])),
)


@st.composite
def corruptions(draw):
    if draw(st.integers(0, 3)) == 0:
        return draw(st.lists(BENIGN, min_size=1, max_size=3))
    return draw(st.lists(st.one_of(
        st.tuples(st.just("truncate"), st.floats(0, 1)),
        st.tuples(st.just("flip_bytes"), st.floats(0, 1), st.binary(min_size=1, max_size=64)),
        st.tuples(st.just("random_file"), st.sampled_from([PT, META]), st.binary(max_size=256)),
        st.tuples(st.just("delete"), st.sampled_from([PT, META])),
        st.tuples(st.just("config_value"), st.sampled_from(CONFIG_KEYS + ["extra"]), JSON_VALUES),
        st.tuples(st.just("config_drop"), st.sampled_from(CONFIG_KEYS)),
        st.tuples(st.just("meta_replace"), JSON_VALUES),
        st.tuples(st.just("meta_text"), TEXT),
        st.tuples(st.just("rename_key"), st.integers(0, 99), TEXT),
        st.tuples(st.just("drop_key"), st.integers(0, 99)),
        st.tuples(st.just("dtype"), st.integers(0, 99), st.sampled_from(DTYPES)),
        st.tuples(st.just("shape"), st.integers(0, 99)),
        st.tuples(st.just("nonfinite"), st.integers(0, 99), st.sampled_from([float("nan"), float("inf")])),
        st.tuples(st.just("not_tensor"), st.integers(0, 99), st.sampled_from([1, "x", [1.0], None])),
        st.tuples(st.just("nest"), st.just(0)),
        st.tuples(st.just("payload"), st.just(0)),
        st.tuples(st.just("tokenizer_pkl"), st.just(0)),
        st.tuples(st.just("rename_step"), st.sampled_from(["model_000002.pt", "meta_000002.json", "model_1.pt"])),
    ), min_size=1, max_size=3))


def _edit_sd(d: Path, fn) -> None:
    try:
        sd = torch.load(d / PT, weights_only=True)
    except Exception:  # already corrupted by an earlier step: leave it
        return
    if isinstance(sd, dict) and sd:
        sd = fn(sd) or sd
        torch.save(sd, d / PT)


def apply(d: Path, op: tuple) -> None:
    kind, *a = op
    pt, meta = d / PT, d / META
    if kind == "truncate" and pt.is_file():
        data = pt.read_bytes()
        pt.write_bytes(data[: int(len(data) * a[0])])
    elif kind == "flip_bytes" and pt.is_file():
        data = bytearray(pt.read_bytes())
        at = int(len(data) * a[0])
        data[at:at + len(a[1])] = a[1]
        pt.write_bytes(bytes(data))
    elif kind == "random_file":
        (d / a[0]).write_bytes(a[1])
    elif kind == "delete":
        (d / a[0]).unlink(missing_ok=True)
    elif kind in ("config_value", "config_drop", "meta_replace") and meta.is_file():
        try:
            m = json.loads(meta.read_text())
        except Exception:
            return
        if kind == "meta_replace":
            m = a[0]
        elif isinstance(m, dict) and isinstance(m.get("model_config"), dict):
            if kind == "config_value":
                m["model_config"][a[0]] = a[1]
            else:
                m["model_config"].pop(a[0], None)
        meta.write_text(json.dumps(m))
    elif kind == "meta_text":
        meta.write_text(a[0])
    elif kind in ("rename_key", "drop_key", "dtype", "shape", "nonfinite", "not_tensor"):
        def fn(sd):
            keys = sorted(sd)
            k = keys[a[0] % len(keys)]
            v = sd[k]
            if kind == "rename_key":
                sd[a[1]] = sd.pop(k)
            elif kind == "drop_key":
                sd.pop(k)
            elif kind == "dtype" and isinstance(v, torch.Tensor):
                sd[k] = v.to(a[1])
            elif kind == "shape" and isinstance(v, torch.Tensor):
                sd[k] = torch.zeros(v.numel() + 1)
            elif kind == "nonfinite" and isinstance(v, torch.Tensor) and v.is_floating_point():
                v = v.clone()
                v.view(-1)[0] = a[1]
                sd[k] = v
            elif kind == "not_tensor":
                sd[k] = a[1]
        _edit_sd(d, fn)
    elif kind == "compiled_prefix":
        _edit_sd(d, lambda sd: {"_orig_mod." + k: v for k, v in sd.items()})
    elif kind == "drop_lambdas":
        _edit_sd(d, lambda sd: {k: v for k, v in sd.items() if k not in ("resid_lambdas", "x0_lambdas")})
    elif kind == "extra_file":
        (d / a[0]).write_bytes(b"not read")
    elif kind == "nest":
        _edit_sd(d, lambda sd: {"model": sd})
    elif kind == "payload":
        _edit_sd(d, lambda sd: {**sd, "evil": Payload(d.parent / "PWNED")})
    elif kind == "tokenizer_pkl":
        malicious_pickle(d / "tokenizer.pkl", d.parent / "PWNED")
    elif kind == "rename_step":
        src = pt if a[0].startswith("model") else meta
        if src.is_file():
            src.rename(d / a[0])


@FUZZ
@given(corruptions(), st.sampled_from([["--schedules", "chunked", "--chunks", "2"],
                                       ["--schedules", "decode,engine", "--json"]]))
def test_corrupted_checkpoints_never_crash(ops, extra):
    with tempfile.TemporaryDirectory() as tmp:
        d = shutil.copytree(good_checkpoint(), Path(tmp) / "ckpt")
        for op in ops:
            apply(d, op)
        save = Path(tmp) / "runs.pt"
        r = invoke(["compare", "--seq-len", "8", "--gen-len", "2", *extra, "--checkpoint", d,
                    "--save", save], allowed=(0, 2))
        check_outputs([save], Path(tmp))
        if r.exit_code == 2:
            assert not save.exists()
