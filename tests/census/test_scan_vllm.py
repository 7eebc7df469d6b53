"""`smearcli scan --engine vllm` without vLLM: the census's planning (which architectures, the
tiny config adjusted for vLLM's CPU backend, the schedules), its worker process (one for every
model; a hang, a memory runaway or a death stops it, and it is started again) and its records,
reproducers, resume and Markdown, against the stand-in worker (tests/vllm_standin.py: speaks the
worker's protocol, computes with transformers). The test marked `vllm` runs two architectures in
real vLLM when $SMEARCLI_VLLM_PYTHON names its interpreter."""

import json
import os
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

transformers = pytest.importorskip("transformers", reason="transformers is not installed: pip install 'smearcli[hf]'")

from smearcli.census import record, records, report  # noqa: E402
from smearcli.engines.vllm import session as vllm  # noqa: E402
from smearcli.engines.vllm import serve  # noqa: E402
from smearcli.cli.app import app  # noqa: E402
from smearcli.engines.vllm import BLOCK_SIZE, ENV_PYTHON  # noqa: E402
from smearcli.judging.verdicts import CRASHED, INCONCLUSIVE, NOT_BUILT, OK, UNCONFIRMED  # noqa: E402
from conftest import ROOT, standin_python  # noqa: E402

STANDIN = Path(__file__).resolve().parents[1] / "vllm_standin.py"
runner = CliRunner()


@pytest.fixture
def fake_python(tmp_path):
    """An executable that runs the stand-in with the worker's arguments, as vLLM's Python would."""
    return standin_python(tmp_path, STANDIN)


def test_the_architectures_are_vllms_with_a_transformers_causal_lm():
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES as causal

    archs = ["LlamaForCausalLM", "Mamba2ForCausalLM", "NoSuchForCausalLM"]
    from smearcli.engines.transformers.reference import model_types

    got = model_types(archs)
    assert {"llama", "mamba2"} <= set(got) and got == sorted(got)
    # every model type whose class vLLM lists, and nothing else (an arch transformers lacks adds none)
    assert set(got) == {t for t, c in causal.items() if c in archs}


def test_the_tiny_config_takes_head_size_32_and_keeps_the_census_shapes():
    cfg, changes = vllm.tiny_config("llama")
    assert cfg.head_dim == vllm.HEAD and cfg.num_attention_heads * cfg.head_dim == cfg.hidden_size
    assert cfg.num_key_value_heads == 1 and changes["head_dim"] == vllm.HEAD
    assert cfg.max_position_embeddings >= 2 * vllm.T
    gpt2, _ = vllm.tiny_config("gpt2")  # no head_dim key: the width over the heads
    assert gpt2.n_embd // gpt2.n_head == vllm.HEAD
    mamba, _ = vllm.tiny_config("mamba2")  # no attention: its SSM heads are derive's
    assert (mamba.num_heads, mamba.head_dim) == (8, 16)


def test_chunked_prefill_runs_below_and_at_the_conv_width_a_block_and_an_odd_budget():
    mamba, _ = vllm.tiny_config("mamba2")
    cw = mamba.conv_kernel
    assert vllm.budgets(mamba) == sorted({cw - 1, cw, BLOCK_SIZE, vllm.ODD})
    names = [vllm.label(e) for e in vllm.schedule_entries(mamba)]
    assert names[0] == "prefill" and names[-1] == "prefix" and "decode" in names
    assert f"chunked@{cw - 1}" in names and f"chunked@{BLOCK_SIZE}" in names
    llama, _ = vllm.tiny_config("llama")  # no conv: one small budget stands for both
    assert vllm.budgets(llama) == [3, vllm.ODD, BLOCK_SIZE]
    # one engine (prefix caching on) serves a model without a conv state; Mamba's other schedules
    # run the path without caching, so its prefix schedule gets a second
    assert vllm.one_engine(llama) and not vllm.one_engine(mamba)
    assert vllm.length(llama) == vllm.T and vllm.length(mamba) == vllm.STATE_T


def model_dir(tmp_path, model_type):
    d = tmp_path / model_type
    d.mkdir()
    (d / "config.json").write_text(json.dumps({"model_type": model_type}))
    return d


