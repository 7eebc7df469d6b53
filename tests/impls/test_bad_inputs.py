"""Bad inputs, each one line and the right exit status: the file system (long names, symlinks, FIFOs), odd tensors,
JSON beyond Python's digit limit, shell bytes that are not UTF-8, writes that fail midway, the
user's own code in the audit (exceptions, sys.exit, prints, endless loops, NaN weights), zip CRCs,
and memory from real numbers (uncompressed sizes, file sizes, this process's cgroup).

Every CLI run goes through hardening_util.invoke: an allowed exit status, no traceback, one
`smearcli: error:` line. Anything that could hang (a FIFO) runs under a SIGALRM of its own, so a
regression fails instead of blocking the suite."""

from __future__ import annotations

import contextlib
import json
import os
import resource
import shutil
import signal
import struct
import time
import zipfile
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import smearcli.util.preflight as preflight
from hardening_util import FAST, META, PT, copy_checkpoint, edit_config, edit_state, invoke, leftovers, write_checkpoint
from smearcli.util.errors import UserCodeError, UserError
from smearcli.util.files import uncompressed_size, zip_members
from smearcli.engines.nanochat import adapter, guard, sandbox
from smearcli.measure.inputs import TEXT_MAX_BYTES, TOKENS_MAX_BYTES, load_tokens, text_tokens
from smearcli.gpt.weights import load_checkpoint, random_config

STANDIN = Path(__file__).resolve().parents[1] / "standin" / "old"
C = ["compare", *FAST]
AUDIT = ["compare", "--impl", "nanochat", "--depth", "1", "--seq-len", "12", "--chunks", "2",
         "--gen-len", "4", "--draft", "2", "--schedules", "chunked"]


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    return write_checkpoint(tmp_path_factory.mktemp("ckpt2") / "d1")


@contextlib.contextmanager
def no_hang(seconds: int = 20):
    """Fail (instead of blocking the suite) when the block takes longer than `seconds`."""
    def ring(*_):
        raise AssertionError(f"hung for more than {seconds} s")
    old = signal.signal(signal.SIGALRM, ring)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


def error_line(r) -> str:
    return r.stderr.strip().splitlines()[-1].removeprefix("smearcli: error: ")


# -- the file system -------------------------------------------------------------------------------
PATH_OPTIONS = [["compare", *FAST, "--checkpoint"], ["compare", *FAST, "--tokens"],
                ["compare", *FAST, "--text-file"], ["compare", *FAST, "--save"],
                ["plot", *FAST, "--out"], ["bench", *FAST, "--output"],
                ["compare", *FAST, "--impl", "nanochat", "--nanochat-path"]]
LONG = "x" * 300  # longer than any file system's NAME_MAX (255)


@pytest.mark.parametrize("opt", PATH_OPTIONS, ids=lambda o: o[-1])
@pytest.mark.parametrize("name", [LONG, f"a/{LONG}/b.pt", "dangling.json", "loop.json"])
def test_path_the_file_system_refuses_is_one_line(tmp_path, monkeypatch, opt, name):
    monkeypatch.chdir(tmp_path)
    os.symlink("nowhere", "dangling.json")
    os.symlink("loop.json", "loop.json")
    r = invoke([*opt, name], allowed=(2,))
    msg = error_line(r)
    words = ("File name too long", "symlink", "not found", "does not exist", "unknown suffix")
    assert any(w in msg for w in words) or msg.endswith("..."), msg  # a message over 600 characters is cut
    assert not leftovers(tmp_path)


@settings(max_examples=25, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.sampled_from(PATH_OPTIONS),
       st.lists(st.one_of(st.text(min_size=1, max_size=8), st.sampled_from([LONG, "..", ".", "~", "\x00", " "])),
                min_size=1, max_size=4).map("/".join))
def test_fuzzed_path_strings_never_crash(tmp_path, opt, path):
    with no_hang():
        invoke([*opt, path], allowed=(2,))
    assert not leftovers(tmp_path)


