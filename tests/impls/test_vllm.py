"""`--impl vllm` without vLLM: the adapter against a stand-in worker (tests/vllm_standin.py) that
speaks the worker's protocol and computes with transformers, including one whose prefix request
returns garbage at the cached positions (dropped, so it passes), one that never reads the cache
(checked nothing), one that crashes in the prefix schedule, one that dies, and one with a
chunk-boundary error. The real vLLM checks are tests/impls/test_vllm_real.py."""

import json
import re
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

pytest.importorskip("transformers", reason="transformers is not installed: pip install 'smearcli[hf]'")

from smearcli.cli.app import app  # noqa: E402
from smearcli.util.errors import UserError  # noqa: E402
from smearcli.engines import vllm  # noqa: E402
from smearcli.impls import foreign  # noqa: E402
from smearcli.engines import transformers as hf  # noqa: E402
from smearcli.engines.vllm import environment as vllm_env  # noqa: E402
from smearcli.measure.schedules import ScheduleOptions  # noqa: E402
from conftest import standin_python  # noqa: E402

runner = CliRunner()
STANDIN = Path(__file__).resolve().parents[1] / "vllm_standin.py"
T = 64  # two cache blocks of 32: the prefix request covers the first


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("llama")
    hf.tiny_model("llama").save_pretrained(d, safe_serialization=True)
    return d


@pytest.fixture
def fake_python(tmp_path):
    """An executable that runs the stand-in with the worker's two arguments, as vLLM's Python would
    run the worker."""
    return standin_python(tmp_path, STANDIN)


def compare(model_dir, fake_python, monkeypatch, tmp_path, mode="good", *extra):
    monkeypatch.setenv("SMEARCLI_STANDIN_MODE", mode)
    monkeypatch.setenv("SMEARCLI_STANDIN_SEEN", str(tmp_path / "seen.json"))
    r = runner.invoke(app, ["compare", "--impl", "vllm", "--hf-model", str(model_dir), "--vllm-python",
                            str(fake_python), "--seq-len", str(T), "--chunks", "4", "--json", *extra])
    assert "Traceback" not in r.output, r.output
    return r, (json.loads(r.stdout) if r.stdout.strip().startswith("{") else None)


def test_every_schedule_against_the_transformers_reference(model_dir, fake_python, monkeypatch, tmp_path):
    r, doc = compare(model_dir, fake_python, monkeypatch, tmp_path)
    assert r.exit_code == 0, r.output
    runs = {x["schedule"]: x for x in doc["runs"]}
    assert list(runs) == ["prefill", "decode", "chunked", "prefix"] and doc["not_measured"] == []
    assert doc["layers"] == ["logits"] and all(x["logic"] == "vllm" and x["passed"] for x in runs.values())
    # the floor is the transformers reference's full pass in float64, never a schedule under test
    assert doc["noise_floor"]["source"].startswith("the full pass in float64 against float32")
    assert runs["chunked"]["steps"] == [16] * 4 and runs["decode"]["steps"] == [1] * T
    # the prefix request's garbage below num_cached_tokens was dropped: positions 0..31 come
    # from the first request, so the run is measured on every position and passes
    assert runs["prefix"]["steps"] == [32, 32] and runs["prefix"]["chunk_starts"] == [32]
    assert runs["prefix"]["max_abs_logits"] < 1e-4
    seen = json.loads((tmp_path / "seen.json").read_text())
    assert seen["protocol"] == vllm_env.PROTOCOL and len(seen["rows"][0]) == T and seen["vocab"] == 128
    assert {s["name"]: s for s in seen["schedules"]}["prefix"]["prefix"] == 32
    assert doc["verdict"].startswith("OK")


