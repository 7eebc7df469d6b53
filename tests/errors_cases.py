"""Every bad input the CLI refuses, as the cases of docs/errors.md (`CASES`), and how one runs
(`run_case`: in a scratch directory, checking its exit status, that stderr is one line and that
nothing was written). tests/docs/test_errors_table.py runs them all and compares the page
docs/gen_errors.py renders from them with the committed one; `python scripts/regen.py --only
errors` writes it.

A few conditions cannot happen on the machine that runs the tests (a GPU that is missing, a
device without float16 kernels, a read-only directory when running as root, little memory);
those are simulated with a monkeypatch (`simulate`), and the table says so.
"""

from __future__ import annotations

import json
import os
import shutil
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional

import torch

import smearcli.util.preflight as validate
from hardening_util import (FAST, META, PT, copy_checkpoint, edit_config, edit_meta, edit_state,
                            invoke, leftovers, malicious_state, malicious_torch_file, write_checkpoint)
from zip_util import rezip_deflated
from conftest import ROOT  # noqa: E402 - the clone's root

MEMORY = 16 << 30  # the memory the table's runs see (simulated, so the messages do not vary)
C = ["compare", *FAST]


@dataclass
class Case:
    group: str
    what: str
    args: list
    status: int = 2
    prepare: Optional[Callable[[Path], None]] = None  # builds files in the working directory
    simulate: Optional[str] = None  # key of SIMULATIONS: a condition the test machine lacks
    expect: str = ""  # a fragment the message must contain (the test's own assertion)
    shown: list = field(default_factory=list)  # the command line as the table shows it


def ck(name, fn=None):
    """A copy of the good checkpoint in `name/`, changed by fn(dir)."""
    def prepare(cwd: Path):
        d = copy_checkpoint(cwd / "good", cwd / name)
        if fn is not None:
            fn(d)
    return prepare


def write(name, data: bytes | str):
    def prepare(cwd: Path):
        p = cwd / name
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(data if isinstance(data, bytes) else data.encode())
    return prepare


def steps_dir(cwd: Path):
    for s in (100, 200, 300):
        write_checkpoint(cwd / "steps", step=s)


def vocab_dir(cwd: Path):
    write_checkpoint(cwd / "vocab512", vocab_size=512)


def sd_set(key, value):
    return lambda d: edit_state(d, lambda sd: sd.__setitem__(key, value(sd) if callable(value) else value))


def sd_pop(key):
    return lambda d: edit_state(d, lambda sd: sd.pop(key))