def ask_run(worker, tmp_path, model_type, timeout, memory=None):
    req = tmp_path / f"{model_type}.json"
    req.write_text(json.dumps({"protocol": 2, "model": str(model_dir(tmp_path, model_type)), "schedules": []}))
    return worker.ask({"op": "run", "request": str(req), "outdir": str(tmp_path)}, timeout, memory)


@pytest.mark.parametrize("mode, limit, want", [("hang", None, "timed out"), ("hog", 400 << 20, "out of memory"),
                                               ("exit", None, "Fatal Python error: Aborted")])
def test_a_worker_that_hangs_runs_away_or_dies_is_stopped_and_started_again(fake_python, tmp_path, monkeypatch,
                                                                            mode, limit, want):
    monkeypatch.setenv("SMEARCLI_STANDIN_PLAN", json.dumps({"m": mode}))
    w = serve.Worker(str(fake_python))
    try:
        assert w.start()["ready"] and w.starts == 1
        assert "LlamaForCausalLM" in serve.archs(w)
        start = time.monotonic()
        with pytest.raises(serve.WorkerGone, match=want):
            ask_run(w, tmp_path, "m", timeout=1.0 if mode == "hang" else 30.0, memory=limit)
        assert time.monotonic() - start < 40
        deadline = time.monotonic() + 10
        while w.alive() and time.monotonic() < deadline:  # stopped by the asker, reaped here
            time.sleep(0.05)
        assert not w.alive()
        w.kill()  # as the census does before the next model: reaped, then started again
        w.start()
        assert w.alive() and w.starts == 2 and serve.archs(w)  # the next model gets a live one
    finally:
        w.close()
    assert not w.alive() and not w.log.exists()


@pytest.mark.parametrize("zygote", [True, False])
def test_a_worker_started_again_is_a_fork_of_the_zygote_past_the_import(fake_python, tmp_path, monkeypatch, zygote):
    """vLLM is imported once per census: the zygote imports it, every worker is its fork (a pid of
    its own, no import counted). A worker whose handshake offers no zygote gives a fresh process
    each start, each an import, and the census runs the same."""
    from smearcli.engines.vllm import session as vllm_session

    if not zygote:
        monkeypatch.setenv("SMEARCLI_STANDIN_NOZYGOTE", "1")
    w = vllm_session.open_session(str(fake_python), quiet=True).worker  # the handshake, then the first start
    try:
        first = w.ready
        pid = w.proc.pid
        w.kill()
        assert not w.alive()
        second = w.start()
        assert w.alive() and w.proc.pid != pid and serve.archs(w)
        assert w.starts == 2 and w.imports == (1 if zygote else 2)
        assert first["vllm"] == second["vllm"] == "stand-in"
        if zygote:
            assert w.import_s == 5.0  # the zygote's import, once; the forks' count nothing
        assert (w.zygote is not None) == zygote and bool(w.no_zygote) != zygote
        zyg = w.zygote
    finally:
        w.close()
    assert not w.alive() and not w.log.exists()
    assert zyg is None or zyg.poll() is not None  # the zygote ends with the census


def scan(tmp_path, fake_python, *extra):
    r = runner.invoke(app, ["scan", "--engine", "vllm", "--engine-python", str(fake_python), "--out",
                            str(tmp_path / "v.jsonl"), "--repro-dir", str(tmp_path / "repro"), *extra])
    assert "Traceback" not in r.output, r.output
    return r