@pytest.mark.slow  # a subprocess of its own, seconds each (the fast loop leaves it out)
def test_a_prefix_of_the_engines_own_block_is_stitched_where_it_was_cut(model_dir, fake_python, monkeypatch,
                                                                         tmp_path):
    """vLLM raises a hybrid model's block (to hold its Mamba state) and caches whole blocks only, so
    the worker cuts the prefix at the engine's block and says where: the adapter stitches there."""
    r, doc = compare(model_dir, fake_python, monkeypatch, tmp_path, "bigblock", "--seq-len", str(2 * T))
    assert r.exit_code == 0, r.output
    runs = {x["schedule"]: x for x in doc["runs"]}
    assert runs["prefix"]["steps"] == [T, T] and runs["prefix"]["chunk_starts"] == [T]
    assert runs["prefix"]["max_abs_logits"] < 1e-4


def test_the_worker_cuts_the_prefix_at_the_engines_block_and_inspects_a_class_here(tmp_path, monkeypatch):
    """The worker's own helpers, with vLLM's objects stood in: a prefix of whole blocks of the
    engine's size (or as asked where none fits), a lazily registered class registered as a class
    before the engine starts (so vLLM inspects it in this process, not a fresh Python), and a
    scheduler step past the request's deadline raising."""
    import importlib.util
    import types

    spec = importlib.util.spec_from_file_location("smearcli_worker_under_test", vllm_env.WORKER)
    worker = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(worker)
    engine = (lambda block: types.SimpleNamespace(llm_engine=types.SimpleNamespace(
        vllm_config=types.SimpleNamespace(cache_config=types.SimpleNamespace(block_size=block)))))
    assert worker.whole_blocks(engine(32), 32, 64) == 32
    assert worker.whole_blocks(engine(64), 32, 128) == 64  # a hybrid's raised block
    assert worker.whole_blocks(engine(64), 32, 64) == 32  # no whole block short of the input: as asked
    assert worker.whole_blocks(types.SimpleNamespace(llm_engine=None), 32, 64) == 32

    class Lazy:
        module_name, calls = "vllm.model_executor.models.llama", []

        def load_model_cls(self):
            return "the class"
    registered = {}
    registry = types.SimpleNamespace(models={"LlamaForCausalLM": Lazy(), "Loaded": object()},
                                     register_model=lambda arch, cls: registered.update({arch: cls}))
    monkeypatch.setitem(sys.modules, "vllm", types.SimpleNamespace(ModelRegistry=registry))
    for archs in (["LlamaForCausalLM"], ["Loaded"], ["Unknown"]):
        (tmp_path / "config.json").write_text(json.dumps({"architectures": archs}))
        worker.inspect_here(str(tmp_path))
    assert registered == {"LlamaForCausalLM": "the class"}


def test_a_request_stuck_inside_vllm_is_interrupted_and_named(tmp_path):
    """The worker's watchdog (worker.watch), in a Python of its own: a request past its
    deadline, stuck in a loop inside "vLLM" (a file under a vllm directory), is interrupted and
    reads as that schedule's crash, with the frame it was stuck in (not the watchdog's own, though
    the worker's files sit under a vllm directory too); a Ctrl-C is not taken for it."""
    import subprocess

    fake = tmp_path / "site-packages" / "vllm" / "engine.py"
    fake.parent.mkdir(parents=True)
    fake.write_text("def step():\n    while True:\n        pass\n")
    script = (f"import sys, time; sys.path[:0] = [{str(Path(vllm_env.WORKER).parent)!r}, {str(fake.parent.parent)!r}]\n"
              "import worker as w\nfrom vllm import engine\n"
              "print(w.stuck(KeyboardInterrupt()))\n"
              "w.watch(); w.DEADLINE[:] = [time.time() + 0.5, False]\n"
              "try:\n    engine.step()\nexcept w.Stuck as e:\n    print(w.stuck(e), w.crash_message(e))\n")
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0] == "False" and len(lines) == 2, out.stdout
    assert re.fullmatch(r"True vLLM's engine did not finish the request in 120 s \(at vllm/engine\.py:[23] in step\)",
                        lines[1]), lines[1]