def test_dangling_symlink_and_loop_as_the_model_file(tmp_path, ckpt):
    d = copy_checkpoint(ckpt, tmp_path / "dang")
    (d / PT).unlink()
    (d / PT).symlink_to(tmp_path / "gone.pt")
    r = invoke([*C, "--checkpoint", d], allowed=(2,))
    assert f"{PT}: a symlink to" in r.stderr and "which does not exist" in r.stderr
    (d / PT).unlink()
    (d / PT).symlink_to(d / PT)
    r = invoke([*C, "--checkpoint", d], allowed=(2,))
    assert f"{PT}: a symlink loop" in r.stderr
    loop = tmp_path / "dirloop"
    loop.symlink_to(loop)
    assert "a symlink loop" in invoke([*C, "--checkpoint", loop], allowed=(2,)).stderr


@pytest.mark.parametrize("where", ["model", "tokens", "text-file", "tokens-pt"])
def test_fifo_is_refused_before_it_is_opened(tmp_path, ckpt, where):
    d = copy_checkpoint(ckpt, tmp_path / "ck")
    fifo = {"model": d / PT, "tokens": tmp_path / "t.json", "text-file": tmp_path / "t.txt",
            "tokens-pt": tmp_path / "t.pt"}[where]
    if fifo.exists():
        fifo.unlink()
    os.mkfifo(fifo)
    args = [*C, "--checkpoint", d] if where == "model" else [*C, f"--{where.removesuffix('-pt')}", fifo]
    with no_hang():
        r = invoke(args, allowed=(2,))
    assert "a FIFO (named pipe), not a regular file" in r.stderr


# -- JSON ------------------------------------------------------------------------------------------
def test_json_integers_beyond_the_digit_limit(tmp_path, ckpt):
    big = "9" * 5000
    (tmp_path / "ids.json").write_text(f"[1, {big}]")
    r = invoke([*C, "--tokens", tmp_path / "ids.json"], allowed=(2,))
    assert "invalid JSON (Exceeds the limit (4300 digits)" in r.stderr
    d = copy_checkpoint(ckpt, tmp_path / "meta")
    (d / META).write_text((d / META).read_text().replace('"n_layer": 1', f'"n_layer": {big}'))
    r = invoke([*C, "--checkpoint", d], allowed=(2,))
    assert f"{META}: invalid JSON (Exceeds the limit" in r.stderr


JSON_VALUES = st.recursive(
    st.one_of(st.integers(-2**70, 2**70), st.integers(0, 300), st.booleans(), st.none(),
              st.floats(allow_nan=False), st.text(max_size=4)),
    lambda inner: st.lists(inner, max_size=5), max_leaves=20)