@pytest.mark.slow  # four tiny models through the stand-in, a minute on two loaded cores
def test_the_census_on_the_standin_records_each_architecture_and_survives_a_dead_worker(fake_python, tmp_path,
                                                                                         monkeypatch):
    # alphabetical order: llama, mamba2, mistral (the worker dies), then qwen2 on a fresh worker
    monkeypatch.setenv("SMEARCLI_STANDIN_PLAN", json.dumps({"mamba2": "crash", "mistral": "exit", "qwen2": "spread"}))
    monkeypatch.setenv("SMEARCLI_STANDIN_ARCHS", "LlamaForCausalLM,Mamba2ForCausalLM,MistralForCausalLM,"
                       "Qwen2ForCausalLM")
    only = ("--only", "llama,mamba2,mistral,qwen2")  # LlamaForCausalLM alone has four model types
    r = scan(tmp_path, fake_python, *only, "--markdown", str(tmp_path / "v.md"), "--json")
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert doc["engine"] == "vllm" and doc["vllm_version"] == "stand-in"
    bench = doc["benchmark"]
    # restarted once, after mistral: a fork of the zygote, so vLLM was imported once for two workers
    assert bench["architectures"] == 4 and bench["vllm_imports"] == 1 and bench["vllm_workers"] == 2
    by = {a["model_type"]: a for a in doc["architectures"]}
    assert {k: v["verdict"] for k, v in by.items()} == {"llama": OK, "mamba2": CRASHED, "mistral": CRASHED,
                                                        "qwen2": UNCONFIRMED}
    assert all(a["engine"] == "vllm" for a in by.values())
    llama = by["llama"]
    assert set(llama["schedules"]) == {"prefill", "chunked@3", "chunked@13", "chunked@32", "decode", "prefix"}
    assert llama["schedules"]["prefix"]["status"] == OK and llama["power"]["threshold"] > 0
    assert "mamba_mixer2.py" in by["mamba2"]["reason"] and by["mamba2"]["worst_schedule"] == "prefix"
    assert "vLLM's worker died" in by["mistral"]["reason"] and "Aborted" in by["mistral"]["reason"]
    assert by["qwen2"]["confirmation"]["why"].startswith("not confirmed: vLLM's engine has no float64 form")
    # one rule for every engine (`census.measured.verdict_fields`): power is kept whatever the word
    assert by["qwen2"]["power"]["threshold"] > 0 and by["mamba2"]["power"]["threshold"] > 0
    # every finding has a reproducer that needs no smearcli; here (no vLLM) it says so: exit 2, not 1
    for name in ("mamba2", "qwen2"):
        rep = Path(by[name]["reproducer"])
        assert rep.is_file() and "smearcli" not in rep.read_text().split('"""', 2)[2]
        assert by[name]["reproducer_status"] == 2
    md = (tmp_path / "v.md").read_text()
    assert "## Findings" in md and "| mamba2 | crashed | prefix |" in md and "mamba2-vllm.py" in md
    assert "| qwen2 | unconfirmed | prefill | 0.5 | prefill in one step departs as well" in md  # the model, not a cache
    # the record file is the census's: it reads back, and a resumed run checks nothing again
    assert [x.model_type for x in records.read(tmp_path / "v.jsonl").records] == ["llama", "mamba2", "mistral",
                                                                                      "qwen2"]
    from smearcli.census.record import FIELDS  # every field the engine writes is declared: none is dropped
    lines = (tmp_path / "v.jsonl").read_text().splitlines()
    assert lines and all(set(json.loads(x)) <= set(FIELDS) for x in lines)
    again = scan(tmp_path, fake_python, *only, "--resume", "--json")
    assert again.exit_code == 0 and json.loads(again.stdout)["benchmark"]["architectures"] == 0
    assert json.loads(again.stdout)["counts"] == doc["counts"]
    checked = scan(tmp_path, fake_python, *only, "--resume", "--check")
    assert checked.exit_code == 1  # crashed and unconfirmed fail --check on vLLM


# -- one architecture, judged (`engines.vllm.session.check`) and the census around it (`engines.vllm.session.Session` in `isolate.census`), on
# the stand-in in this process (`vllm_standin.InProcess`): the scan's end-to-end test above runs the
# same through the CLI, the worker process and the reproducers
@pytest.fixture
def in_process(monkeypatch):
    """A worker computing as the stand-in does, in this process; `plan` sets each model's mode."""
    monkeypatch.syspath_prepend(str(STANDIN.parent))
    import vllm_standin

    def make(**plan):
        monkeypatch.setenv("SMEARCLI_STANDIN_PLAN", json.dumps(plan))
        return vllm_standin.InProcess()
    return make