@pytest.mark.slow  # a subprocess of its own, seconds each (the fast loop leaves it out)
def test_a_cache_that_was_never_read_checked_nothing(model_dir, fake_python, monkeypatch, tmp_path):
    r, doc = compare(model_dir, fake_python, monkeypatch, tmp_path, "nocache")
    assert r.exit_code == 0, r.output
    (nm,) = doc["not_measured"]
    assert nm["schedule"] == "prefix" and nm["outcome"] == "checked nothing" and "num_cached_tokens 0" in nm["message"]
    assert "prefix" not in {x["schedule"] for x in doc["runs"]}
    assert "prefix checked nothing" in doc["verdict"]


@pytest.mark.slow  # a subprocess of its own, seconds each (the fast loop leaves it out)
def test_a_crash_in_vllm_is_that_schedules_result(model_dir, fake_python, monkeypatch, tmp_path):
    r, doc = compare(model_dir, fake_python, monkeypatch, tmp_path, "crash", "--check")
    assert r.exit_code == 1, r.output  # the engine's failure, not ours: no "internal error"
    assert "internal error" not in r.output and "bug in smearcli" not in r.output
    (nm,) = doc["not_measured"]
    assert nm["outcome"] == "crashed" and "IndexError" in nm["message"] and "conv_ssm_forward" in nm["message"]
    assert all(x["passed"] for x in doc["runs"]) and len(doc["runs"]) == 3
    assert doc["verdict"].startswith("CRASHED: prefix crashed: IndexError")
    assert "every run measured matches" in doc["verdict"]
    # placed against what upstream knows: no thread covers a llama crashing in vLLM's prefix cache
    assert [(u["path"], u["verdict"], u["class"]) for u in doc["upstream"]] == [("prefix", "crashed", "new")]


@pytest.mark.slow  # a subprocess of its own, seconds each (the fast loop leaves it out)
def test_a_worker_that_dies_crashes_every_schedule(model_dir, fake_python, monkeypatch, tmp_path):
    r, doc = compare(model_dir, fake_python, monkeypatch, tmp_path, "die")
    assert r.exit_code == 0 and doc["runs"] == []  # without --check: reported, exit 0
    assert [x["schedule"] for x in doc["not_measured"]] == ["prefill", "decode", "chunked", "prefix"]
    assert all("exited with status 1: Fatal Python error" in x["message"] for x in doc["not_measured"])


@pytest.mark.slow  # a subprocess of its own, seconds each (the fast loop leaves it out)
def test_a_chunk_boundary_error_is_found_where_it_is_born(model_dir, fake_python, monkeypatch, tmp_path):
    r, doc = compare(model_dir, fake_python, monkeypatch, tmp_path, "skew", "--batch", "2")
    assert doc["input"] == {"batch": 2, "seq_len": T}
    runs = {x["schedule"]: x for x in doc["runs"]}
    assert not runs["chunked"]["passed"] and runs["chunked"]["first_departure"] == {"layer": "logits", "position": 16}
    assert runs["prefill"]["passed"] and runs["prefix"]["passed"]
    # vLLM runs in its own precision only: a departure there is named, but not confirmed as a bug
    assert doc["verdict"].startswith("UNCONFIRMED: chunked diverges") and "its runner has no float64 form" in doc["verdict"]
    # named as the vLLM census names it (a budget of 16), so that a table entry for "chunked@*" covers it
    assert [(u["path"], u["verdict"], u["class"]) for u in doc["upstream"]] == [("chunked@16", "unconfirmed", "new")]


@pytest.mark.slow  # a subprocess of its own, seconds each (the fast loop leaves it out)
def test_the_table_says_what_ran(model_dir, fake_python, monkeypatch, tmp_path):
    monkeypatch.setenv("SMEARCLI_STANDIN_MODE", "crash")
    r = runner.invoke(app, ["compare", "--impl", "vllm", "--hf-model", str(model_dir), "--vllm-python",
                            str(fake_python), "--seq-len", str(T)])
    assert "prefix crashed: IndexError" in r.output and "log-probabilities" in r.output
    assert "vLLM stand-in on cpu" in r.output