@settings(max_examples=40, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(JSON_VALUES, st.sampled_from(["", " 1" + "0" * 4400, "[" * 3000]))
def test_fuzzed_token_json_is_ids_or_a_user_error(tmp_path, value, tail):
    p = tmp_path / "ids.json"
    text = json.dumps(value)
    p.write_text(text[:-1] + tail + text[-1:] if tail and text.endswith("]") else text)
    try:
        t = load_tokens(p, 256)
    except UserError as e:
        assert "\n" not in str(e)
        return
    assert t.dtype == torch.long and t.dim() == 2 and bool(((t >= 0) & (t < 256)).all())


# -- --text bytes that are not UTF-8 ---------------------------------------------------------------
def test_text_with_shell_bytes_that_are_not_utf8():
    raw = b"caf\xe9 \xff\xfe ok"  # latin-1 bytes, as a shell in a UTF-8 locale hands them over
    arg = raw.decode("utf-8", "surrogateescape")  # what Python puts in sys.argv
    cfg = random_config(1)
    assert text_tokens(arg, cfg).tolist() == [list(raw)]  # the bytes, as they were
    r = invoke([*C, "--schedules", "chunked", "--chunks", "2", "--text", arg, "--json"], allowed=(0,))
    assert json.loads(r.stdout)["input"] == {"batch": 1, "seq_len": len(raw)}
    with pytest.raises(UserError, match="UTF-8 cannot encode"):
        text_tokens("a\ud800b", cfg)  # a lone surrogate that no byte maps to
    assert "UTF-8 cannot encode" in invoke([*C, "--text", "a\ud800b"], allowed=(2,)).stderr


# -- tensors of unusual kinds ---------------------------------------------------------------------
ODD = {
    "meta": lambda t: torch.empty(t.shape, device="meta"),
    "sparse": lambda t: t.to_sparse(),
    "nested": lambda t: torch.nested.nested_tensor([t.flatten()[:3], t.flatten()[:5]]),
    "quantized": lambda t: torch.quantize_per_tensor(t.float(), 0.1, 0, torch.qint8),
    "bool": lambda t: t > 0,
}
WORDS = {"meta": "a meta tensor", "sparse": "a sparse_coo tensor", "nested": "a nested tensor",
         "quantized": "a quantized tensor", "bool": "bool"}


@pytest.mark.filterwarnings("ignore")
@pytest.mark.parametrize("kind", list(ODD))
def test_odd_tensors_in_a_checkpoint(tmp_path, ckpt, kind):
    d = copy_checkpoint(ckpt, tmp_path / kind)
    edit_state(d, lambda sd: sd.__setitem__("lm_head.weight", ODD[kind](sd["lm_head.weight"])))
    r = invoke([*C, "--checkpoint", d], allowed=(2,))
    assert f"lm_head.weight is {WORDS[kind]}" in error_line(r)


@pytest.mark.filterwarnings("ignore")
@pytest.mark.parametrize("kind", list(ODD))
def test_odd_tensors_as_token_ids(tmp_path, kind):
    ids = torch.tensor([[1, 2, 3, 4, 5, 6]])
    t = ODD[kind](ids) if kind != "quantized" else ODD[kind](ids.float())
    torch.save(t, tmp_path / "ids.pt")
    r = invoke([*C, "--tokens", tmp_path / "ids.pt"], allowed=(2,))
    assert "expected a 1-D or 2-D integer tensor, found" in r.stderr and WORDS[kind] in r.stderr


# -- writes that fail midway ----------------------------------------------------------------------
def test_file_size_limit_midway_keeps_the_old_file(tmp_path):
    """A real EFBIG: the process's file-size limit (RLIMIT_FSIZE) below the --save file's size.
    torch's zip writer turns the OSError into a RuntimeError; the old file stays, no temp file."""
    out = tmp_path / "runs.pt"
    out.write_bytes(b"previous")
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (20_000, hard))  # Python ignores SIGXFSZ: writes fail EFBIG
    try:
        r = invoke([*C, "--schedules", "chunked", "--save", out], allowed=(2,))
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
    assert error_line(r).endswith("File too large"), r.stderr
    assert out.read_bytes() == b"previous" and not leftovers(tmp_path)


def test_disk_full_inside_torch_zip_writer(tmp_path, monkeypatch):
    import errno
    import io

    from smearcli.util.files import atomic_write

    class Full(io.RawIOBase):  # the target file, filling up after 1000 bytes
        def writable(self):
            return True

        written = 0

        def write(self, b):
            self.written += len(b)
            if self.written > 1000:
                raise OSError(errno.ENOSPC, "No space left on device")
            return len(b)
    with pytest.raises(RuntimeError) as e:
        torch.save({"x": torch.ones(1000)}, Full())
    assert isinstance(e.value.__context__, OSError)  # what torch does: a RuntimeError over the OSError
    out = tmp_path / "o.pt"
    with pytest.raises(OSError, match="No space left"):
        with atomic_write(out, "wb") as f:
            f.write(b"partial")
            raise RuntimeError("[enforce fail at inline_container.cc] unexpected pos") from OSError(
                errno.ENOSPC, "No space left on device")
    assert not out.exists() and not leftovers(tmp_path)


