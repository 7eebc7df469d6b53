"""`--impl llamacpp` without compiling llama.cpp: the adapter against a stand-in worker
(tests/llamacpp_standin.py) that speaks the worker's protocol and computes with transformers:
every schedule as the worker runs it, one with a micro-batch boundary error, one whose one-call
prefill departs already (the implementation's), one whose rollback llama.cpp refuses (its
documented limit), one that aborts inside "llama.cpp" in one schedule (that schedule's crash with
its frame; a fresh worker runs the rest), one the converter refuses; the environment missing, of
another version, without llama-cpp-python; a user's --gguf refused up front. The real llama.cpp
checks are tests/test_llamacpp_real.py."""

import json
import struct
from pathlib import Path

import pytest
from typer.testing import CliRunner

pytest.importorskip("transformers", reason="transformers is not installed: pip install 'smearcli[hf]'")

from smearcli.cli.app import app  # noqa: E402
from smearcli.engines import llamacpp  # noqa: E402
from smearcli.engines import transformers as hf  # noqa: E402
from smearcli.engines.llamacpp import environment as llamacpp_env  # noqa: E402
from smearcli.measure.schedules import SCHEDULES, ScheduleOptions  # noqa: E402
from conftest import standin_python  # noqa: E402

runner = CliRunner()
STANDIN = Path(__file__).resolve().parents[1] / "llamacpp_standin.py"
T = 32
ALL = ["prefill", "ubatch", "chunked", "decode", "prefix", "rollback", "batched", "restore", "swa", "mixed", "split", "shift",
       "flash"]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("llama")
    hf.tiny_model("llama").save_pretrained(d, safe_serialization=True)
    return d


@pytest.fixture
def fake_python(tmp_path):
    return standin_python(tmp_path, STANDIN)


def compare(model_dir, python, monkeypatch, tmp_path, mode="good", *extra):
    monkeypatch.setenv("SMEARCLI_STANDIN_MODE", mode)
    monkeypatch.setenv("SMEARCLI_STANDIN_SEEN", str(tmp_path / "seen.json"))
    r = runner.invoke(app, ["compare", "--impl", "llamacpp", "--hf-model", str(model_dir), "--llamacpp-python",
                            str(python), "--seq-len", str(T), "--json", *extra])
    assert "Traceback" not in r.output, r.output
    return r, (json.loads(r.stdout) if r.stdout.strip().startswith("{") else None)