def test_refusals(model_dir, fake_python, monkeypatch, tmp_path):
    base = ["compare", "--impl", "vllm", "--hf-model", str(model_dir)]
    monkeypatch.delenv(vllm.ENV_PYTHON, raising=False)
    cases = [
        ([], "needs --vllm-python PATH"),
        (["--vllm-python", str(tmp_path / "nope")], "--vllm-python " + str(tmp_path / "nope") + ": not found"),
        (["--vllm-python", str(fake_python), "--schedules", "engine"], "engine cannot run with --impl vllm"),
        (["--vllm-python", str(fake_python), "--chunk-sizes", "20,24,20"], "fixed token budget"),
        (["--vllm-python", str(fake_python), "--seq-len", "32", "--schedules", "prefix"], "more than one cache block"),
        (["--vllm-python", str(fake_python), "--tensor-parallel-size", "2"], "give --device cuda"),
        (["--vllm-python", str(fake_python), "--gen-len", "4"], "does not apply|does not run"),
    ]
    for extra, want in cases:
        r = runner.invoke(app, base + extra)
        assert r.exit_code == 2, (extra, r.output)
        assert any(w in r.stderr for w in want.split("|")), (extra, r.stderr)
        assert len(r.stderr.strip().splitlines()) == 1, r.stderr
    r = runner.invoke(app, ["compare", "--impl", "vllm", "--hf-model", "llama", "--vllm-python", str(fake_python)])
    assert r.exit_code == 2 and "needs a local model directory" in r.stderr
    r = runner.invoke(app, ["compare", "--vllm-python", str(fake_python)])
    assert r.exit_code == 2 and "--vllm-python is used by --impl vllm" in r.stderr
    for impl in ("ours", "hf"):  # the prefix schedule is for engines with a prefix cache only
        r = runner.invoke(app, ["compare", "--impl", impl, "--schedules", "prefix"] + ["--hf-model", "llama"] * (impl == "hf"))
        assert r.exit_code == 2 and f"prefix cannot run with --impl {impl}" in r.stderr, r.output
    monkeypatch.setenv(vllm.ENV_PYTHON, str(tmp_path / "from-env"))
    r = runner.invoke(app, base)
    assert r.exit_code == 2 and f"${vllm.ENV_PYTHON} {tmp_path / 'from-env'}: not found" in r.stderr


def test_chunk_budget_and_prefix_length():
    assert vllm.chunk_budget(64, ScheduleOptions(chunks=4)) == 16
    assert vllm.chunk_budget(10, ScheduleOptions(chunk_sizes=(4, 4, 2))) == 4
    with pytest.raises(Exception, match="4,4,2"):
        vllm.chunk_budget(10, ScheduleOptions(chunks=3))  # 4,3,3 is not a fixed budget
    assert vllm.prefix_len(64) == 32 and vllm.prefix_len(65) == 64 and vllm.prefix_len(33) == 32


@pytest.mark.slow  # a subprocess of its own, seconds each (the fast loop leaves it out)
def test_plot_draws_a_vllm_run(model_dir, fake_python, monkeypatch, tmp_path):
    monkeypatch.setenv("SMEARCLI_STANDIN_MODE", "skew")
    out = tmp_path / "vllm.png"
    r = runner.invoke(app, ["plot", "--impl", "vllm", "--hf-model", str(model_dir), "--vllm-python",
                            str(fake_python), "--seq-len", str(T), "--schedules", "chunked", "--out", str(out)])
    assert r.exit_code == 0, r.output
    assert out.stat().st_size > 10_000 and "schedule chunked" in r.output


# -- the environment: every way --vllm-python can be wrong is one line, exit 2, before any model loads