# -- CRC -------------------------------------------------------------------------------------------
def flip_a_data_byte(path: Path) -> None:
    """Flip one byte inside the biggest stored member's data (the zip structure stays intact)."""
    with zipfile.ZipFile(path) as z:
        info = max(z.infolist(), key=lambda i: i.file_size)
    data = bytearray(path.read_bytes())
    name_len, extra_len = struct.unpack("<HH", data[info.header_offset + 26: info.header_offset + 30])
    start = info.header_offset + 30 + name_len + extra_len
    data[start + info.file_size // 2] ^= 0x10
    path.write_bytes(bytes(data))


def test_crc_mismatch_is_corrupt(tmp_path, ckpt):
    d = copy_checkpoint(ckpt, tmp_path / "flip")
    torch.load(d / PT, weights_only=True)
    flip_a_data_byte(d / PT)
    torch.load(d / PT, weights_only=True)  # the control: torch itself does not notice
    r = invoke([*C, "--checkpoint", d], allowed=(2,))
    assert "corrupt (a CRC-32 check failed" in r.stderr
    ids = tmp_path / "ids.pt"
    torch.save(torch.arange(64).view(1, 64) % 256, ids)
    flip_a_data_byte(ids)
    assert "CRC-32" in invoke([*C, "--tokens", ids], allowed=(2,)).stderr


# -- memory from the real numbers ------------------------------------------------------------------
def test_compressed_member_is_counted_at_its_inflated_size(tmp_path, ckpt, monkeypatch):
    d = copy_checkpoint(ckpt, tmp_path / "bomb")
    with zipfile.ZipFile(d / PT, "a", compression=zipfile.ZIP_DEFLATED) as z:
        z.writestr("model_000001/data/999", bytes(64 << 20))  # 64 MiB of zeros, ~64 KiB on disk
    size = os.path.getsize(d / PT) - os.path.getsize(ckpt / PT)  # what the added member takes on disk
    assert size < 1 << 20 and uncompressed_size(d / PT) > 64 << 20 and zip_members(d / PT) > 64 << 20
    monkeypatch.setattr(preflight, "host_available", lambda: 48 << 20)
    t0 = time.perf_counter()
    with pytest.raises(UserError, match=r"loading it \(6[4-6]\.\d MiB of tensors"):  # 64 MiB + the weights
        load_checkpoint(d)
    assert time.perf_counter() - t0 < 3


def test_input_files_are_capped_before_reading(tmp_path):
    big = tmp_path / "big.json"
    with open(big, "wb") as f:
        f.truncate(TOKENS_MAX_BYTES + 1)  # sparse: nothing is written, the size is real
    r = invoke([*C, "--tokens", big], allowed=(2,))
    assert "too large for a token file (at most 64 MiB)" in r.stderr
    text = tmp_path / "big.txt"
    with open(text, "wb") as f:
        f.truncate(TEXT_MAX_BYTES + 1)
    assert "too large for a text file (at most 16 MiB)" in invoke([*C, "--text-file", text], allowed=(2,)).stderr


def _cgroup_tree(root: Path, files: dict) -> None:
    for rel, value in files.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(f"{value}\n")


def test_cgroup_v2_limit_of_this_process_and_its_ancestors(tmp_path):
    proc = tmp_path / "cgroup"
    proc.write_text("0::/user.slice/job/task\n")
    fs = tmp_path / "fs"
    _cgroup_tree(fs, {"memory.max": "max", "memory.current": 5 << 30,
                      "user.slice/memory.max": 8 << 30, "user.slice/memory.current": 1 << 30,
                      "user.slice/job/memory.max": 768 << 20, "user.slice/job/memory.current": 100 << 20,
                      "user.slice/job/task/memory.max": "max", "user.slice/job/task/memory.current": 50 << 20})
    assert preflight.cgroup_room(str(proc), str(fs)) == (768 - 100) << 20  # the tightest ancestor
    _cgroup_tree(fs, {"user.slice/job/task/memory.max": 200 << 20})
    assert preflight.cgroup_room(str(proc), str(fs)) == 150 << 20  # its own limit, tighter still
    (proc).write_text("0::/elsewhere\n")
    assert preflight.cgroup_room(str(proc), str(fs)) is None  # root has no limit ("max")


def test_cgroup_v1_memory_controller(tmp_path):
    proc = tmp_path / "cgroup"
    proc.write_text("5:cpu,cpuacct:/x\n4:memory:/docker/abc\n0::/\n")
    fs = tmp_path / "fs"
    _cgroup_tree(fs, {"memory/memory.limit_in_bytes": 9223372036854771712, "memory/memory.usage_in_bytes": 1,
                      "memory/docker/abc/memory.limit_in_bytes": 1 << 30,
                      "memory/docker/abc/memory.usage_in_bytes": 256 << 20})
    assert preflight.cgroup_room(str(proc), str(fs)) == 768 << 20


def test_cgroup_limit_refuses_a_run_up_front(tmp_path, monkeypatch):
    monkeypatch.setattr(preflight, "cgroup_room", lambda: 4 << 20)
    r = invoke(["compare", "--depth", "2", "--seq-len", "16"], allowed=(2,))
    assert "needs about" in r.stderr and "4.0 MiB available" in r.stderr


# -- the user's own code ---------------------------------------------------------------------------
def standin(tmp_path: Path, file: str = "gpt.py", old: str = "", new: str = "") -> Path:
    root = tmp_path / "mine"
    shutil.copytree(STANDIN, root)
    if old:
        p = root / "nanochat" / file
        text = p.read_text()
        assert text.count(old) == 1, old
        p.write_text(text.replace(old, new))
    return root


FORWARD = "        B, T = idx.shape\n"
IMPORT = "import torch.nn.functional as F\n"


@pytest.mark.parametrize("file,old,new,expect", [
    ("gpt.py", FORWARD, FORWARD + "        raise ValueError('oops in forward')\n",
     "your nanochat code: GPT.forward failed: ValueError: oops in forward (at nanochat/gpt.py:"),
    ("engine.py", "    def get_pos(self):\n", "    def get_pos(self):\n        raise KeyError('pos')\n",
     "your nanochat code: KVCache.get_pos failed: KeyError: 'pos' (at nanochat/engine.py:"),
    ("engine.py", "        self.batch_size = batch_size\n", "        raise RuntimeError('no cache today')\n",
     "your nanochat code: KVCache() failed: RuntimeError: no cache today (at nanochat/engine.py:"),
    ("gpt.py", FORWARD, FORWARD + "        return (idx, None)\n",
     "your nanochat code: GPT.forward returned a tuple at nanochat/gpt.py:"),
    ("gpt.py", IMPORT, IMPORT + "import sys\nsys.exit(0)\n",
     "your nanochat code: importing nanochat called sys.exit(0) at nanochat/gpt.py:"),
    ("gpt.py", FORWARD, FORWARD + "        raise SystemExit(3)\n",
     "your nanochat code: GPT.forward called sys.exit(3) at nanochat/gpt.py:"),
])
def test_failures_of_the_users_code_are_theirs(tmp_path, file, old, new, expect):
    root = standin(tmp_path, file, old, new)
    r = invoke([*AUDIT, "--nanochat-path", root, "--check", "--json"], allowed=(1,))
    assert expect in error_line(r), r.stderr
    assert r.stdout == ""  # nothing half-printed: --json comes whole or not at all


def test_sys_exit_at_import_fails_a_check_run(tmp_path):
    root = standin(tmp_path, "gpt.py", IMPORT, IMPORT + "import sys\nsys.exit(0)\n")
    r = invoke([*AUDIT, "--nanochat-path", root, "--check", "--logic", "fixed"], allowed=(1,))
    assert "called sys.exit(0)" in r.stderr and "nothing was checked" in r.stderr


def test_prints_in_their_code_stay_off_stdout(tmp_path):
    root = standin(tmp_path, "gpt.py", FORWARD, FORWARD + "        print('debug: forward', T)\n")
    edit = root / "nanochat" / "gpt.py"
    edit.write_text(edit.read_text().replace(IMPORT, IMPORT + "print('hello from import')\n"))
    r = invoke([*AUDIT, "--nanochat-path", root, "--json"], allowed=(0,))
    assert json.loads(r.stdout)["schema"] == "smearcli.audit/1"
    assert "debug: forward" in r.stderr and "hello from import" in r.stderr


@pytest.mark.parametrize("file,old,new,what", [
    ("gpt.py", IMPORT, IMPORT + "while True:\n    pass\n", "importing nanochat"),
    ("gpt.py", FORWARD, FORWARD + "        while True:\n            try:\n                pass\n"
     "            except Exception:\n                pass\n", "GPT.forward"),
])
@pytest.mark.slow  # a subprocess of its own, seconds each (the fast loop leaves it out)
def test_endless_loops_are_stopped_by_the_time_limit(tmp_path, file, old, new, what):
    root = standin(tmp_path, file, old, new)
    t0 = time.perf_counter()
    with no_hang(30):
        # 3 s: under load, building their GPT before the looping forward can take over a second
        r = invoke([*AUDIT, "--nanochat-path", root, "--user-code-timeout", "3"], allowed=(1,))
    assert time.perf_counter() - t0 < 20
    msg = error_line(r)
    assert f"your nanochat code: {what} did not finish within 3 s and was stopped at nanochat/gpt.py:" in msg
    assert msg.endswith("--user-code-timeout SECONDS changes the limit")
    assert signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)  # no timer left behind
    assert signal.getsignal(signal.SIGALRM) in (signal.SIG_DFL, signal.default_int_handler, None)