def truncate(d: Path):
    data = (d / PT).read_bytes()
    (d / PT).write_bytes(data[: len(data) // 2])


SCAN_LINE = '{"model_type": "llama", "verdict": "ok"}\n'  # one scan record, as --out holds it
HELD = []  # descriptors whose lock stands for a scan still running on that file (kept open)


def held(name):
    """`name` (a record file) under the exclusive lock a running scan holds on its --out."""
    def prepare(cwd: Path):
        import fcntl

        (cwd / name).write_text(SCAN_LINE)
        f = open(cwd / name)
        fcntl.flock(f, fcntl.LOCK_EX)
        HELD.append(f)
    return prepare


LONG = "n" * 300  # a path component longer than any file system allows (255); shortened in the table
STANDIN = ROOT / "tests" / "standin" / "old"
AUDIT = ["compare", "--impl", "nanochat", "--nanochat-path", "mine", "--depth", "1", "--seq-len", "12",
         "--chunks", "2", "--gen-len", "4", "--draft", "2", "--schedules", "chunked"]


def mine(old: str = "", new: str = "", file: str = "gpt.py"):
    """A copy of the stand-in nanochat checkout in `mine/`, with `old` replaced by `new` in `file`."""
    def prepare(cwd: Path):
        import shutil
        shutil.copytree(STANDIN, cwd / "mine")
        p = cwd / "mine" / "nanochat" / file
        if old:
            assert p.read_text().count(old) == 1, old
            p.write_text(p.read_text().replace(old, new))
    return prepare


def symlinked_gpt(cwd: Path):
    """mine/, its nanochat/gpt.py a symbolic link to a file beside the checkout."""
    mine()(cwd)
    gpt = cwd / "mine" / "nanochat" / "gpt.py"
    gpt.rename(cwd / "gpt_elsewhere.py")
    gpt.symlink_to("../../gpt_elsewhere.py")


def link(name, target):
    def prepare(cwd: Path):
        d = copy_checkpoint(cwd / "good", cwd / name)
        (d / PT).unlink()
        (d / PT).symlink_to(target if target != "self" else d / PT)
    return prepare


def fifo_model(cwd: Path):
    d = copy_checkpoint(cwd / "good", cwd / "fifo")
    (d / PT).unlink()
    os.mkfifo(d / PT)


def sparse_file(name, size):
    def prepare(cwd: Path):
        with open(cwd / name, "wb") as f:
            f.truncate(size)
    return prepare


def odd(kind):
    make = {"meta": lambda t: torch.empty(t.shape, device="meta"), "sparse": lambda t: t.to_sparse(),
            "nested": lambda t: torch.nested.nested_tensor([t[0], t[1, :3]]),
            "quantized": lambda t: torch.quantize_per_tensor(t, 0.1, 0, torch.qint8)}[kind]
    def fn(d):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            edit_state(d, lambda sd: sd.__setitem__("lm_head.weight", make(sd["lm_head.weight"])))
    return fn


def crc_flip(d: Path):
    import struct
    import zipfile
    with zipfile.ZipFile(d / PT) as z:
        info = max(z.infolist(), key=lambda i: i.file_size)
    data = bytearray((d / PT).read_bytes())
    n, e = struct.unpack("<HH", data[info.header_offset + 26: info.header_offset + 30])
    data[info.header_offset + 30 + n + e + info.file_size // 2] ^= 0x10
    (d / PT).write_bytes(bytes(data))


def inflating(d: Path):
    import zipfile
    with zipfile.ZipFile(d / PT, "a", compression=zipfile.ZIP_DEFLATED) as z:
        z.writestr("model_000001/data/999", bytes(64 << 20))  # 64 MiB of zeros, ~64 KiB on disk


def deflate_bomb(d: Path):
    import zipfile
    with zipfile.ZipFile(d / PT) as z:
        record = next(n for n in z.namelist() if n.endswith("/data/0"))
    rezip_deflated(d / PT, d / PT, {record: 1 << 30})  # 1 GiB of zeros, about 1 MiB on disk


FORWARD = "        B, T = idx.shape\n"
IMPORT = "import torch.nn.functional as F\n"


def nan_at(value):
    def fn(sd):
        w = sd["lm_head.weight"].clone()
        w[0, :3] = value
        sd["lm_head.weight"] = w
    return lambda d: edit_state(d, fn)


def release_wheel(kind: str = "good"):
    """`w/transformers-5.99.0-py3-none-any.whl` for scan --release --wheels w: a stand-in
    transformers wheel (tests/release_standin.py), or one that is not what its name says, as `kind`
    says. Only read: no case here gets as far as installing it."""
    def prepare(cwd: Path):
        import zipfile

        from release_standin import wheel

        (cwd / "w").mkdir()
        if kind == "another package":
            wheel(cwd, "5.99.0", "ok", name="tokenizers").rename(cwd / "w" / "transformers-5.99.0-py3-none-any.whl")
            return
        path = wheel(cwd / "w", "5.99.0", "ok")
        data = path.read_bytes()
        if kind == "cut short":
            path.write_bytes(data[: len(data) // 2])
        elif kind == "damaged":
            path.write_bytes(data.replace(b"__version__ = ", b"__VERSION__ = "))
        elif kind == "not working":  # says transformers and holds its package, but only an __init__
            with zipfile.ZipFile(cwd / "w.zip", "w") as out, zipfile.ZipFile(path) as z:
                for name in z.namelist():
                    if not name.startswith("transformers/") or name == "transformers/__init__.py":
                        out.writestr(name, z.read(name))
            os.replace(cwd / "w.zip", path)
        elif kind == "no package":
            with zipfile.ZipFile(cwd / "w.zip", "w") as out, zipfile.ZipFile(path) as z:
                for name in z.namelist():
                    if not name.startswith("transformers/"):
                        out.writestr(name, z.read(name))
            os.replace(cwd / "w.zip", path)
    return prepare


CASES = [
    # -- command line -------------------------------------------------------------------------
    Case("usage", "unknown option", ["compare", "--chunk", "4"], expect="No such option"),
    Case("usage", "option value of the wrong type", ["compare", "--chunks", "four"], expect="valid integer"),
    Case("usage", "value outside a fixed choice", ["compare", "--logic", "new"], expect="'new' is not one of"),
    Case("usage", "unknown command", ["comapre"], expect="No such command"),
    # -- checkpoint directory -----------------------------------------------------------------
    Case("checkpoint", "directory missing", [*C, "--checkpoint", "missing"], expect="not found"),
    Case("checkpoint", "a file given instead of the directory", [*C, "--checkpoint", f"good/{PT}"],
         expect="not a directory"),
    Case("checkpoint", "directory empty", [*C, "--checkpoint", "empty"],
         prepare=lambda cwd: (cwd / "empty").mkdir(), expect="empty"),
    Case("checkpoint", "no model/meta pair (other files only)", [*C, "--checkpoint", "other"],
         prepare=write("other/notes.txt", "x"), expect="pair"),
    Case("checkpoint", "model file without its meta file", [*C, "--checkpoint", "nometa"],
         prepare=ck("nometa", lambda d: (d / META).unlink()), expect="has no meta_000001.json"),
    Case("checkpoint", "meta file without its model file", [*C, "--checkpoint", "nomodel"],
         prepare=ck("nomodel", lambda d: (d / PT).unlink()), expect="has no model_000001.pt"),
    Case("checkpoint", "requested --step absent (the steps present are listed)",
         [*C, "--checkpoint", "steps", "--step", "250"], prepare=steps_dir, expect="present: 100, 200, 300"),
    # -- model file -----------------------------------------------------------------------------
    Case("model file", "empty .pt file", [*C, "--checkpoint", "empty_pt"],
         prepare=ck("empty_pt", lambda d: (d / PT).write_bytes(b"")), expect="0 bytes"),
    Case("model file", "truncated .pt file", [*C, "--checkpoint", "truncated"],
         prepare=ck("truncated", truncate), expect="truncated"),
    Case("model file", ".pt file of random bytes", [*C, "--checkpoint", "random"],
         prepare=ck("random", lambda d: (d / PT).write_bytes(bytes(range(7, 250)) * 9)),
         expect="not a torch checkpoint"),
    Case("model file", "unreadable .pt (here: a directory of that name)", [*C, "--checkpoint", "unreadable"],
         prepare=ck("unreadable", lambda d: ((d / PT).unlink(), (d / PT).mkdir())), expect="is a directory"),
    Case("model file", "pickle that would run code (creates a file when unpickled)", [*C, "--checkpoint", "evil"],
         prepare=ck("evil", lambda d: malicious_state(d, d / "PWNED")), expect="refused: loading it would call"),
    Case("model file", "a training checkpoint: weights nested under a key", [*C, "--checkpoint", "nested"],
         prepare=ck("nested", lambda d: edit_state(d, lambda sd: {"model": sd, "step": torch.tensor(1)})),
         expect="nested"),
    Case("model file", "a value that is not a tensor", [*C, "--checkpoint", "notensor"],
         prepare=ck("notensor", sd_set("smear_lambda", [0.5])), expect="not a tensor"),
    # -- meta file ------------------------------------------------------------------------------
    Case("meta file", "invalid JSON", [*C, "--checkpoint", "badjson"],
         prepare=ck("badjson", lambda d: (d / META).write_text('{"model_config": {')), expect="invalid JSON"),
    Case("meta file", "JSON that is not an object", [*C, "--checkpoint", "jsonlist"],
         prepare=ck("jsonlist", lambda d: (d / META).write_text("[1, 2]")), expect="got a list"),
    Case("meta file", "no model_config", [*C, "--checkpoint", "noconfig"],
         prepare=ck("noconfig", lambda d: edit_meta(d, lambda m: {"step": 1})), expect="no model_config"),
    Case("meta file", "model_config lacks a field", [*C, "--checkpoint", "lacks"],
         prepare=ck("lacks", lambda d: edit_config(d, n_embd=...)), expect="model_config lacks n_embd"),
    Case("meta file", "model_config has an unknown field", [*C, "--checkpoint", "unknown"],
         prepare=ck("unknown", lambda d: edit_config(d, n_experts=8)), expect="unknown keys: n_experts"),
    Case("meta file", "model_config value of the wrong type", [*C, "--checkpoint", "wrongtype"],
         prepare=ck("wrongtype", lambda d: edit_config(d, n_head="1")), expect="must be an integer"),
    Case("meta file", "model_config value not positive", [*C, "--checkpoint", "zero"],
         prepare=ck("zero", lambda d: edit_config(d, n_layer=0)), expect="must be positive"),
    Case("meta file", "n_embd % n_head != 0", [*C, "--checkpoint", "heads"],
         prepare=ck("heads", lambda d: edit_config(d, n_head=3)), expect="not divisible by n_head"),
    Case("meta file", "n_head % n_kv_head != 0", [*C, "--checkpoint", "kvheads"],
         prepare=ck("kvheads", lambda d: edit_config(d, n_head=2, n_kv_head=3, n_embd=128)),
         expect="not divisible by n_kv_head"),
    Case("meta file", "n_embd beyond what a tensor can hold", [*C, "--checkpoint", "wide"],
         prepare=ck("wide", lambda d: edit_config(d, n_embd=10**9, n_head=1, n_kv_head=1)),
         expect="n_embd 1,000,000,000 is too large"),
    Case("meta file", "bad window_pattern", [*C, "--checkpoint", "window"],
         prepare=ck("window", lambda d: edit_config(d, window_pattern="SSXL")), expect="window_pattern"),
    # -- state dict vs model_config -------------------------------------------------------------
    Case("state dict", "key missing", [*C, "--checkpoint", "missingkey"],
         prepare=ck("missingkey", sd_pop("lm_head.weight")), expect="missing lm_head.weight"),
    Case("state dict", "unexpected key", [*C, "--checkpoint", "extrakey"],
         prepare=ck("extrakey", sd_set("transformer.h.7.attn.c_q.weight", torch.zeros(2, 2))),
         expect="unexpected transformer.h.7"),
    Case("state dict", "key renamed", [*C, "--checkpoint", "renamed"],
         prepare=ck("renamed", lambda d: edit_state(
             d, lambda sd: sd.__setitem__("smear_gate.w", sd.pop("smear_gate.weight")))),
         expect="missing smear_gate.weight; unexpected smear_gate.w"),
    Case("state dict", "shape mismatch", [*C, "--checkpoint", "shape"],
         prepare=ck("shape", sd_set("smear_gate.weight", torch.zeros(1, 12))),
         expect="smear_gate.weight has shape (1, 12), model_config expects (1, 24)"),
    Case("state dict", "integer tensor", [*C, "--checkpoint", "inttensor"],
         prepare=ck("inttensor", sd_set("smear_lambda", torch.ones(1, dtype=torch.int64))), expect="int64"),
    Case("state dict", "NaN in weights", [*C, "--checkpoint", "nan"],
         prepare=ck("nan", nan_at(float("nan"))), expect="lm_head.weight contains NaN or Inf"),
    Case("state dict", "Inf in weights", [*C, "--checkpoint", "inf"],
         prepare=ck("inf", nan_at(float("inf"))), expect="lm_head.weight contains NaN or Inf"),
    *[Case("state dict", f"a {k} tensor", [*C, "--checkpoint", k], prepare=ck(k, odd(k)),
           expect=f"lm_head.weight is a {k}" if k != "sparse" else "sparse_coo tensor")
      for k in ("meta", "sparse", "nested", "quantized")],
    # -- the file system ------------------------------------------------------------------------
    Case("file system", "path component longer than the file system allows (--checkpoint)",
         [*C, "--checkpoint", LONG], expect="File name too long"),
    Case("file system", "path component longer than the file system allows (--tokens)",
         [*C, "--tokens", f"{LONG}.json"], expect="File name too long"),
    Case("file system", "path component longer than the file system allows (--save)",
         [*C, "--save", f"{LONG}/runs.pt"], expect="File name too long"),
    Case("file system", "path component longer than the file system allows (--nanochat-path)",
         [*C, "--impl", "nanochat", "--nanochat-path", LONG], expect="File name too long"),
    Case("file system", "model file is a dangling symlink", [*C, "--checkpoint", "dangling"],
         prepare=link("dangling", "/nonexistent/model.pt"), expect="which does not exist"),
    Case("file system", "model file is a symlink loop", [*C, "--checkpoint", "loop"],
         prepare=link("loop", "self"), expect="symlink loop"),
    Case("file system", "model file is a FIFO (would block a read)", [*C, "--checkpoint", "fifo"],
         prepare=fifo_model, expect="FIFO"),
    Case("file system", "token file is a FIFO", [*C, "--tokens", "ids.json"],
         prepare=lambda cwd: os.mkfifo(cwd / "ids.json"), expect="FIFO"),
    Case("file system", "--save is a dangling symlink", [*C, "--save", "runs.pt"],
         prepare=lambda cwd: (cwd / "runs.pt").symlink_to("/nonexistent/runs.pt"), expect="does not exist"),
    Case("file system", "zip member whose CRC-32 does not match (a bit flipped on disk)",
         [*C, "--checkpoint", "flipped"], prepare=ck("flipped", crc_flip), expect="CRC-32"),
    Case("file system", "--save failing midway: the file-size limit (EFBIG) inside torch's zip writer",
         [*C, "--save", "runs.pt"], simulate="fsize", expect="runs.pt: File too large"),
    # -- memory ---------------------------------------------------------------------------------
    Case("memory", "checkpoint too large for free memory (16 GiB simulated)", [*C, "--checkpoint", "huge"],
         prepare=ck("huge", lambda d: edit_config(d, vocab_size=10**9)), simulate="memory",
         expect="needs about"),
    Case("memory", "random model too large for free memory (16 GiB simulated)", ["compare", "--depth", "200"],
         simulate="memory", expect="choose a smaller model"),
    Case("memory", "run whose activations would not fit (16 GiB simulated)",
         ["compare", "--depth", "1", "--seq-len", "4096", "--batch", "256"], simulate="memory",
         expect="lower --seq-len"),
    Case("memory", "compressed checkpoint member that inflates beyond free memory (48 MiB simulated)",
         [*C, "--checkpoint", "inflates"], prepare=ck("inflates", inflating), simulate="little_memory",
         expect="MiB of tensors, 294,952 parameters) needs about"),
    Case("memory", "compressed record declaring far more than model_config's weights (1 GiB in 1 MiB)",
         [*C, "--checkpoint", "bomb"], prepare=ck("bomb", deflate_bomb), expect="inflate to 1.0 GiB"),
    Case("memory", "run beyond this process's own cgroup limit (768 MiB simulated)",
         ["compare", "--depth", "4", "--seq-len", "4096", "--batch", "4"], simulate="cgroup",
         expect="768.0 MiB available"),
    Case("memory", "engine expansion that would not fit (16 GiB simulated)",
         [*C, "--schedules", "engine", "--samples", "10000000"], simulate="memory", expect="engine rows"),
    # -- input ----------------------------------------------------------------------------------
    Case("input", "--seq-len beyond the model's rotary table", ["compare", "--depth", "1", "--seq-len", "6000"],
         expect="rotary table"),
    Case("input", "token file row beyond the model's rotary table", [*C, "--tokens", "long.json"],
         prepare=write("long.json", json.dumps([7] * 6000)), expect="rotary table"),
    Case("input", "--depth beyond what a tensor can hold", ["compare", "--depth", str(2**60)],
         expect="beyond what a tensor can hold"),
    Case("input", "--seq-len too short", ["compare", "--depth", "1", "--seq-len", "1"], expect="--seq-len"),
    Case("input", "--batch zero", [*C, "--batch", "0"], expect="--batch"),
    Case("input", "--seed out of range", [*C, "--seed", "-1"], expect="--seed"),
    Case("input", "token id outside the vocabulary", [*C, "--tokens", "ids.json"],
         prepare=write("ids.json", "[1, 2, 300, 4]"), expect="outside the vocabulary"),
    Case("input", "JSON integer beyond Python's digit limit (token file)", [*C, "--tokens", "big.json"],
         prepare=write("big.json", "[1, " + "9" * 5000 + "]"), expect="4300 digits"),
    Case("input", "JSON integer beyond Python's digit limit (meta file)", [*C, "--checkpoint", "bigint"],
         prepare=ck("bigint", lambda d: (d / META).write_text('{"model_config": {"n_layer": ' + "9" * 5000 + "}}")),
         expect="4300 digits"),
    Case("input", "token file over 64 MiB (refused before reading)", [*C, "--tokens", "huge.json"],
         prepare=sparse_file("huge.json", (64 << 20) + 1), expect="too large for a token file"),
    Case("input", "--text-file over 16 MiB (refused before reading)", [*C, "--text-file", "huge.txt"],
         prepare=sparse_file("huge.txt", (16 << 20) + 1), expect="too large for a text file"),
    Case("input", "bool token ids", [*C, "--tokens", "ids.pt"],
         prepare=lambda cwd: torch.save(torch.tensor([[True, False, True]]), cwd / "ids.pt"), expect="bool"),
    Case("input", "--text with a character UTF-8 cannot encode (a lone surrogate)", [*C, "--text", "a\ud800b"],
         expect="UTF-8 cannot encode"),
    Case("input", "token file of invalid JSON", [*C, "--tokens", "bad.json"],
         prepare=write("bad.json", "[1, 2,"), expect="invalid JSON"),
    Case("input", "token file missing", [*C, "--tokens", "nothere.json"], expect="not found"),
    Case("input", "token .pt file that would run code", [*C, "--tokens", "ids.pt"],
         prepare=lambda cwd: malicious_torch_file(cwd / "ids.pt", cwd / "PWNED"), expect="refused"),
    Case("input", "--tokens and --text together", [*C, "--tokens", "ok.json", "--text", "hi"],
         prepare=write("ok.json", "[1, 2, 3]"), expect="only one"),
    Case("input", "empty --text", [*C, "--text", ""], expect="empty"),
    Case("input", "--text for a model whose vocabulary is not bytes", [*C, "--checkpoint", "vocab512", "--text", "hi"],
         prepare=vocab_dir, expect="token ids"),
    Case("input", "--step without --checkpoint", [*C, "--step", "3"], expect="--step needs --checkpoint"),
    Case("input", "--depth zero", ["compare", "--depth", "0"], expect="--depth"),
    # -- schedules ------------------------------------------------------------------------------
    Case("schedules", "--chunks zero", [*C, "--chunks", "0"], expect="--chunks"),
    Case("schedules", "--chunks negative", [*C, "--chunks", "-3"], expect="--chunks"),
    Case("schedules", "more chunks than tokens", [*C, "--chunks", "17"], expect="at least one token"),
    Case("schedules", "--chunk-sizes not summing to the sequence", [*C, "--chunk-sizes", "8,4"], expect="sum to 12"),
    Case("schedules", "--chunk-sizes with a zero", [*C, "--chunk-sizes", "8,0,8"], expect="positive"),
    Case("schedules", "--chunk-sizes not integers", [*C, "--chunk-sizes", "8,x"], expect="integers"),
    Case("schedules", "unknown schedule", [*C, "--schedules", "chunked,paged"], expect="unknown schedule 'paged'"),
    Case("schedules", "the reference as a schedule", [*C, "--schedules", "full"], expect="reference"),
    Case("schedules", "--samples zero", [*C, "--samples", "0"], expect="--samples"),
    Case("schedules", "--gen-len zero", ["compare", "--depth", "1", "--seq-len", "16", "--gen-len", "0"],
         expect="--gen-len"),
    Case("schedules", "--tolerance not a positive number", [*C, "--tolerance", "nan"], expect="--tolerance"),
    Case("schedules", "bench --budget nan", ["bench", *FAST, "--budget", "nan"], expect="--budget"),
    Case("schedules", "bench --budget inf", ["bench", *FAST, "--budget", "inf"], expect="--budget"),
    Case("schedules", "--documents not summing to the input", [*C, "--schedules", "packed", "--documents", "8,4"],
         expect="sum to 12 but the input has 16"),
    Case("schedules", "--documents of one document (no boundary to cross)",
         ["compare", "--depth", "1", "--schedules", "packed", "--documents", "16"], expect="one document"),
    Case("schedules", "a packed text without <|bos|> markers (one document)",
         ["compare", "--depth", "1", "--schedules", "packed", "--text", "hello"], expect="one document of 6 tokens"),
    Case("schedules", "an empty document between <|bos|> markers",
         ["compare", "--depth", "1", "--schedules", "packed", "--text", "a<|bos|><|bos|>b"], expect="is empty"),
    Case("schedules", "--reject not fewer than --draft", [*C, "--schedules", "rollback", "--reject", "4"],
         expect="rejects 1 to 3 tokens"),
    Case("schedules", "rollback in which no draft is ever whole, --check (it would check nothing)",
         [*C, "--schedules", "rollback", "--draft", "6", "--check"], expect="no draft would ever be taken back"),
    Case("schedules", "speculative --draft longer than the tokens it verifies",
         [*C, "--schedules", "speculative", "--draft", "6"], expect="longer than the 4 tokens"),
    Case("schedules", "--reject without the rollback schedule", [*C, "--reject", "1"], expect="add --schedules rollback"),
    Case("schedules", "rollback on a checkout whose cache can neither be cropped nor copied",
         ["compare", "--impl", "nanochat", "--nanochat-path", "mine", "--depth", "1", "--seq-len", "12",
          "--gen-len", "6", "--schedules", "rollback"], prepare=mine(), expect="neither copy nor crop"),
    # -- the user's own code (--impl nanochat): their failures are theirs, exit 1 ----------------
    Case("your code", "an exception in their GPT.forward (exit 1, with file:line)", AUDIT, status=1,
         prepare=mine(FORWARD, FORWARD + "        raise ValueError('oops')\n"), expect="GPT.forward failed"),
    Case("your code", "an exception in their KVCache (exit 1)", AUDIT, status=1,
         prepare=mine("        self.batch_size = batch_size\n", "        raise RuntimeError('no cache')\n",
                      "engine.py"), expect="KVCache() failed"),
    Case("your code", "their GPT.forward returns the wrong type (exit 1)", AUDIT, status=1,
         prepare=mine(FORWARD, FORWARD + "        return (idx, None)\n"), expect="returned a tuple"),
    Case("your code", "sys.exit(0) at import under --check (exit 1, not a pass)", [*AUDIT, "--check"], status=1,
         prepare=mine(IMPORT, IMPORT + "import sys\nsys.exit(0)\n"), expect="called sys.exit(0)"),
    Case("your code", "an endless loop at import (--user-code-timeout 1; exit 1)",
         [*AUDIT, "--user-code-timeout", "1"], status=1, prepare=mine(IMPORT, IMPORT + "while True:\n    pass\n"),
         expect="did not finish within 1 s"),
    Case("your code", "a BaseException subclass raised in their GPT.forward (exit 1, with file:line)", AUDIT,
         status=1, prepare=mine(FORWARD, FORWARD + "        class Boom(BaseException):\n            pass\n"
                                "        raise Boom('big')\n"), expect="(a BaseException, not an Exception)"),
    Case("your code", "a KeyboardInterrupt raised by their code, not by Ctrl-C (exit 1)", AUDIT, status=1,
         prepare=mine(FORWARD, FORWARD + "        raise KeyboardInterrupt\n"), expect="no Ctrl-C was pressed"),
    Case("your code", "os._exit(0) in their GPT.forward under --check (exit 1, not a pass)", [*AUDIT, "--check"],
         status=1, prepare=mine(FORWARD, FORWARD + "        import os; os._exit(0)\n"), expect="called os._exit(0)"),
    Case("your code", "their cached calls return logits of the wrong width (exit 1)", AUDIT, status=1,
         prepare=mine("        return logits\n", "        if kv_cache is not None:\n            logits = logits[..., :-1]\n"
                      "        return logits\n"), expect="255 wide"),
    Case("your code", "--user-code-timeout not a positive number", [*AUDIT, "--user-code-timeout", "nan"],
         prepare=mine(), expect="--user-code-timeout"),
    Case("your code", "NaN weights under --impl nanochat", [*AUDIT, "--checkpoint", "nan"],
         prepare=lambda cwd: (mine()(cwd), ck("nan", nan_at(float("nan")))(cwd)), expect="contains NaN"),
    Case("your code", "meta that does not match the weights, refused before their model is built",
         [*AUDIT, "--checkpoint", "wide"],
         prepare=lambda cwd: (mine()(cwd), ck("wide", lambda d: edit_config(d, vocab_size=512))(cwd)),
         expect="model_config expects (512, 128)"),
    # -- smearcli fix: the patch for a checkout -------------------------------------------------
    Case("fix", "--nanochat-path names a file, not the checkout", ["fix", "--nanochat-path", "mine/nanochat/gpt.py"],
         prepare=mine(), expect="not a directory"),
    Case("fix", "gpt.py over 1 MiB (refused before it is read)", ["fix", "--nanochat-path", "mine"],
         prepare=lambda cwd: (mine()(cwd), os.truncate(cwd / "mine" / "nanochat" / "gpt.py", (1 << 20) + 1)),
         expect="larger than the 1 MiB"),
    Case("fix", "--write where gpt.py is a symbolic link (never replaced by a file)",
         ["fix", "--nanochat-path", "mine", "--write"], prepare=symlinked_gpt, expect="symbolic link"),
    # -- device ---------------------------------------------------------------------------------
    Case("device", "--device cuda without CUDA", [*C, "--device", "cuda"], simulate="no_cuda", expect="CUDA"),
    Case("device", "--dtype the device cannot run (simulated: no float16 attention kernel)",
         [*C, "--device", "cpu", "--dtype", "float16"], simulate="no_fp16", expect="cannot run it"),
    # -- output files ---------------------------------------------------------------------------
    Case("output", "--save in a missing directory", [*C, "--save", "nodir/runs.pt"], expect="does not exist"),
    Case("output", "--save in a read-only directory (simulated when run as root)",
         [*C, "--save", "readonly/runs.pt"], prepare=lambda cwd: (cwd / "readonly").mkdir(mode=0o555),
         simulate="readonly", expect="not writable"),
    Case("output", "--save with an unknown suffix", [*C, "--save", "runs.npz"], expect="unknown suffix"),
    Case("output", "--save naming a directory", [*C, "--save", "adir.pt"],
         prepare=lambda cwd: (cwd / "adir.pt").mkdir(), expect="is a directory"),
    Case("output", "plot --out with an unknown suffix", ["plot", *FAST, "--out", "fig.jpg"], expect="unknown suffix"),
    Case("output", "--save whose directory is removed during the run (simulated)", [*C, "--save", "gone/runs.pt"],
         simulate="gone", expect="no longer exists"),
    Case("output", "bench --output in a missing directory", ["bench", *FAST, "--output", "nodir/b.json"],
         expect="does not exist"),
    Case("output", "--save under a file (FILE/runs.pt)", [*C, "--save", "FILE/runs.pt"],
         prepare=write("FILE", "a file"), expect="FILE is a file, not a directory"),
    Case("output", "plot --out under a file", ["plot", *FAST, "--out", "FILE/fig.png"],
         prepare=write("FILE", "a file"), expect="FILE is a file, not a directory"),
    # -- smearcli scan: its options, outputs and record files ------------------------------------
    Case("scan", "--shard whose i is not within 1..n", ["scan", "--shard", "0/2"], expect="between 1 and n"),
    Case("scan", "--only naming no model type", ["scan", "--only", ""], expect="names no model type"),
    Case("scan", "--only naming one twice", ["scan", "--only", "llama,llama"], expect="more than once"),
    Case("scan", "--timeout inf", ["scan", "--timeout", "inf"], expect="--timeout"),
    Case("scan", "--memory-mb below 64", ["scan", "--memory-mb", "10"], expect="--memory-mb"),
    Case("scan", "run options beside --merge", ["scan", "--merge", "s.jsonl", "--jobs", "2"],
         prepare=write("s.jsonl", SCAN_LINE), expect="no meaning"),
    Case("scan", "--out naming a directory", ["scan", "--only", "llama", "--out", "out.jsonl"],
         prepare=lambda cwd: (cwd / "out.jsonl").mkdir(), expect="is a directory"),
    Case("scan", "--out naming a FIFO (never replaced)", ["scan", "--only", "llama", "--out", "fifo.jsonl"],
         prepare=lambda cwd: os.mkfifo(cwd / "fifo.jsonl"), expect="not a regular file"),
    Case("scan", "--markdown in a missing directory", ["scan", "--only", "llama", "--markdown", "nodir/c.md"],
         expect="does not exist"),
    Case("scan", "--out held by another running scan", ["scan", "--only", "llama", "--out", "busy.jsonl"],
         prepare=held("busy.jsonl"), expect="another smearcli scan"),
    Case("scan", "--merge of a record file whose last line is truncated", ["scan", "--merge", "s.jsonl"],
         prepare=write("s.jsonl", SCAN_LINE + '{"model_type": "opt", "verd'), expect="(truncated?)"),
    Case("scan", "--merge of two records glued on one line", ["scan", "--merge", "s.jsonl"],
         prepare=write("s.jsonl", SCAN_LINE.strip() + SCAN_LINE), expect="more than one JSON value"),
    Case("scan", "--merge of shards that both hold one architecture, conflicting",
         ["scan", "--merge", "s.jsonl", "--merge", "t.jsonl"],
         prepare=lambda cwd: (write("s.jsonl", SCAN_LINE)(cwd), write("t.jsonl", SCAN_LINE.replace('"ok"', '"bug"'))(cwd)),
         expect="shards never share"),
    Case("scan", "--merge of an empty file (no scan record)", ["scan", "--merge", "s.jsonl"],
         prepare=write("s.jsonl", ""), expect="holds no scan record"),
    Case("scan", "--merge of scan --json's document (not JSON Lines)", ["scan", "--merge", "s.jsonl"],
         prepare=write("s.jsonl", json.dumps({"schema": "smearcli.scan/1", "architectures": []}, indent=1)),
         expect="not the JSON Lines"),
    Case("scan", "--resume on an --out whose record has an unknown verdict", ["scan", "--only", "llama", "--resume"],
         prepare=write("scan.jsonl", SCAN_LINE.replace('"ok"', '"fine"')), expect="must be one of"),
    Case("scan", "--out under a file", ["scan", "--only", "llama", "--out", "FILE/scan.jsonl"],
         prepare=write("FILE", "a file"), expect="FILE is a file, not a directory"),
    Case("scan", "--resume on an --out holding another engine's record", ["scan", "--only", "llama", "--resume"],
         prepare=write("scan.jsonl", SCAN_LINE.replace("}", ', "engine": "vllm"}')), expect="made on vllm"),
    Case("scan", "--resume on an --out holding another transformers release's record",
         ["scan", "--only", "llama", "--resume"],
         prepare=write("scan.jsonl", SCAN_LINE.replace("}", ', "transformers_version": "4.0.0"}')),
         expect="made by transformers 4.0.0"),
    Case("scan", "--merge --against another engine's census (refused before the table or --markdown)",
         ["scan", "--merge", "s.jsonl", "--against", "v.jsonl", "--markdown", "census.md"],
         prepare=lambda cwd: (write("s.jsonl", SCAN_LINE)(cwd), write("census.md", "the previous census")(cwd),
                              write("v.jsonl", SCAN_LINE.replace("}", ', "engine": "vllm"}'))(cwd)),
         expect="a diff is between releases of one engine"),
    Case("scan", "--out on a full disk (simulated: ENOSPC at a record's write; the file keeps its whole records)",
         ["scan", "--only", "llama", "--resume", "--out", "s.jsonl"], prepare=write("s.jsonl", SCAN_LINE.replace(
             "llama", "opt")), simulate="enospc", expect="cannot write llama's record (No space left on device)"),
    # -- smearcli scan --release and --bisect: another transformers release (5.99.0: one that does not exist)
    Case("scan", "--release beside --bisect", ["scan", "--release", "5.99.0", "--bisect", "llama"],
         expect="give one of them"),
    Case("scan", "--releases without --bisect", ["scan", "--releases", "5.20.0..5.25.0"], expect="it needs --bisect"),
    Case("scan", "--bisect-path without --bisect", ["scan", "--bisect-path", "rollback*"], expect="it needs --bisect"),
    Case("scan", "--wheels without --release or --bisect", ["scan", "--wheels", "w"], prepare=lambda cwd: (cwd / "w").mkdir(),
         expect="it needs one of them"),
    Case("scan", "--release that is not a release number", ["scan", "--release", "five"],
         expect="not a transformers release number"),
    Case("scan", "--release outside 5.x", ["scan", "--release", "4.57.1"], expect="only 5.x releases"),
    Case("scan", "--release whose wheel --wheels does not hold", ["scan", "--release", "5.99.0", "--wheels", "w"],
         prepare=lambda cwd: (cwd / "w").mkdir(), expect="holds no transformers 5.99.0 wheel"),
    Case("scan", "--release whose wheel in --wheels is not a wheel (an HTML page saved under its name)",
         ["scan", "--release", "5.99.0", "--wheels", "w"],
         prepare=write("w/transformers-5.99.0-py3-none-any.whl", "<html>Not Found</html>"), expect="not a wheel"),
    Case("scan", "--release offline (simulated: pip has no index to ask)", ["scan", "--release", "5.99.0"],
         simulate="offline", expect="offline? fetch the wheels where there is a network"),
    Case("scan", "--release whose wheel in --wheels is another package's, renamed transformers-5.99.0",
         ["scan", "--release", "5.99.0", "--wheels", "w"], prepare=release_wheel("another package"),
         expect="a wheel of tokenizers 5.99.0, not of transformers"),
    Case("scan", "--release whose wheel's metadata says transformers 5.99.0 and which holds no transformers package",
         ["scan", "--release", "5.99.0", "--wheels", "w"], prepare=release_wheel("no package"),
         expect="holds no transformers package"),
    Case("scan", "--release whose wheel in --wheels is cut short (a torn download)",
         ["scan", "--release", "5.99.0", "--wheels", "w"], prepare=release_wheel("cut short"), expect="cut short"),
    Case("scan", "--release whose wheel in --wheels has a damaged member (its CRC-32 fails)",
         ["scan", "--release", "5.99.0", "--wheels", "w"], prepare=release_wheel("damaged"),
         expect="fails its CRC-32 check"),
    Case("scan", "--release with a release cache on a read-only file system (simulated: os.access says no)",
         ["scan", "--release", "5.99.0", "--wheels", "w"], prepare=release_wheel(), simulate="release_cache:readonly",
         expect="is not writable"),
    Case("scan", "--release with a full release cache (simulated: ENOSPC while its venv is made; none is left)",
         ["scan", "--release", "5.99.0", "--wheels", "w"], prepare=release_wheel(), simulate="release_cache:full",
         expect="is full (No space left on device)"),
    Case("scan", "--release with $SMEARCLI_RELEASES naming a file (simulated: set to ../releases-file)",
         ["scan", "--release", "5.99.0", "--wheels", "w"], prepare=release_wheel(), simulate="release_cache:file",
         expect="is not a directory"),
    Case("scan", "--release whose wheel installs a transformers that does not import (its package holds only an __init__)",
         ["scan", "--release", "5.99.0", "--wheels", "w"], prepare=release_wheel("not working"),
         simulate="release_cache:fresh", expect="not a working transformers wheel"),
    Case("scan", "$SMEARCLI_RELEASES a symlink into a disk not mounted", ["scan", "--release", "5.99.0", "--wheels", "w"],
         prepare=release_wheel(), simulate="release_cache:dangling", expect="which does not exist"),
    Case("scan", "--bisect that names no model type", ["scan", "--bisect", ""], expect="give one, like --bisect llama"),
    Case("scan", "--bisect of more than one architecture", ["scan", "--bisect", "llama,opt"], expect="one model type"),
    Case("scan", "--bisect with an option of a census it does not run", ["scan", "--bisect", "llama", "--out", "x.jsonl"],
         expect="--out has no meaning with it"),
    Case("scan", "--bisect over a range whose first release comes after its last",
         ["scan", "--bisect", "llama", "--wheels", "w", "--releases", "5.99.0..5.98.0"],
         prepare=lambda cwd: (write("w/transformers-5.98.0-py3-none-any.whl", "")(cwd),
                              write("w/transformers-5.99.0-py3-none-any.whl", "")(cwd)), expect="comes after the last"),
    # -- outcomes that are not bad input ------------------------------------------------------
    Case("outcome", "--check with a run outside tolerance (exit 1)",  # one thread: the noise floor's digits,
         # hence the multiple the message prints, move with the thread count, which the load picks otherwise
         [*C, "--schedules", "chunked", "--logic", "old", "--check", "--threads", "1"], status=1,
         expect="check failed: BUG"),
    Case("outcome", "an unexpected internal error (simulated bug)", [*C, "--schedules", "chunked"], status=1,
         simulate="bug", expect="rerun with --debug"),
]


def simulate(name: Optional[str], monkeypatch, cwd: Path) -> None:
    if name is None:
        return
    if name == "memory":
        monkeypatch.setattr(validate, "host_available", lambda: MEMORY)
    elif name == "little_memory":
        monkeypatch.setattr(validate, "host_available", lambda: 48 << 20)
    elif name == "cgroup":
        monkeypatch.setattr(validate, "meminfo_available", lambda: MEMORY)
        monkeypatch.setattr(validate, "cgroup_room", lambda: 768 << 20)
    elif name == "fsize":  # a real EFBIG while torch writes: the process's file-size limit
        import resource

        real_save = torch.save

        def save(obj, f, *a, **k):
            soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
            resource.setrlimit(resource.RLIMIT_FSIZE, (20_000, hard))  # Python ignores SIGXFSZ
            try:
                return real_save(obj, f, *a, **k)
            finally:
                resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
        monkeypatch.setattr(torch, "save", save)
    elif name == "no_cuda":
        monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    elif name == "no_fp16":
        import torch.nn.functional as F

        real = F.scaled_dot_product_attention

        def sdpa(q, *a, **k):
            if q.dtype == torch.float16:
                raise RuntimeError('"scaled_dot_product_attention" not implemented for \'Half\'')
            return real(q, *a, **k)
        monkeypatch.setattr(F, "scaled_dot_product_attention", sdpa)
        monkeypatch.setattr(validate, "_PROBED", {})
    elif name == "readonly":
        real_access = os.access
        ro = cwd / "readonly"
        monkeypatch.setattr(os, "access", lambda p, mode, *a, **k: False if Path(p).resolve() == ro.resolve()
                            else real_access(p, mode, *a, **k))
    elif name == "gone":  # the directory exists when the path is checked, then is removed
        import shutil

        import smearcli.util.files as files

        (cwd / "gone").mkdir()
        checked = files.check_output_path

        def check_then_remove(path, suffixes):
            result = checked(path, suffixes)
            shutil.rmtree(cwd / "gone")
            return result
        monkeypatch.setattr(files, "check_output_path", check_then_remove)
    elif name == "hello_timeout":  # the limit shortened: the table's run does not wait a minute
        import smearcli.engines.vllm.environment as vllm_env

        monkeypatch.setattr(vllm_env, "HELLO_TIMEOUT_S", 0.5)
    elif name == "enospc":  # the disk full at the first record's write: nothing of it fits
        import errno

        from smearcli.census import isolate, record

        def census(session, names, sink, **kw):
            real = os.write

            def full(fd, data):
                if fd == sink.fd:
                    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
                return real(fd, data)
            with monkeypatch.context() as m:
                m.setattr(os, "write", full)
                sink.write(record.bare(names[0], "ok"))
        monkeypatch.setattr(isolate, "census", census)
    elif name == "offline":  # pip with no index and no wheels: what it says without a network
        monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)
        monkeypatch.setenv("PIP_NO_INDEX", "1")
        monkeypatch.setenv("PIP_FIND_LINKS", str(cwd.parent / "no-wheels"))
        monkeypatch.setenv("SMEARCLI_RELEASES", str(cwd.parent / "releases-cache"))  # outside the case's directory
    elif name.startswith("release_cache:"):  # scan --release's cache ($SMEARCLI_RELEASES) beside the case's
        # directory, named relative to it so that the table's message is the same on every machine
        kind = name.partition(":")[2]
        root = cwd.parent / f"releases-{kind}"
        monkeypatch.setenv("SMEARCLI_RELEASES", os.path.join("..", root.name))
        if kind == "file":
            root.write_text("not a directory")
        elif kind == "dangling":
            root.symlink_to(Path("unmounted", "releases"))
        elif kind == "readonly":  # as root, only a read-only file system refuses: os.access says so
            root.mkdir()
            real_access = os.access
            monkeypatch.setattr(os, "access", lambda p, mode, *a, **k: False if Path(p).resolve() == root.resolve()
                                and mode & os.W_OK else real_access(p, mode, *a, **k))
        elif kind == "full":  # the disk fills while the venv is made: its first files are written
            import errno
            import venv

            def create(self, env_dir):
                Path(env_dir, "bin").mkdir(parents=True)
                Path(env_dir, "pyvenv.cfg").write_text("home = /usr/bin\n")
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(Path(env_dir, "lib")))
            monkeypatch.setattr(venv.EnvBuilder, "create", create)
    elif name == "bug":
        import smearcli.measure.compare as lib

        def broken(*a, **k):
            raise KeyError("per_layer")
        monkeypatch.setattr(lib, "compare", broken)
    else:
        raise AssertionError(name)


def run_case(case: Case, cwd: Path, monkeypatch) -> tuple[int, str]:
    if case.prepare is not None:
        case.prepare(cwd)
    before = {p: p.lstat().st_mtime_ns for p in cwd.rglob("*")}  # lstat: links may dangle
    with monkeypatch.context() as mp:
        mp.chdir(cwd)
        simulate(case.simulate, mp, cwd)
        r = invoke(case.args, allowed=(case.status,)) if case.status != 1 else _invoke_status_1(case.args)
    line = r.stderr.strip().splitlines()[-1]
    assert line.startswith("smearcli: error: "), line
    msg = line.removeprefix("smearcli: error: ")
    assert case.expect in msg, (case.what, msg)
    after = {p: p.lstat().st_mtime_ns for p in cwd.rglob("*")}
    assert after == before, f"{case.what}: files changed: {set(after) ^ set(before)}"
    assert not (cwd / "PWNED").exists() and not any(cwd.rglob("PWNED")), "a pickle payload ran"
    assert not leftovers(cwd)
    return r.exit_code, msg


def _invoke_status_1(args):
    from hardening_util import runner
    from smearcli.cli.app import app

    r = runner.invoke(app, [str(a) for a in args])
    assert r.exit_code == 1, (args, r.exit_code, r.output)
    assert "Traceback" not in r.output
    assert [line.startswith("smearcli: error: ") for line in r.stderr.strip().splitlines()] == [True]
    return r


# -- Hugging Face model directories: a tiny llama saved, then corrupted (tests/hf_bad_dirs.py)
HF = ["compare", "--impl", "hf", "--hf-model", "hf", "--seq-len", "8", "--chunks", "2"]


def hf_dir(name):
    def prepare(cwd: Path):
        from hf_bad_dirs import bad_dir, good_dir

        src = cwd.parent / "hf_good"  # saved once, copied for each case
        if not src.exists():
            good_dir(src)
        bad_dir(src, cwd / "hf", name)
    return prepare


HF_ROWS = [  # (what, case in hf_bad_dirs, extra flags, a fragment of the message)
    ("auto_map naming the directory's own .py, model_type unknown (never run, never prompted)",
     "remote_code", [], "never runs code"),
    ("model.safetensors.index.json naming a pickled .bin shard (never unpickled)", "index_to_bin", [],
     "not a .safetensors file"),
    ("config.json nested 100,000 deep", "nested_100k", [], "nested too deeply"),
    ("config.json over 64 MiB (refused before reading)", "config_200mib", [], "at most 64 MiB"),
    ("config.json asking for bitsandbytes quantization", "bitsandbytes", [], "bitsandbytes"),
    ("config.json asking for flash_attention_2", "flash_attention_2", [], "flash_attention_2"),
    ('num_hidden_layers "two"', "layers_two", [], "num_hidden_layers"),
    ("num_hidden_layers -1", "layers_negative", [], "num_hidden_layers"),
    ("safetensors header longer than the file", "header_too_long", [], "truncated"),
    ("safetensors tensors whose bytes overlap", "overlap", [], "overlap"),
    ("a weight of the wrong shape", "wrong_shape", [], "has shape (65,)"),
    ("a whole layer missing, --check (not initialised at random)", "missing_layer", ["--check"], "at random"),
    ("a tensor the model does not have", "unexpected_key", [], "does not have"),
    ("NaN weights, --check", "nan", ["--check"], "NaN or Inf"),
    ("int64 weights (refused, not cast)", "int64", [], "is int64"),
]
CASES.extend(Case("hugging face", what, [*HF, *extra], prepare=hf_dir(name), expect=expect)
             for what, name, extra, expect in HF_ROWS)


# -- vLLM's environment (--impl vllm --vllm-python): checked by a handshake before any model loads
VLLM = ["compare", "--impl", "vllm", "--hf-model", "m", "--vllm-python"]


def vllm_env(name: str = "", answer: str = ""):
    """`m/` (the model directory: only its existence and a model.safetensors in it are checked
    first), `venv/bin/python` (a script that exits 0) and, as `name`, a script that prints `answer`."""
    def prepare(cwd: Path):
        (cwd / "m").mkdir()
        (cwd / "m" / "model.safetensors").write_bytes(b"")
        (cwd / "venv" / "bin").mkdir(parents=True)
        scripts = {"venv/bin/python": "", **({name: answer} if name else {})}
        for path, text in scripts.items():
            (cwd / path).write_text(f"#!/bin/sh\n{text}\n" if text != "SLEEP" else "#!/bin/sh\nexec sleep 30\n")
            (cwd / path).chmod(0o755)
    return prepare


HELLO = '{"worker": "smearcli-vllm", "protocol": %s, "python": "3.11", "vllm": %s}'
VLLM_PROTOCOL = 2  # the worker's (smearcli.engines.vllm.environment.PROTOCOL; checked below)
CASES += [
    Case("vllm environment", "--vllm-python missing", [*VLLM, "nope/bin/python"], prepare=vllm_env(),
         expect="not found; make vLLM's environment with scripts/make_env.sh vllm DIR"),
    Case("vllm environment", "--vllm-python the environment's directory, not its Python", [*VLLM, "venv"],
         prepare=vllm_env(), expect="give venv/bin/python"),
    Case("vllm environment", "--vllm-python not a Python (/bin/true: exits 0, says nothing)", [*VLLM, "/bin/true"],
         prepare=vllm_env(), expect="without answering smearcli's handshake"),
    Case("vllm environment", "--vllm-python a program that prints something else", [*VLLM, "notpy"],
         prepare=vllm_env("notpy", "echo 'Segmentation fault (core dumped)'"), expect="answered 'Segmentation fault"),
    Case("vllm environment", "--vllm-python that hangs (the 60 s handshake limit shortened to 0.5 s)",
         [*VLLM, "hangs"], prepare=vllm_env("hangs", "SLEEP"), simulate="hello_timeout", expect="no answer within"),
    Case("vllm environment", "a Python without vLLM (a stand-in answering as one)", [*VLLM, "novllm"],
         prepare=vllm_env("novllm", f"echo '{HELLO % (VLLM_PROTOCOL, 'null')}'"), expect="without vLLM"),
    Case("vllm environment", "a worker speaking another protocol (a stand-in)", [*VLLM, "proto"],
         prepare=vllm_env("proto", f"echo '{HELLO % (99, chr(34) + '0.32.0' + chr(34))}'"),
         expect="speaks protocol 99"),
]


def no_weights(cwd: Path):
    """`m/` with a config and no safetensors weights; vLLM's environment is never started."""
    (cwd / "m").mkdir()
    (cwd / "m" / "config.json").write_text('{"model_type": "llama", "architectures": ["LlamaForCausalLM"]}')


def vllm_serves(name: str, after_ready: str):
    """`name`, a vLLM Python whose worker answers the handshake and says ready, then, at the first
    job, runs the shell commands `after_ready`."""
    hello = HELLO % (VLLM_PROTOCOL, '"0.32.0"')
    ready = '{"ready": true, "protocol": %d, "vllm": "0.32.0", "import_s": 0.0}' % VLLM_PROTOCOL

    def prepare(cwd: Path):
        (cwd / name).write_text(f"#!/bin/sh\ncase \"$2\" in\n  hello) echo '{hello}' ;;\n"
                                f"  serve) echo '{ready}'; read job; {after_ready} ;;\nesac\n")
        (cwd / name).chmod(0o755)
    return prepare


SCAN_VLLM = ["scan", "--engine", "vllm", "--engine-python"]
CASES += [
    Case("vllm environment", "scan's vLLM worker dies after its ready line (a stand-in)", [*SCAN_VLLM, "dies"],
         prepare=vllm_serves("dies", "echo 'Fatal Python error: Segmentation fault' >&2; exit 139"),
         expect="its environment failed, not a model"),
    Case("vllm environment", "scan's vLLM worker writes 5 MiB without a newline after its ready line (a stand-in)",
         [*SCAN_VLLM, "floods"], prepare=vllm_serves("floods", "head -c 5242880 /dev/zero | tr '\\000' x; sleep 30"),
         expect="without a newline"),
    Case("vllm environment", "a model directory without safetensors weights (checked before the environment)",
         [*VLLM, "nope/bin/python"], prepare=no_weights, expect="has no safetensors weights"),
]


# -- llama.cpp's environment (--impl llamacpp --llamacpp-python) and a user's --gguf, checked up front
LLAMACPP = ["compare", "--impl", "llamacpp", "--hf-model", "m", "--llamacpp-python"]
LC_HELLO = ('{"worker": "smearcli-llamacpp", "protocol": %s, "python": "3.11", "llama_cpp_python": %s, '
            '"gguf": "0.19.0", "torch": "2.13.0", "transformers": "5.24.0", "converter": %s}')
LLAMACPP_PROTOCOL = 1  # the worker's (smearcli.engines.llamacpp.environment.PROTOCOL; checked below)
LC_GOOD = LC_HELLO % (LLAMACPP_PROTOCOL, '"0.3.36"', '"/env/share/llamacpp-convert"')


def gguf_case(kind: str):
    """`hf/` (a tiny llama, vocabulary 128), `py` answering the handshake as a good environment,
    and `m.gguf`, a GGUF header built byte by byte that is wrong as `kind` says."""
    import struct

    def prepare(cwd: Path):
        from hf_bad_dirs import good_dir

        src = cwd.parent / "hf_good"
        if not src.exists():
            good_dir(src)
        import shutil

        shutil.copytree(src, cwd / "hf")
        (cwd / "py").write_text(f"#!/bin/sh\necho '{LC_GOOD}'\n")
        (cwd / "py").chmod(0o755)

        def s(t):
            return struct.pack("<Q", len(t.encode())) + t.encode()
        vocab = {"huge": 5_000_000, "vocab": 64}.get(kind, 128)
        rows = vocab + (1000 if kind == "lies" else 0)
        head = (b"GGUF" + struct.pack("<IQQ", 3, 1, 2) + s("general.architecture") + struct.pack("<I", 8) + s("llama")
                + s("llama.vocab_size") + struct.pack("<II", 4, vocab)
                + s("token_embd.weight") + struct.pack("<IQQ", 2, 4, rows) + struct.pack("<IQ", 0, 0))
        data = head + b"\0" * (-len(head) % 32) + b"\0" * (16 * min(vocab, 128))
        (cwd / "m.gguf").write_bytes(data[:300] if kind == "truncated" else data)
    return prepare


def torn_state(cwd: Path):
    """`hf/` (a tiny llama) and `py`: the stand-in worker (tests/llamacpp_standin.py) in its `torn`
    mode, which finds the restore schedule's state file shorter than the save wrote, as a full disk
    leaves it."""
    import sys as _sys

    from hf_bad_dirs import good_dir

    src = cwd.parent / "hf_good"
    if not src.exists():
        good_dir(src)
    import shutil

    shutil.copytree(src, cwd / "hf")
    standin = Path(__file__).resolve().parent / "llamacpp_standin.py"
    (cwd / "py").write_text(f"#!/bin/sh\nshift\nSMEARCLI_STANDIN_MODE=torn exec {_sys.executable} {standin} \"$@\"\n")
    (cwd / "py").chmod(0o755)


GGUF_ARGS = ["compare", "--impl", "llamacpp", "--hf-model", "hf", "--llamacpp-python", "py", "--gguf", "m.gguf"]
CASES += [
    Case("llama.cpp environment", "--llamacpp-python missing", [*LLAMACPP, "nope/bin/python"], prepare=vllm_env(),
         expect="not found; make llama.cpp's environment with scripts/make_env.sh llamacpp DIR"),
    Case("llama.cpp environment", "--llamacpp-python the environment's directory, not its Python",
         [*LLAMACPP, "venv"], prepare=vllm_env(), expect="give venv/bin/python"),
    Case("llama.cpp environment", "a Python without llama-cpp-python (a stand-in answering as one)",
         [*LLAMACPP, "nollama"], prepare=vllm_env("nollama", f"echo '{LC_HELLO % (1, 'null', 'null')}'"),
         expect="no llama-cpp-python there (found Python 3.11, llama-cpp-python missing"),
    Case("llama.cpp environment", "llama-cpp-python of another version (a stand-in answering 0.3.20)",
         [*LLAMACPP, "other"], prepare=vllm_env("other", f"echo '{LC_HELLO % (1, chr(34) + '0.3.20' + chr(34), 'null')}'"),
         expect="llama-cpp-python 0.3.20, and smearcli's worker is written against 0.3.36"),
    Case("llama.cpp environment", "a llama.cpp worker speaking another protocol (a stand-in)", [*LLAMACPP, "proto"],
         prepare=vllm_env("proto", f"echo '{LC_HELLO % (99, chr(34) + '0.3.36' + chr(34), 'null')}'"),
         expect="speaks protocol 99"),
    Case("llama.cpp environment", "the restore schedule's state file torn on disk (a full disk; a stand-in worker)",
         ["compare", "--impl", "llamacpp", "--hf-model", "hf", "--llamacpp-python", "py", "--schedules", "restore",
          "--seq-len", "16"], prepare=torn_state, expect="torn (is the disk full?); nothing was restored"),
    Case("gguf", "--gguf whose header lies about a tensor's size (1,000 rows more than the file holds)",
         GGUF_ARGS, prepare=gguf_case("lies"), expect="past the end of the file's data"),
    Case("gguf", "--gguf truncated", GGUF_ARGS, prepare=gguf_case("truncated"), expect="truncated"),
    Case("gguf", "--gguf declaring a huge vocabulary (5,000,000 tokens)", GGUF_ARGS, prepare=gguf_case("huge"),
         expect="over the 1,048,576 limit"),
    Case("gguf", "--gguf with another vocabulary than the config's", GGUF_ARGS, prepare=gguf_case("vocab"),
         expect="the config's vocab_size 128"),
]


def run_all(tmp: Path, monkeypatch) -> list[tuple["Case", int, str]]:
    """(case, exit status, message) of every case, each in its own directory under `tmp` with a
    copy of a good checkpoint; `monkeypatch` (pytest's) sets up the simulated conditions."""
    # every implementation's schedules registered first (llama.cpp brings ubatch and batched on
    # import): the refusal of an unknown schedule lists the registered ones, which otherwise depend
    # on what tests ran before in this process
    import smearcli.engines.llamacpp  # noqa: F401

    good = write_checkpoint(tmp / "src" / "good")
    rows = []
    for i, case in enumerate(CASES):
        cwd = tmp / f"case{i:02d}"
        cwd.mkdir()
        shutil.copytree(good, cwd / "good")
        status, msg = run_case(case, cwd, monkeypatch)
        rows.append((case, status, msg))
    return rows