def script(tmp_path: Path, name: str, body: str, mode: int = 0o755) -> Path:
    p = tmp_path / name
    p.write_text(body)
    p.chmod(mode)
    return p


def bad_pythons(tmp_path: Path):
    """(what, the interpreter, a fragment of its refusal) for each way vLLM's Python can be wrong."""
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    script(venv / "bin", "python", "#!/bin/sh\nexit 0\n")
    return [
        ("missing", tmp_path / "nope" / "python", "not found"),
        ("a directory holding bin/python", venv, f"a directory, not a Python interpreter; give {venv}/bin/python, its Python"),
        ("a directory", tmp_path, "a directory, not a Python interpreter"),
        ("not executable", script(tmp_path, "noexec", "#!/bin/sh\n", 0o644), "not an executable file"),
        ("not a program", script(tmp_path, "noshebang", "\x7fELF garbage\n"), "cannot run it"),
        ("/bin/true", Path("/bin/true"), "exited with status 0 without answering smearcli's handshake"),
        ("exits 0 silently", script(tmp_path, "silent", "#!/bin/sh\nexit 0\n"), "without answering"),
        ("prints garbage", script(tmp_path, "garbage", "#!/bin/sh\necho 'Segmentation fault (core dumped)'\n"),
         "answered 'Segmentation fault (core dumped)', not smearcli's handshake"),
        ("fails", script(tmp_path, "fails", "#!/bin/sh\necho 'libfoo.so: cannot open' >&2\nexit 127\n"),
         "exited with status 127: 'libfoo.so: cannot open'"),
        ("hangs", script(tmp_path, "hangs", "#!/bin/sh\nexec sleep 30\n"), "no answer within 0.5 s"),
        ("another protocol", script(tmp_path, "proto", '#!/bin/sh\necho \'{"worker": "smearcli-vllm", '
                                    '"protocol": 99, "python": "3.11", "vllm": "0.32.0"}\'\n'), "speaks protocol 99"),
        ("a Python without vLLM", Path(sys.executable), "without vLLM (no module named vllm)"),
    ]


def test_a_bad_vllm_environment_is_one_line_naming_what_to_run(model_dir, tmp_path, monkeypatch):
    import tempfile
    import time

    scratch = tmp_path / "tmp"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))  # where a stray temporary file would be
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    envs = tmp_path / "envs"
    envs.mkdir()
    for what, python, want in bad_pythons(envs):
        # the limit is shortened for the Python that hangs alone: a real Python's start-up under a
        # loaded machine (load 14 on 2 cores seen here) can take longer than half a second
        monkeypatch.setattr(vllm_env, "HELLO_TIMEOUT_S", 0.5 if what == "hangs" else 60.0)
        before = sorted(tmp_path.rglob("*"))
        start = time.monotonic()
        r = runner.invoke(app, ["compare", "--impl", "vllm", "--hf-model", str(model_dir), "--vllm-python",
                                str(python), "--seq-len", str(T), "--json"])
        assert r.exit_code == 2, (what, r.output)
        assert r.stdout == "" and "Traceback" not in r.output, (what, r.output)
        (line,) = r.stderr.strip().splitlines()
        assert line.startswith(f"smearcli: error: --vllm-python {python}: "), (what, line)
        assert want in line and "scripts/make_env.sh vllm DIR" in line, (what, line)
        assert "crashed" not in line and "internal error" not in line, (what, line)
        assert time.monotonic() - start < 20, what  # refused before the model loads, the hang stopped
        assert sorted(tmp_path.rglob("*")) == before, what  # nothing written, no temporary left