@pytest.mark.parametrize("value", ["0", "-1", "nan", "inf", "1e9"])
def test_timeout_option_is_checked(value):
    r = invoke([*C, "--user-code-timeout", value], allowed=(2,))
    assert "--user-code-timeout must be a number of seconds" in r.stderr


def test_timeout_default_is_the_guards():
    from smearcli.cli.options import RunSpec
    assert RunSpec().user_code_timeout == guard.DEFAULT_TIMEOUT


def test_time_limit_restores_an_outer_timer():
    if not guard.can_time_out():
        pytest.skip("no SIGALRM here")
    fired = []
    old = signal.signal(signal.SIGALRM, lambda *a: fired.append(1))
    signal.setitimer(signal.ITIMER_REAL, 5.0)
    try:
        with guard.time_limit(2.0):
            pass
        left = signal.getitimer(signal.ITIMER_REAL)[0]
        assert 3.0 < left <= 5.0
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def test_nan_weights_are_refused_under_impl_nanochat(tmp_path, ckpt):
    d = copy_checkpoint(ckpt, tmp_path / "nan")

    def poison(sd):
        w = sd["lm_head.weight"].clone()
        w[0, 0] = float("nan")
        sd["lm_head.weight"] = w
    edit_state(d, poison)
    r = invoke([*AUDIT, "--nanochat-path", STANDIN, "--checkpoint", d], allowed=(2,))
    assert "lm_head.weight contains NaN or Inf (1 of" in r.stderr


def test_meta_is_checked_against_the_weights_before_their_model_is_built(tmp_path, ckpt, monkeypatch):
    d = copy_checkpoint(ckpt, tmp_path / "wide")
    edit_config(d, vocab_size=512)
    code = sandbox.import_nanochat(STANDIN)

    def never(*a, **k):
        raise AssertionError("the user's GPT was built")
    code.GPT = never
    C = json.loads((d / "meta_000001.json").read_text())["model_config"]["n_embd"]
    with pytest.raises(UserError, match=rf"transformer.wte.weight has shape \(256, {C}\), model_config expects \(512, {C}\)"):
        adapter.nanochat_from_checkpoint(code, d)
    edit_config(d, vocab_size=10**9)  # would take terabytes: refused by the estimate, before any read
    monkeypatch.setattr(preflight, "host_available", lambda: 16 << 30)
    with pytest.raises(UserError, match="needs about"):
        adapter.nanochat_from_checkpoint(code, d)


def test_user_code_error_is_exit_status_1_not_2():
    assert issubclass(UserCodeError, UserError) and UserCodeError.status == 1