def census(worker, names, tmp_path):
    """The vLLM engine's session in the census's loop (`isolate.census`), as the scan runs it (each
    architecture in its forked process)."""
    from smearcli.census import isolate

    tmp_path.mkdir(parents=True, exist_ok=True)
    with records.Sink(tmp_path / "census.jsonl") as sink:
        recs = isolate.census(vllm.Session(worker), names, sink, timeout=600.0, memory=None,
                              repro_dir=tmp_path / "repro")
    return {r.model_type: r for r in recs}


def test_power_comes_first_and_the_init_scale_rises_until_the_state_shows(in_process, monkeypatch):
    """As in the transformers census: where zeroing the reference's state moves the logits too
    little, the init scale is raised (seeded) and vLLM runs the weights that had power; where no
    scale gives it, inconclusive, saying so. (Power is stood in, counting its calls from zero for
    each check.)"""
    from smearcli.judging import evidence
    from smearcli.engines.transformers import reference

    def weak_until(n):
        calls = []

        def power(runners, reference, tokens, threshold):
            calls.append(1)
            return evidence.Power(32, 1.0, {"kv": 500.0 if len(calls) >= n else 0.5})
        return power
    got = {}
    for n in (3, 99):
        monkeypatch.setattr(reference, "measure_power", weak_until(n))  # the ladder both engines climb
        got[n] = vllm.check("llama", in_process())
    assert got[3].verdict == OK and got[3].init == 0.3
    assert "the state was shown to matter only at initializer_range=0.3" in got[3].notes
    assert got[99].verdict == INCONCLUSIVE and got[99].init == 1.0
    assert any(n.startswith("the check never had power") for n in got[99].notes)


def test_an_engine_vllm_does_not_start_is_not_built_with_why(in_process):
    a = vllm.check("llama", in_process(llama="noengine"))
    assert a.verdict == NOT_BUILT and a.reason.startswith(vllm.ENGINE_REFUSED)
    assert "head size 16" in a.reason
    md = report.markdown([a])  # as --merge writes it: the version from the records
    assert md.startswith("# smearcli scan on vLLM: vLLM stand-in (CPU)")
    assert "## Not run on the CPU backend" in md and "| llama | vLLM did not start" in md


def test_an_engine_refused_after_other_models_is_tried_again_in_a_fresh_worker(in_process, tmp_path):
    again = "checked again in a fresh vLLM process"
    w = in_process(qwen2="stale", mistral="stale")
    by = census(w, ["mistral", "qwen2"], tmp_path)
    assert by["mistral"].verdict == OK and again not in by["mistral"].notes  # first: served nothing before
    assert by["qwen2"].verdict == OK and again in by["qwen2"].notes
    assert w.starts == 2  # the scan's benchmark counts these as vllm_imports
    # vLLM's config validation is the model's own: not retried (the same refusal in any process)
    w = in_process(qwen2="refused")
    by = census(w, ["mistral", "qwen2"], tmp_path / "refused")
    assert by["qwen2"].verdict == NOT_BUILT and "validation error for ModelConfig" in by["qwen2"].reason
    assert w.starts == 1 and again not in (by["qwen2"].notes or [])


def test_a_prefill_that_raises_is_not_built_not_a_cache_crash(in_process, tmp_path):
    a = vllm.check("llama", in_process(llama="noprefill"), repro_dir=tmp_path)
    assert a.verdict == NOT_BUILT and a.reason.startswith("vLLM's prefill in one step raises on the CPU backend")
    assert "selective_scan_fwd" in a.reason and a.reproducer is None


def test_a_schedule_stuck_inside_vllm_is_that_schedules_crash_and_the_rest_not_run(in_process, tmp_path):
    """The worker's watchdog interrupts a request stuck inside vLLM and skips what is left (its
    threads cannot be stopped): the stuck schedule is the crash, the others say they did not run;
    the next architecture gets a fresh worker."""
    w = in_process(llama="stuck")
    by = census(w, ["llama", "qwen2"], tmp_path)
    a = by["llama"]
    assert a.vllm.stuck and w.starts == 2  # qwen2 gets a fresh worker
    assert a.verdict == CRASHED and a.worst_schedule == "chunked@3"
    assert a.reason.startswith("chunked@3: vLLM's engine did not finish the request in 120 s (at vllm/")
    assert a.schedules["prefill"].status == OK
    assert {a.schedules[n].status for n in ("chunked@13", "decode", "prefix")} == {"not run"}
    assert by["qwen2"].verdict == OK
    assert a.reproducer_status == 2  # its reproducer ran, in the worker's Python: no vLLM there, exit 2