@pytest.mark.parametrize("mode,want", [
    ("garbage", "result.json is not JSON: Expecting value: line 1 column 1 (char 0)"),
    ("oldproto", "result.json speaks protocol 0"),
    ("silent", "it exited with status 0 without writing result.json"),
])
def test_an_answer_outside_the_protocol_is_the_environment(model_dir, fake_python, monkeypatch, tmp_path, mode, want):
    import tempfile

    scratch = tmp_path / "tmp"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    r, doc = compare(model_dir, fake_python, monkeypatch, tmp_path, mode)
    assert r.exit_code == 2 and doc is None, r.output
    (line,) = r.stderr.strip().splitlines()
    assert line == (f"smearcli: error: {fake_python}: the vLLM worker's answer is not smearcli's protocol "
                    f"{vllm_env.PROTOCOL} ({want}); make vLLM's environment with scripts/make_env.sh vllm DIR and "
                    "give DIR/bin/python, and rerun"), line
    assert list(scratch.iterdir()) == []  # the worker's directory is gone


def test_the_worker_checks_what_it_is_told(tmp_path):
    """The real worker, under this Python (no vLLM): the handshake says so, a request of another
    protocol is refused before vLLM is imported, and result.json limits are checked here."""
    import subprocess

    out = subprocess.run([sys.executable, str(vllm_env.WORKER), "hello"], capture_output=True, text=True, timeout=60)
    answer = json.loads(out.stdout)
    assert answer["worker"] == "smearcli-vllm" and answer["protocol"] == vllm_env.PROTOCOL and answer["vllm"] is None
    (tmp_path / "req.json").write_text(json.dumps({"protocol": 0}))
    out = subprocess.run([sys.executable, str(vllm_env.WORKER), str(tmp_path / "req.json"), str(tmp_path)],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 1 and f"speaks protocol {vllm_env.PROTOCOL}, the request 0" in out.stderr
    s = vllm.Settings(python="py", model="m", vocab=4)
    req = {"schedules": [{"name": "prefill"}]}
    big = tmp_path / "result.json"
    with open(big, "wb") as f:
        f.truncate(foreign.RESULT_LIMIT + 1)
    with pytest.raises(UserError, match="over the 4 MiB limit"):
        vllm.read_result(s, big, req)
    for entry, msg in [({"name": "decode"}, "not the prefill asked for"),
                       ({"name": "prefill", "arrays": {"logprobs": "../../etc/passwd"}}, "not .npy files"),
                       ({"name": "prefill", "outcome": "exploded"}, "outcome 'exploded'"),
                       ({"name": "prefill", "steps": [1.5]}, "steps is not a list of counts")]:
        big.write_text(json.dumps({"protocol": vllm_env.PROTOCOL, "schedules": [entry]}))
        with pytest.raises(UserError, match=msg):
            vllm.read_result(s, big, req)
    big.write_text('{"protocol": %d, "schedules": [{"name": "prefill", "message": NaN}]}' % vllm_env.PROTOCOL)
    with pytest.raises(UserError, match="not JSON"):
        vllm.read_result(s, big, req)
    big.write_text(json.dumps({"protocol": vllm_env.PROTOCOL, "schedules": [{"name": "prefill", "message": "x" * 10_000}]}))
    assert len(vllm.read_result(s, big, req)["schedules"][0]["message"]) == foreign.MESSAGE_LIMIT


def test_the_worker_speaks_the_adapters_protocol_words():
    """The worker runs without smearcli, so it holds its own copy of the protocol's number and of
    its word for a schedule vLLM raised in; the two sides must agree (the adapter reads that word
    as schedules.CRASHED)."""
    import ast

    tree = ast.parse(Path(vllm_env.WORKER).read_text())
    consts = {t.id: n.value.value for n in tree.body if isinstance(n, ast.Assign) and isinstance(n.value, ast.Constant)
              for t in n.targets if isinstance(t, ast.Name)}
    assert consts["PROTOCOL"] == vllm_env.PROTOCOL and consts["RAISED"] == vllm_env.RAISED


def test_a_crash_is_named_at_vllms_frame_even_in_an_environment_folder_named_vllm():
    """The worker names the innermost frame of vLLM's own files. An environment made at
    ~/envs/vllm holds torch's files under a folder named vllm too: an installed frame is vLLM's only
    from its last site-packages on (the census on such an environment named torch/_ops.py)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("smearcli_worker_names", vllm_env.WORKER)
    worker = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(worker)
    env = "/envs/vllm/lib/python3.11/site-packages/"
    ns: dict = {}
    exec(compile("def torch_op():\n    raise RuntimeError('invalid weight input features 16')\n",
                 env + "torch/_ops.py", "exec"), ns)
    exec(compile("def load(op):\n    op()\n", env + "vllm/model_executor/loader.py", "exec"), ns)
    try:
        ns["load"](ns["torch_op"])
    except RuntimeError as e:
        said = worker.crash_message(e)
    assert said == ("RuntimeError: invalid weight input features 16 "
                    "(at vllm/model_executor/loader.py:2 in load)"), said


@pytest.mark.parametrize("decides", [True, False])
def test_the_census_runs_nothing_more_after_a_one_step_prefill_raises(tmp_path, monkeypatch, decides):
    """The census asks the worker (`prefill_decides`) to stop after a prefill in one step that raises:
    the architecture is `not built` then whatever else runs, and each later schedule would start an
    engine only to raise the same way (seven starts for jamba: 26 s). `compare --impl vllm` runs
    them all, each its own crash. The worker's own loop, with vLLM's objects stood in."""
    import importlib.util
    import types

    import numpy as np

    spec = importlib.util.spec_from_file_location("smearcli_worker_under_test", vllm_env.WORKER)
    worker = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(worker)
    started = []

    class LLM:  # an engine whose every request raises, as a kernel the CPU build lacks
        def __init__(self, **kw):
            started.append(kw["enable_prefix_caching"])
            self.llm_engine = types.SimpleNamespace()

        def generate(self, *a, **k):
            raise AttributeError("'_OpNamespace' '_C' object has no attribute 'selective_scan_fwd'")

    parallel = types.ModuleType("vllm.distributed.parallel_state")
    parallel.destroy_distributed_environment = parallel.destroy_model_parallel = lambda: None
    for name, mod in (("vllm", types.ModuleType("vllm")), ("vllm.distributed", types.ModuleType("vllm.distributed")),
                      ("vllm.distributed.parallel_state", parallel)):
        monkeypatch.setitem(sys.modules, name, mod)
    m = {"np": np, "vllm": types.SimpleNamespace(__version__="0.32.0"), "LLM": LLM, "Force": object,
         "SamplingParams": lambda **k: k, "TokensPrompt": lambda **k: k}
    req = {"model": str(tmp_path), "vocab": 16, "rows": [[1, 2, 3, 4, 5, 6]], "max_model_len": 32, "dtype": "float32", "device": "cuda",
           "kv_cache_memory_bytes": 1 << 20, "tensor_parallel_size": 1, "block_size": 16, "one_engine": True,
           "stuck_s": 45, "prefill_decides": decides,
           "schedules": [{"name": "prefill"}, {"name": "chunked", "budget": 3}, {"name": "decode"},
                         {"name": "prefix", "prefix": 16}]}
    res = worker.run_request(req, str(tmp_path), m)
    first, *rest = res["schedules"]
    assert first["outcome"] == "raised" and "selective_scan_fwd" in first["message"]
    if decides:
        assert len(started) == 1 and all(e.get("skipped") for e in rest)
        assert {e["message"] for e in rest} == {"not run: the prefill in one step raised, so no cached path can be "
                                                "held to it"}
    else:
        assert len(started) == 4 and not any(e.get("skipped") for e in rest)
        assert all(e["outcome"] == "raised" for e in rest)  # each its own crash (prefix: in the stand-in's
        assert all("selective_scan_fwd" in e["message"] for e in rest[:2])  # missing block size, first)
    assert worker.LIMIT == [45.0]