def one_line_error(r) -> str:
    assert r.exit_code == 2, r.output
    lines = [ln for ln in r.output.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("smearcli: error: "), r.output
    return lines[0]


def test_every_llamacpp_schedule_against_transformers_and_its_own_prefill(model_dir, fake_python, monkeypatch,
                                                                           tmp_path):
    r, doc = compare(model_dir, fake_python, monkeypatch, tmp_path)
    assert r.exit_code == 0, r.output
    runs = {x["schedule"]: x for x in doc["runs"]}
    assert list(runs) == ALL and doc["not_measured"] == [] and all(x["passed"] for x in runs.values())
    assert doc["noise_floor"]["source"].startswith("the full pass in float64 against float32")
    assert runs["decode"]["steps"] == [1] * T and runs["chunked"]["steps"] == [8] * 4
    assert runs["prefix"]["steps"] == [16, 16] and runs["prefix"]["boundaries"]["prefix_hit"] == [16]
    assert runs["rollback"]["boundaries"]["rollback"]  # the cuts where rejected drafts were removed
    assert runs["restore"]["steps"] == [16, 16] and runs["restore"]["boundaries"]["restored"] == [16]
    assert runs["shift"]["steps"] == [16, 16] and runs["shift"]["boundaries"]["shifted"] == [16]
    assert runs["flash"]["steps"] == [8] * 4
    seen = json.loads((tmp_path / "seen.json").read_text())
    by = {s["name"]: s for s in seen["schedules"]}
    assert seen["protocol"] == llamacpp_env.PROTOCOL and seen["cache_type"] == "f32" and seen["f16_too"]
    assert by["ubatch"]["widths"] == [3, 5, 7] and by["prefix"]["prefix"] == 16 and by["batched"]["short"] == 22
    assert (by["rollback"]["prompt"], by["rollback"]["draft"], by["rollback"]["reject"]) == (1, 4, 2)
    assert (by["shift"]["prefix"], by["shift"]["offset"]) == (16, llamacpp.SHIFT_BY) and by["flash"]["sizes"] == [8] * 4
    notes = " | ".join(doc["model"]["notes"])
    assert "default float16 KV cache moves decode by" in notes and "one-call prefill against transformers" in notes
    assert doc["verdict"].startswith("OK") and "every cached path matches llama.cpp's own one-call prefill" \
        in doc["verdict"]


@pytest.mark.slow  # the stand-in's flash and float32 prefills at every schedule: 12 to 16 s
def test_flash_attention_is_held_to_its_own_one_call_prefill(model_dir, fake_python, monkeypatch, tmp_path):
    """The stand-in's flash prefill sits 1e-4 from the float32 one (flash attention's float16 rounding,
    by design): alone that is no finding. Its chunked calls departing from it at each call's first
    token are."""
    r, doc = compare(model_dir, fake_python, monkeypatch, tmp_path)
    runs = {x["schedule"]: x for x in doc["runs"]}
    assert runs["flash"]["passed"] and doc["verdict"].startswith("OK"), doc["verdict"]
    notes = " | ".join(doc["model"]["notes"])
    import re

    moved = float(re.search(r"flash attention's float16 rounding moves by ([0-9.e-]+)", notes).group(1))
    assert 1e-4 < moved < 3e-4  # the stand-in's 1e-4 x cos(v) over the vocabulary, as log-probs
    r, doc = compare(model_dir, fake_python, monkeypatch, tmp_path, "flash")
    runs = {x["schedule"]: x for x in doc["runs"]}
    assert not runs["flash"]["passed"] and all(x["passed"] for s, x in runs.items() if s != "flash")
    assert "flash from position 8 at a boundary" in doc["verdict"], doc["verdict"]


def test_a_shift_that_cannot_apply_to_the_model_is_not_run_and_judges_nothing(model_dir, fake_python, monkeypatch,
                                                                             tmp_path):
    r, doc = compare(model_dir, fake_python, monkeypatch, tmp_path, "absolute")
    assert r.exit_code == 0, r.output
    [moot] = doc["not_measured"]
    assert moot["schedule"] == "shift" and "absolute position" in moot["message"], moot
    assert doc["verdict"].startswith("OK"), doc["verdict"]


@pytest.mark.slow  # eight one-call prefills per row in the stand-in: 12 to 15 s
def test_llamacpps_own_spread_raises_the_threshold_a_cache_finding_must_pass(model_dir, fake_python, monkeypatch,
                                                                             tmp_path):
    """One-call prefills of the row's first tokens, each from an empty cache, measure llama.cpp's own
    rounding across batch widths without any cached path: the threshold is the tolerance times the
    larger of it and the float64 floor. Where it is nothing, the floor alone decides; a micro-batch
    departure as large as the stand-in's wobble is within it, so no cache finding."""
    r, doc = compare(model_dir, fake_python, monkeypatch, tmp_path)
    notes = " | ".join(doc["model"]["notes"])
    assert "llama.cpp's own spread (one-call prefills of the row's first tokens" in notes
    assert "max |d log-prob| 0;" in notes, notes
    seen = json.loads((tmp_path / "seen.json").read_text())
    assert seen["spread"] == [n for n in llamacpp.SPREAD if n < T]
    r, doc = compare(model_dir, fake_python, monkeypatch, tmp_path, "wobble")
    notes = " | ".join(doc["model"]["notes"])
    assert "own spread" in notes and "threshold" in notes
    import re

    spread = float(re.search(r"own spread \(.*?\): max \|d log-prob\| ([0-9.e+-]+)", notes).group(1))
    assert spread > 0.4  # the wobble (0.5 on one token, in log-probs)
    assert "every cached path matches llama.cpp's own one-call prefill" in doc["verdict"], doc["verdict"]


def test_a_micro_batch_boundary_error_is_the_finding_with_its_first_position(model_dir, fake_python, monkeypatch,
                                                                             tmp_path):
    r, doc = compare(model_dir, fake_python, monkeypatch, tmp_path, "skew", "--check")
    assert r.exit_code == 1, r.output
    runs = {x["schedule"]: x for x in doc["runs"]}
    assert not runs["ubatch"]["passed"] and runs["ubatch"]["steps"] == [5] * 6 + [2]  # the width-5 run, shown
    assert all(x["passed"] for s, x in runs.items() if s != "ubatch")
    assert "ubatch from position 5 at a boundary" in doc["verdict"]
    assert "not a cache finding" not in doc["verdict"]
    # placed against what upstream knows, named as the llama.cpp census names the schedule: nothing covers it
    assert [(u["path"], u["class"]) for u in doc["upstream"]] == [("ubatch", "new")]


def test_a_departure_already_in_the_one_call_prefill_is_the_implementations(model_dir, fake_python, monkeypatch,
                                                                            tmp_path):
    r, doc = compare(model_dir, fake_python, monkeypatch, tmp_path, "own")
    assert not doc["verdict"].startswith("OK") and not doc["verdict"].startswith("BUG")
    assert "one-call prefill already departs from transformers (the implementation's, not a cache finding)" \
        in doc["verdict"]
    assert "every cached path matches llama.cpp's own one-call prefill" in doc["verdict"]
    # every departing run is placed against what upstream knows, two sequences in one call too
    # (their steps cover both rows: the shape is the schedule's own, not read from an error profile)
    assert {"prefill", "batched", "split"} <= {u["path"] for u in doc["upstream"]}


def test_a_refused_partial_removal_is_llamacpps_documented_limit_not_a_crash(model_dir, fake_python, monkeypatch,
                                                                            tmp_path):
    r, doc = compare(model_dir, fake_python, monkeypatch, tmp_path, "refuse")
    assert [nm["schedule"] for nm in doc["not_measured"]] == ["rollback", "mixed"]  # both remove a partial tail
    for nm in doc["not_measured"]:
        assert nm["outcome"] == "checked nothing" and "documented limit" in nm["message"]
    assert not doc["verdict"].startswith("CRASHED")
    assert [x["schedule"] for x in doc["runs"]] == [s for s in ALL if s not in ("rollback", "mixed")]


@pytest.mark.slow  # two workers, one aborting: 11 s
def test_a_worker_that_dies_in_one_schedule_is_its_crash_and_the_run_goes_on(model_dir, fake_python, monkeypatch,
                                                                            tmp_path):
    r, doc = compare(model_dir, fake_python, monkeypatch, tmp_path, "die", "--check")
    assert r.exit_code == 1, r.output
    (nm,) = doc["not_measured"]
    assert nm["schedule"] == "decode" and nm["outcome"] == "crashed"
    assert "killed by SIGABRT" in nm["message"] and "src/llama-context.cpp:1234: GGML_ASSERT" in nm["message"]
    # the schedules after it ran in a fresh worker
    assert [x["schedule"] for x in doc["runs"]] == [s for s in ALL if s != "decode"]
    assert any("a fresh one ran the schedules after it" in n for n in doc["model"]["notes"])


@pytest.mark.slow  # waits out the watchdog: 13 s
def test_a_schedule_stuck_in_llamacpp_is_ended_by_the_watchdog_and_the_rest_runs(model_dir, fake_python,
                                                                                  monkeypatch, tmp_path):
    r, doc = compare(model_dir, fake_python, monkeypatch, tmp_path, "stuck")
    (nm,) = doc["not_measured"]
    assert nm["schedule"] == "chunked" and nm["outcome"] == "crashed"
    assert "did not finish the schedule in 300 s (the watchdog ended the worker)" in nm["message"]
    assert [x["schedule"] for x in doc["runs"]] == [s for s in ALL if s != "chunked"]


def test_an_answer_outside_the_protocol_is_the_environments_fault(model_dir, fake_python, monkeypatch, tmp_path):
    r, _ = compare(model_dir, fake_python, monkeypatch, tmp_path, "garbage")
    msg = one_line_error(r)
    assert "the llama.cpp worker's answer is not smearcli's protocol 1 (result.json is not JSON" in msg


def test_an_input_too_short_for_a_draft_leaves_rollback_out_of_the_default_list(model_dir, fake_python,
                                                                                monkeypatch, tmp_path):
    r, doc = compare(model_dir, fake_python, monkeypatch, tmp_path, "good", "--seq-len", "4")
    assert r.exit_code == 0 and [x["schedule"] for x in doc["runs"]] == [s for s in ALL if s != "rollback"]
    r, _ = compare(model_dir, fake_python, monkeypatch, tmp_path, "good", "--seq-len", "4", "--schedules", "rollback")
    assert "no draft would ever be taken back" in one_line_error(r)


def test_a_model_the_converter_refuses_is_that_models_result(model_dir, fake_python, monkeypatch, tmp_path):
    r, doc = compare(model_dir, fake_python, monkeypatch, tmp_path, "noconvert", "--check")
    assert r.exit_code == 1 and doc["runs"] == []
    first, *rest = doc["not_measured"]
    assert first["schedule"] == "prefill" and "not supported" in first["message"]
    assert "llama.cpp did not build the model" in first["message"]
    assert [x["schedule"] for x in rest] == ALL[1:]
    assert all(x["message"] == "not run: llama.cpp did not build the model" for x in rest)


def test_the_environment_missing_of_another_version_or_without_llamacpp(model_dir, fake_python, monkeypatch,
                                                                        tmp_path):
    monkeypatch.delenv(llamacpp.ENV_PYTHON, raising=False)
    r = runner.invoke(app, ["compare", "--impl", "llamacpp", "--hf-model", str(model_dir)])
    assert "needs --llamacpp-python PATH (or $SMEARCLI_LLAMACPP_PYTHON)" in one_line_error(r)
    r, _ = compare(model_dir, tmp_path / "nope" / "python", monkeypatch, tmp_path)
    assert "--llamacpp-python" in one_line_error(r) and "not found" in r.output
    monkeypatch.setenv("SMEARCLI_STANDIN_VERSION", "0.3.30")
    r, _ = compare(model_dir, fake_python, monkeypatch, tmp_path)
    msg = one_line_error(r)
    assert "llama-cpp-python 0.3.30" in msg and "written against 0.3.36" in msg and "torch 2.13.0" in msg
    monkeypatch.setenv("SMEARCLI_STANDIN_VERSION", "missing")
    monkeypatch.setenv(llamacpp.ENV_PYTHON, str(fake_python))  # the environment variable, named in the refusal
    r = runner.invoke(app, ["compare", "--impl", "llamacpp", "--hf-model", str(model_dir)])
    msg = one_line_error(r)
    assert msg.startswith("smearcli: error: $SMEARCLI_LLAMACPP_PYTHON") and "llama-cpp-python missing" in msg
    assert not (tmp_path / "seen.json").exists()  # nothing ran past the handshake


def tiny_gguf(arch: str, vocab: int, embd: int = 4, lie: int = 0) -> bytes:
    """A float32 GGUF header with one token embedding (`lie`: extra rows it claims the data has)."""
    def s(t):
        return struct.pack("<Q", len(t.encode())) + t.encode()
    kv = s("general.architecture") + struct.pack("<I", 8) + s(arch)
    kv += s(f"{arch}.vocab_size") + struct.pack("<II", 4, vocab)
    tensor = s("token_embd.weight") + struct.pack("<IQQ", 2, embd, vocab + lie) + struct.pack("<IQ", 0, 0)
    head = b"GGUF" + struct.pack("<IQQ", 3, 1, 2) + kv + tensor
    return head + b"\0" * (-len(head) % 32) + b"\0" * (4 * embd * vocab)


@pytest.mark.parametrize("case, expect", [
    ("lies", "past the end of the file's data"),
    ("truncated", "truncated"),
    ("vocab", "the config's vocab_size 128"),
    ("huge", "over the 1,048,576 limit"),
])
def test_a_bad_gguf_is_refused_before_llamacpp_reads_it(model_dir, fake_python, monkeypatch, tmp_path, case, expect):
    data = {"lies": tiny_gguf("llama", 128, lie=1000), "truncated": tiny_gguf("llama", 128)[:300],
            "vocab": tiny_gguf("llama", 64), "huge": tiny_gguf("llama", 5_000_000)}[case]
    f = tmp_path / "m.gguf"
    f.write_bytes(data)
    r, _ = compare(model_dir, fake_python, monkeypatch, tmp_path, "good", "--gguf", str(f))
    msg = one_line_error(r)
    assert msg.startswith(f"smearcli: error: --gguf {f}: refused before llama.cpp reads it") and expect in msg, msg
    assert not (tmp_path / "seen.json").exists() and f.read_bytes() == data  # never run, never touched


def test_a_gguf_of_another_architecture_than_the_config_says(model_dir, fake_python, monkeypatch, tmp_path):
    f = tmp_path / "m.gguf"
    f.write_bytes(tiny_gguf("mamba", 128))
    monkeypatch.setenv("SMEARCLI_STANDIN_ARCH", "llama")  # what the converter maps the config to
    r, _ = compare(model_dir, fake_python, monkeypatch, tmp_path, "good", "--gguf", str(f))
    msg = one_line_error(r)
    assert "its architecture is 'mamba'" in msg and "is 'llama' in llama.cpp: not the same model" in msg


def test_the_registered_schedules_are_offered_to_llamacpp_alone():
    from smearcli.cli.impls import offered
    from smearcli.engines.registry import REGISTRY

    assert "ubatch" in SCHEDULES and "batched" in SCHEDULES
    assert [s for s in offered(REGISTRY["llamacpp"]) if s != "full"] == [
        "prefill", "decode", "chunked", "rollback", "prefix", "ubatch", "batched", "swa", "split", "mixed", "restore",
        "shift", "flash"]
    assert "ubatch" not in offered(REGISTRY["hf"]) and "batched" not in offered(REGISTRY["vllm"])


def test_the_request_sizes_every_schedule_from_the_options():
    s = llamacpp.Settings(python="py", model="m", vocab=10, widths=(3, 4, 5, 40))
    tokens = __import__("torch").zeros(1, 20, dtype=__import__("torch").long)
    req = llamacpp.request(s, tokens, ALL, ScheduleOptions(chunks=3, draft=5, reject=1, gen_len=8))
    by = {e["name"]: e for e in req["schedules"]}
    assert by["chunked"]["sizes"] == [7, 7, 6] and by["ubatch"]["widths"] == [3, 4, 5]
    assert (by["rollback"]["prompt"], by["rollback"]["draft"], by["rollback"]["reject"]) == (12, 5, 1)
    assert by["prefix"]["prefix"] == 10 and by["batched"]["short"] == 14 and by["restore"]["prefix"] == 10


def test_widths_sit_around_the_convolution_width():
    cfg = type("C", (), {"conv_kernel": 4})()
    assert llamacpp.widths_for(cfg, 64) == (3, 4, 5, 7)
    assert llamacpp.widths_for(type("C", (), {})(), 6) == (3, 5)


def test_nothing_beside_the_worker_shadows_a_module_llamacpp_imports():
    """The worker runs as a script, its directory first on sys.path: no file beside it may be named
    like a module llama.cpp's environment imports."""
    import importlib.util

    here = Path(llamacpp.__file__).parent
    for f in here.glob("*.py"):
        if f.stem not in ("__init__", "worker"):
            assert importlib.util.find_spec(f.stem) is None, f
    assert "sys.path" not in (here / "worker.py").read_text().replace("sys.path:", "")


def test_a_torn_state_file_is_this_machines_failure_in_one_line(model_dir, fake_python, monkeypatch, tmp_path):
    """The worker found the restore schedule's state file shorter than the save wrote (a full disk):
    one line naming the file, exit 2, never llama.cpp's crash; the worker's directory is gone."""
    monkeypatch.setenv("TMPDIR", str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    r, doc = compare(model_dir, fake_python, monkeypatch, tmp_path, "torn")
    assert r.exit_code == 2 and doc is None, r.output
    (line,) = r.stderr.strip().splitlines()
    assert line.startswith("smearcli: error: llama.cpp's worker, restore: the state file ") and "torn" in line
    assert "crashed" not in line and "bug in smearcli" not in line
    assert list((tmp_path / "tmp").iterdir()) == []  # nothing of the worker's left behind


class _FakeLlama:
    """Just enough of llama_cpp.llama_cpp for the worker's restore schedule: a save that reports
    more bytes than reach the disk (`torn`), and a load that reads back what was saved."""

    def __init__(self, torn: bool):
        self.torn, self.loaded = torn, False

    def llama_state_seq_get_size(self, ctx, seq):
        return 100

    def llama_state_seq_save_file(self, ctx, path, seq, ids, n):
        Path(path.decode()).write_bytes(b"x" * (40 if self.torn else 100))
        return 100

    def llama_state_seq_load_file(self, ctx, path, seq, ids, cap, n_out):
        self.loaded = True
        data = Path(path.decode()).read_bytes()
        n_out._obj.value = 3
        for i in range(3):
            ids[i] = i + 1
        return len(data)


class _FakeEngine:
    def __init__(self, L, outdir):
        import numpy as np

        self.L, self.np, self.outdir, self.log = L, np, str(outdir), []

    def context(self, *a, **k):
        return object()

    def free(self, ctx):
        pass

    def decode(self, ctx, items):
        return [self.np.full(4, float(t), dtype=self.np.float32) for t, _, _ in items]


@pytest.mark.parametrize("torn", [True, False])
def test_the_worker_holds_the_state_file_to_what_the_save_wrote(tmp_path, monkeypatch, torn):
    import importlib

    monkeypatch.syspath_prepend(str(Path(llamacpp.__file__).parent))
    worker = importlib.import_module("worker")
    L = _FakeLlama(torn)
    items = [(t, p, 0) for p, t in enumerate([1, 2, 3, 4, 5, 6])]
    out = worker.restore(_FakeEngine(L, tmp_path), items, 3, 16, "f32")
    assert list(tmp_path.iterdir()) == []  # the state file is removed either way
    if torn:
        assert set(out) == {"environment"} and "holds 40 of the 100 bytes" in out["environment"] and not L.loaded
    else:
        assert out["steps"] == [3, 3] and L.loaded and out["logits"][:, 0].tolist() == [1, 2, 3, 4, 5, 6]


def test_a_fork_server_that_is_gone_gives_way_to_a_fresh_worker(model_dir, fake_python, monkeypatch, tmp_path, capsys):
    """The census's fork server dying is its own machinery failing, never the model's result nor the
    user's setup: the call starts a fresh worker instead, says so on stderr, and this process asks
    that server no more."""
    from smearcli.engines.llamacpp import calls, forkserver

    s = llamacpp.Settings(python=str(fake_python), model=str(model_dir), vocab=128, f16_too=False)
    dead = str(tmp_path / "gone.sock")  # a server's socket that nothing listens on any more
    (tmp_path / "gone.sock").write_text("")
    monkeypatch.setitem(forkserver.RUNNING, (s.python, s.worker), dead)
    monkeypatch.setenv("SMEARCLI_STANDIN_MODE", "good")
    rows = [[1, 2, 3, 4, 5, 6]]
    req = llamacpp.request(s, __import__("torch").tensor(rows), ["prefill", "decode"], ScheduleOptions())
    (tmp_path / "w").mkdir()
    res = calls.call_worker(s, req, tmp_path / "w")
    assert [e["name"] for e in res["schedules"]] == ["prefill", "decode", "spread"] and not res["deaths"], res
    assert all(e["outcome"] is None for e in res["schedules"])
    err = capsys.readouterr().err
    assert "llama.cpp's fork server: it is gone" in err and "workers start afresh" in err, err
    assert dead not in forkserver.RUNNING.values()
    assert not (tmp_path / "gone.sock").exists()  # the census's other processes no longer ask it either
    monkeypatch.setitem(forkserver.RUNNING, (s.python, s.worker), dead)  # as a process forked before it went
    assert forkserver.serving(s.python, s.worker, {}) is None