def test_options_the_vllm_census_refuses(fake_python, tmp_path, monkeypatch):
    monkeypatch.delenv(ENV_PYTHON, raising=False)
    r = runner.invoke(app, ["scan", "--engine", "vllm", "--out", str(tmp_path / "v.jsonl")])
    assert r.exit_code == 2 and "--engine vllm needs --engine-python" in r.stderr
    r = runner.invoke(app, ["scan", "--engine", "vllm", "--jobs", "2", "--engine-python", str(fake_python)])
    assert r.exit_code == 2 and "one architecture at a time" in r.stderr
    r = runner.invoke(app, ["scan", "--engine", "sglang"])
    assert r.exit_code == 2 and "--engine takes transformers or vllm" in r.stderr
    r = scan(tmp_path, fake_python, "--only", "gpt_neo")  # transformers has it, the stand-in's vLLM does not
    assert r.exit_code == 2 and "--only: gpt_neo is not an architecture both" in r.stderr


def test_records_keep_the_engine_fields():
    rec = record.bare("llama", "ok", engine="vllm", vllm_version="0.32.0", vllm={"engine_start_s": [1.5, 2.0]})
    out = report.document([rec])["architectures"][0]
    assert out["engine"] == "vllm" and out["vllm_version"] == "0.32.0" and out["vllm"] == {"engine_start_s": [1.5, 2.0]}
    s = vllm.summary([rec], None, 10.0)
    assert s["engine_start_s"] == 3.5 and s["engine_start_share"] == 35.0


PY = os.environ.get(ENV_PYTHON, "").strip()


@pytest.mark.vllm
@pytest.mark.slow
@pytest.mark.skipif(not PY, reason=f"set {ENV_PYTHON} to vLLM's interpreter to run this")
def test_two_architectures_in_real_vllm(tmp_path, monkeypatch):
    """Llama agrees on every schedule; Mamba2's prefix caching crashes inside vLLM 0.32
    (mamba_mixer2.py), and its reproducer, run with -I in vLLM's Python, exits 1; so does the
    hybrid Falcon-H1's, once its prefix reaches past a block of the engine's raised size (64). The
    census's engines inspect their class in the worker: vLLM's cache of classes inspected in a
    fresh Python gets only the reproducers' (which run vLLM as a user would)."""
    monkeypatch.setenv("VLLM_CACHE_ROOT", str(tmp_path / "vllm-cache"))
    r = runner.invoke(app, ["scan", "--engine", "vllm", "--only", "llama,mamba2,falcon_h1", "--out",
                            str(tmp_path / "v.jsonl"), "--repro-dir", str(tmp_path / "repro"), "--timeout", "900",
                            "--json"])
    assert r.exit_code == 0, r.output
    by = {a["model_type"]: a for a in json.loads(r.stdout)["architectures"]}
    assert by["llama"]["verdict"] == OK and by["llama"]["schedules"]["prefix"]["steps"] == "32,32"
    assert len(by["llama"]["vllm"]["engine_start_s"]) == 1 and len(by["mamba2"]["vllm"]["engine_start_s"]) == 2
    assert by["mamba2"]["verdict"] == CRASHED and "mamba_mixer2.py" in by["mamba2"]["reason"]
    assert by["mamba2"]["reproducer_status"] == 1
    assert by["falcon_h1"]["verdict"] == CRASHED and by["falcon_h1"]["worst_schedule"] == "prefix"
    assert "mamba_mixer2.py" in by["falcon_h1"]["reason"] and by["falcon_h1"]["reproducer_status"] == 1
    inspected = sorted(f.name for f in (tmp_path / "vllm-cache" / "modelinfos").iterdir())
    assert inspected == ["vllm-model_executor-models-falcon_h1-FalconH1ForCausalLM.json",
                         "vllm-model_executor-models-mamba2-Mamba2ForCausalLM.json"], inspected


def gen_script():
    """scripts/gen_census.py, whose `--engine vllm` writes the census on vLLM into its guide (its
    skip without vLLM's environment: tests/census/test_scan_regen.py)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("gen_census", ROOT / "scripts" / "gen_census.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_the_benchmark_splits_the_records_into_the_runs_that_wrote_them():
    def rec(starts, imported, wall):
        return record.bare("m", "ok", wall_s=wall,
                           vllm={"starts": starts, "import_s_so_far": imported, "engine_start_s": [1.0, 2.0]})
    # run 1: one start, then a restart (2 starts, 40 s imported in all); run 2: a fresh start (25 s)
    recs = [rec(1, 20.0, 5), rec(1, 20.0, 5), rec(2, 40.0, 5), rec(1, 25.0, 5)]
    assert [len(r) for r in gen_script().runs_of(recs)] == [3, 1]


def test_the_census_takes_as_long_as_its_longest_scan(tmp_path, monkeypatch):
    """The regen step runs the census as scans at once sharing the architectures; its time is the
    longest scan's (its architectures plus its vLLM imports), its shares are of the scans' time
    together."""
    gen = gen_script()
    monkeypatch.setattr(gen, "lane_file", lambda lane: tmp_path / f"{lane}.jsonl")

    def rec(name, imported, wall):
        return json.dumps({"model_type": name, "verdict": "ok", "wall_s": wall,
                           "vllm": {"starts": 1, "import_s_so_far": imported, "engine_start_s": [3.0, 3.0]}})
    (tmp_path / "1.jsonl").write_text("\n".join([rec("a", 30.0, 60), rec("b", 30.0, 60)]) + "\n")  # 150 s
    (tmp_path / "2.jsonl").write_text(rec("c", 30.0, 210) + "\n")  # 240 s
    line = gen.vllm_benchmark()
    assert line.startswith("3 architectures checked in 4.0 minutes, 2 scans at once sharing the architectures on "
                           "two cores"), line
    assert "Of the scans' 6.5 minutes together, importing vLLM took 60 s (15%) and starting engines 18 s (5%)" in line


def test_a_resumed_census_claims_what_either_scan_recorded(tmp_path, monkeypatch):
    """Each run starts a fresh claims folder holding the architectures the scans' files already
    record, so a resumed census checks none of them again and no architecture lands in two files."""
    gen = gen_script()
    monkeypatch.setattr(gen, "lane_file", lambda lane: tmp_path / f"{lane}.jsonl")
    monkeypatch.setattr(gen, "VLLM_CLAIMS", tmp_path / "claims")
    (tmp_path / "claims").mkdir()
    (tmp_path / "claims" / "stale").touch()  # claimed by a scan that stopped before its record
    (tmp_path / "1.jsonl").write_text(json.dumps({"model_type": "llama", "verdict": "ok"}) + "\n")
    (tmp_path / "2.jsonl").write_text(json.dumps({"model_type": "qwen2", "verdict": "ok"}) + "\n\n")
    gen.fresh_claims()
    assert sorted(x.name for x in (tmp_path / "claims").iterdir()) == ["llama", "qwen2"]


def test_the_census_asks_a_shorter_watchdog_and_the_prefill_to_decide(tmp_path):
    """The census's requests (tiny models, seconds each) give up on a request after CENSUS_STUCK_S and
    stop after a one-step prefill that raises; `compare --impl vllm`, on a user's model, keeps 120 s
    and runs every schedule."""
    import torch

    from smearcli.engines import vllm as engine
    from smearcli.engines.vllm import session

    tokens = torch.tensor([[1, 2, 3, 4]])
    req = session.request(tmp_path, tokens, 16, [{"name": "prefill"}])
    assert (req["stuck_s"], req["prefill_decides"]) == (session.CENSUS_STUCK_S, True) and session.CENSUS_STUCK_S < 120
    plain = engine.payload(engine.Settings("", str(tmp_path), 16), tokens, [{"name": "prefill"}])
    assert (plain["stuck_s"], plain["prefill_decides"]) == (120.0, False)
