"""The bench harness: warm-up, alternation, statistics, FLOP counts and the JSON schema.

No test here asserts a wall-clock time: timing goes through an injected fake clock that only
the recording runner advances, so every expected number is computed from what the test itself
made each run "take"."""

import json
import random

import pytest
import torch
from typer.testing import CliRunner

from smearcli.gpt import flops
from smearcli.bench import harness, meters, report, stats
from smearcli.bench.rounds import alternate
from smearcli.cli.app import app
from smearcli.measure.inputs import random_tokens
from smearcli.gpt.weights import random_config, random_model
from smearcli.gpt.model import GPT, Linear
from smearcli.measure.schedules import ScheduleOptions, chunk_plan, run_schedule


@pytest.fixture(scope="module")
def tiny():
    return random_model(random_config(1, sequence_len=64), seed=0).model


class FakeClock:
    def __init__(self):
        self.t = 0.0

    def __call__(self):
        return self.t


class Recorder:
    """A `run` for bench: runs the real schedule, records the call and advances the fake clock
    by a duration the test chose (old: base, fixed: base * factor, base growing per call)."""

    def __init__(self, clock, factor=1.25):
        self.clock, self.factor, self.calls, self.durations = clock, factor, [], []

    def __call__(self, model, tokens, schedule, logic, options, capture):
        assert capture is False  # bench must time the plain schedule, no hidden-state copies
        out = run_schedule(model, tokens, schedule, logic, options, capture=capture)
        k = len(self.calls)
        d = (1.0 + 0.1 * k) * (self.factor if logic == "fixed" else 1.0)
        self.calls.append((schedule, logic))
        self.durations.append(d)
        self.clock.t += d
        return out


# -- statistics -----------------------------------------------------------------------------------
@pytest.mark.parametrize("n", [1, 2, 3, 4, 7, 10, 31])
def test_quantile_matches_numpy_linear_interpolation(n):
    np = pytest.importorskip("numpy")
    rng = random.Random(n)
    xs = [rng.uniform(0, 10) for _ in range(n)]
    for q in (0.0, 0.25, 0.5, 0.75, 1.0, 0.1):
        assert stats.quantile(xs, q) == pytest.approx(float(np.percentile(xs, 100 * q)), rel=1e-12)


def test_summary_fields():
    xs = [5.0, 1.0, 4.0, 2.0, 3.0]
    s = stats.Summary.of(xs)
    assert (s.n, s.median, s.min, s.max) == (5, 3.0, 1.0, 5.0)
    assert (s.q1, s.q3, s.iqr) == (2.0, 4.0, 2.0)
    with pytest.raises(ValueError):
        stats.quantile([], 0.5)


# -- the alternation ------------------------------------------------------------------------------
def _fake_fns(order, clock, durations):
    def make(name):
        def fn():
            order.append(name)
            clock.t += durations[name]
        return fn
    return {name: make(name) for name in durations}


@pytest.mark.parametrize("warmup,repeats", [(0, 1), (1, 3), (3, 2)])
def test_alternate_warmup_count_and_order(warmup, repeats):
    clock, order, log = FakeClock(), [], []
    fns = _fake_fns(order, clock, {"old": 2.0, "fixed": 3.0})
    rounds = alternate(fns, warmup, repeats, meters.Timer("cpu", clock).measure, log=log, what="s")
    assert order == ["old", "fixed"] * (warmup + repeats)
    assert [e[0] for e in log] == ["warmup"] * (2 * warmup) + ["timed"] * (2 * repeats)
    assert rounds.samples == {"old": [2.0] * repeats, "fixed": [3.0] * repeats}
    assert rounds.memory == {}


def test_alternate_memory_run_is_extra_and_untimed():
    clock, order = FakeClock(), []
    fns = _fake_fns(order, clock, {"old": 1.0, "fixed": 1.0})
    seen = []

    def memory(fn):
        seen.append(order[-1] if order else None)
        fn()
        return 123

    rounds = alternate(fns, 1, 2, meters.Timer("cpu", clock).measure, memory=memory)
    assert order == ["old", "fixed"] * 4  # 1 warm-up + 2 timed + 1 memory round
    assert len(rounds.samples["old"]) == 2
    assert rounds.memory == {"old": 123, "fixed": 123}


@pytest.mark.parametrize("warmup", [0, 2])
def test_alternate_auto_repeats_sees_one_round(warmup):
    clock, order = FakeClock(), []
    fns = _fake_fns(order, clock, {"old": 2.0, "fixed": 3.0})
    seen = []

    def choose(round_s):
        seen.append(round_s)
        return 4

    rounds = alternate(fns, warmup, choose, meters.Timer("cpu", clock).measure)
    assert seen == [5.0]  # asked once, with one round's time
    assert len(rounds.samples["old"]) == len(rounds.samples["fixed"]) == 4
    assert order == ["old", "fixed"] * (warmup + 4)


def test_choose_repeats_budget_and_clamp():
    s = harness.BenchSettings(min_repeats=3, max_repeats=20, memory=True, budget_s=30.0)
    assert s.choose_repeats(1.0, 30.0, 3) == 9  # 10 s share / 1 s round, less the memory round
    assert s.choose_repeats(100.0, 30.0, 1) == 3
    assert s.choose_repeats(1e-4, 30.0, 1) == 20
    assert harness.BenchSettings(repeats=7).choose_repeats(100.0, 1.0, 1) == 7


def test_pair_ratios():
    assert stats.pair_ratios({"old": [2.0, 4.0], "fixed": [3.0, 2.0]}) == [1.5, 0.5]
    assert stats.pair_ratios({"old": [1.0]}) is None


# -- the whole harness on a tiny model ------------------------------------------------------------
def test_bench_alternates_and_summarises(tiny):
    clock = FakeClock()
    rec = Recorder(clock, factor=1.25)
    tokens = random_tokens(tiny.config, 16)
    opts = ScheduleOptions(chunks=4)
    settings = harness.BenchSettings(warmup=2, repeats=3, micro=False, peak=False, memory=True, budget_s=1e9)
    progress = []
    res = harness.bench(tiny, tokens, ["prefill", "chunked"], ["old", "fixed"], opts, settings,
                      timer=meters.Timer("cpu", clock), run=rec,
                      progress=lambda d, done, total: progress.append((done, total)))
    per_sched = ["old", "fixed"] * (2 + 3 + 1)  # warm-up, timed, memory
    assert rec.calls == [("prefill", lg) for lg in per_sched] + [("chunked", lg) for lg in per_sched]
    # timed samples are exactly the durations the recorder made the timed calls take
    for i, sched in enumerate(["prefill", "chunked"]):
        d = rec.durations[i * 12:(i + 1) * 12]
        old, fixed = d[4:10:2], d[5:10:2]
        assert res.cell(sched, "old").samples == pytest.approx(old)
        assert res.cell(sched, "fixed").samples == pytest.approx(fixed)
        assert res.ratio(sched).ratios == pytest.approx([f / o for f, o in zip(fixed, old)])
        assert res.cell(sched, "old").summary.median == pytest.approx(sorted(old)[1])
    # every run was reported to the progress callback, and the bar ends full
    assert [p[0] for p in progress[:-1]] == list(range(24))
    assert progress[-1] == (24, 24)
    # token and FLOP accounting per cell
    c = res.cell("chunked", "fixed")
    assert c.steps == len(chunk_plan(16, opts))
    assert c.tokens == 16
    assert c.flops == flops.span_flops(tiny.config, 0, 16)  # a prompt of 16 from position 0
    assert c.tokens_per_s == pytest.approx(16 / c.summary.median)
    assert isinstance(c.peak_mem, int) or c.peak_mem is None


def test_bench_single_logic_has_no_ratio(tiny):
    clock = FakeClock()
    rec = Recorder(clock)
    settings = harness.BenchSettings(warmup=1, repeats=2, micro=False, peak=False, memory=False)
    res = harness.bench(tiny, random_tokens(tiny.config, 8), ["decode"], ["fixed"], ScheduleOptions(),
                      settings, timer=meters.Timer("cpu", clock), run=rec)
    assert rec.calls == [("decode", "fixed")] * 3
    assert res.ratios == [] and len(res.cells) == 1
    assert res.cell("decode", "fixed").steps == 8


def test_engine_tokens_and_flops_count_expanded_rows(tiny):
    clock = FakeClock()
    opts = ScheduleOptions(samples=3, gen_len=4)
    settings = harness.BenchSettings(warmup=0, repeats=1, micro=False, peak=False, memory=False)
    res = harness.bench(tiny, random_tokens(tiny.config, 12), ["engine"], ["old"], opts, settings,
                      timer=meters.Timer("cpu", clock), run=Recorder(clock))
    c = res.cell("engine", "old")
    assert c.tokens == 8 + 3 * 4
    # the prompt of 8 once, then each of 3 rows decodes one token at positions 8 to 11
    expected = flops.span_flops(tiny.config, 0, 8) + 3 * sum(flops.span_flops(tiny.config, p, 1) for p in range(8, 12))
    assert c.flops == expected


def test_micro_benchmark_runs_both_smears_on_same_inputs(tiny):
    calls = []
    orig = dict(harness.LOGICS)

    def spy(name):
        def fn(x, w, lam, prev, cached):
            calls.append((name, x.data_ptr(), prev.data_ptr(), tuple(x.shape), cached))
            return orig[name](x, w, lam, prev, cached)
        return fn

    settings = harness.BenchSettings(warmup=1, micro_repeats=4, micro_inner=2)
    try:
        harness.LOGICS.update({k: spy(k) for k in orig})
        cases = harness.micro_bench(tiny, 1, 5, ["old", "fixed"], settings, meters.Timer("cpu"))
    finally:
        harness.LOGICS.update(orig)
    assert [c.name for c in cases] == ["chunk", "decode"]
    assert cases[0].shape == (1, 5, tiny.config.n_embd) and cases[1].shape == (1, 1, tiny.config.n_embd)
    for c in cases:
        assert len(c.samples["old"]) == len(c.samples["fixed"]) == len(c.ratio.ratios) == 4
    chunk_calls = [cl for cl in calls if cl[3][1] == 5]
    assert len(chunk_calls) == 2 * 2 * (10 + 4)  # 2 calls per sample, 10 warm-up + 4 timed rounds, 2 logics
    assert {(cl[1], cl[2]) for cl in chunk_calls} == {(chunk_calls[0][1], chunk_calls[0][2])}  # same tensors
    assert all(cl[4] for cl in calls)
    assert [cl[0] for cl in chunk_calls[:4]] == ["old", "old", "fixed", "fixed"]


def test_timer_clocks():
    assert meters.Timer("cpu").name == "wall"
    t = meters.Timer("cpu", "cpu")
    assert t.name == "cpu" and t.measure(lambda: sum(range(1000))) >= 0
    with pytest.raises(ValueError):
        meters.Timer("cuda", "cpu")  # CPU time cannot see GPU work
    with pytest.raises(ValueError):
        meters.Timer("cpu", "sundial")


def test_memory_meter_cpu():
    m = meters.MemoryMeter("cpu")
    out = m.measure(lambda: torch.ones(4_000_000).sum())
    assert out is None or out >= 0
    assert m.kind in ("peak RSS growth", "ru_maxrss growth")


def test_bench_rejects_bad_settings(tiny):
    t = random_tokens(tiny.config, 8)
    with pytest.raises(ValueError):
        harness.bench(tiny, t, ["prefill"], settings=harness.BenchSettings(repeats=0))
    with pytest.raises(ValueError):
        harness.bench(tiny, t, [], settings=harness.BenchSettings(repeats=1))
    with pytest.raises(ValueError):
        harness.bench(tiny, t, ["prefill"], ["new"], settings=harness.BenchSettings(repeats=1))


# -- FLOP accounting ------------------------------------------------------------------------------
@pytest.mark.parametrize("depth,kv,pattern", [(1, None, "L"), (2, None, "SSSL"), (4, 1, "SL"), (3, None, "SSL")])
def test_matmul_params_match_the_model(depth, kv, pattern):
    cfg = random_config(depth, sequence_len=64, window_pattern=pattern)
    if kv is not None:
        from dataclasses import replace
        cfg = replace(cfg, n_kv_head=kv)
    model = GPT(cfg)
    counted = sum(m.weight.numel() for m in model.modules() if isinstance(m, Linear))
    assert flops.matmul_params(cfg) == counted


@pytest.mark.parametrize("start,n", [(0, 1), (0, 40), (3, 7), (30, 50), (100, 3), (0, 200)])
def test_span_flops_brute_force(start, n):
    cfg = random_config(2, sequence_len=64, window_pattern="SL")  # windows 128 and 64
    brute = 0
    for p in range(start, start + n):
        brute += 2 * flops.matmul_params(cfg)
        for w in cfg.window_sizes:
            keys = sum(1 for j in range(p + 1) if p - j <= w)  # what model.attention's mask allows
            brute += 4 * cfg.n_embd * keys
    assert flops.span_flops(cfg, start, n) == brute


def test_flops_do_not_depend_on_the_split():
    cfg = random_config(2, sequence_len=64)
    T = 150
    whole = flops.span_flops(cfg, 0, T)
    assert flops.run_flops(cfg, [T], 1) == whole
    assert flops.run_flops(cfg, [40, 60, 1, 49], 1) == whole
    assert sum(flops.span_flops(cfg, p, 1) for p in range(T)) == whole  # one token at a time
    assert flops.run_flops(cfg, [T], 3) == 3 * whole
    assert flops.run_tokens([100, 50], 2, rows=6, expand_at=100) == 2 * 100 + 6 * 50


# -- JSON and CLI ---------------------------------------------------------------------------------
def test_json_schema(tiny):
    clock = FakeClock()
    settings = harness.BenchSettings(warmup=1, repeats=2, micro=False, peak=False, memory=False)
    res = harness.bench(tiny, random_tokens(tiny.config, 8), ["prefill", "decode"], ["old", "fixed"],
                      ScheduleOptions(chunks=2), settings, timer=meters.Timer("cpu", clock), run=Recorder(clock))
    d = json.loads(json.dumps(report.to_json(res, {"name": "tiny"})))
    assert d["schema"] == "smearcli.bench/1"
    assert set(d) >= {"model", "input", "environment", "settings", "peak", "cells", "ratios", "smear_micro"}
    assert d["input"] == {"batch": 1, "seq_len": 8}
    assert d["model"]["config"]["n_layer"] == 1 and d["model"]["name"] == "tiny"
    env = d["environment"]
    assert env["torch"] == torch.__version__ and env["threads"] == torch.get_num_threads()
    assert env["dtype"] == "float32" and env["device"] == "cpu"
    assert [(c["schedule"], c["logic"]) for c in d["cells"]] == [
        ("prefill", "old"), ("prefill", "fixed"), ("decode", "old"), ("decode", "fixed")]
    for c in d["cells"]:
        assert len(c["samples_s"]) == 2
        s = c["summary_s"]
        assert s["median"] == pytest.approx(sum(c["samples_s"]) / 2)
        assert s["iqr"] == pytest.approx(s["q3"] - s["q1"])
        assert c["peak_fraction"] is None
    for r in d["ratios"]:
        assert r["of"] == "fixed/old" and len(r["pairs"]) == 2


def test_cli_bench_json_and_table(tmp_path):
    runner = CliRunner()
    out = tmp_path / "b.json"
    args = ["bench", "--depth", "1", "--seq-len", "12", "--chunks", "3", "--warmup", "1", "--repeats", "2",
            "--no-peak", "--schedules", "full,chunked"]
    r = runner.invoke(app, args + ["--json", "-o", str(out)])
    assert r.exit_code == 0, r.output
    d = json.loads(r.stdout)
    assert d["schema"] == "smearcli.bench/1"
    assert [c["schedule"] for c in d["cells"]] == ["full", "full", "chunked", "chunked"]
    assert json.loads(out.read_text())["cells"][0]["schedule"] == "full"
    assert {m["case"] for m in d["smear_micro"]} == {"chunk", "decode"}
    threads = torch.get_num_threads()
    try:
        r = runner.invoke(app, args + ["--json", "--clock", "cpu", "--threads", "1"])
    finally:
        torch.set_num_threads(threads)  # --threads sets it process-wide
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["environment"]["clock"] == "cpu"
    assert json.loads(r.stdout)["environment"]["threads"] == 1
    r = runner.invoke(app, args + ["--peak"])
    assert r.exit_code == 0, r.output
    assert "fixed / old" in r.stdout and "% peak" in r.stdout and "threads" in r.stdout


def test_cli_preset_sets_size_unless_given():
    runner = CliRunner()
    r = runner.invoke(app, ["bench", "--preset", "d12", "--depth", "1", "--seq-len", "10", "--repeats", "1",
                            "--warmup", "0", "--no-peak", "--no-micro", "--schedules", "prefill", "--json"])
    assert r.exit_code == 0, r.output
    d = json.loads(r.stdout)
    assert d["model"]["config"]["sequence_len"] == 2048  # the preset's context
    assert d["model"]["config"]["n_layer"] == 1 and d["input"]["seq_len"] == 10  # explicit wins
    assert d["model"]["preset"] == "d12"


def test_busy_cpu_uses_one_thread():
    from smearcli.util.threads import busy_cpu_threads
    assert busy_cpu_threads(loadavg=8.0, cpu_count=2) == 1
    assert busy_cpu_threads(loadavg=0.5, cpu_count=2) is None
    assert busy_cpu_threads(loadavg=3.0, cpu_count=1) is None  # one core: nothing to contend


def test_cli_preset_fills_defaults():
    from smearcli.cli.options import PresetName, RunSpec
    spec = RunSpec(preset=PresetName("d20"))
    assert (spec.model_kind().value, spec.seq_len_value()) == ("random", 2048)
    assert RunSpec(preset=PresetName("d12"), seq_len=10).seq_len_value() == 10  # explicit wins


@pytest.mark.parametrize("args", [["--repeats", "0"], ["--warmup", "-1"], ["--budget", "0"],
                                  ["--preset", "d12", "--checkpoint", "nowhere"], ["-o", "x.txt"],
                                  ["--impl", "nanochat", "--nanochat-path", "."]])
def test_cli_bad_options_exit_2(args):
    r = CliRunner().invoke(app, ["bench"] + args)
    assert r.exit_code == 2, r.output
    assert "error" in r.output


# -- CUDA (skipped without a GPU) -----------------------------------------------------------------
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cuda_path():
    lm = random_model(random_config(1, sequence_len=64), seed=0, device="cuda", dtype=torch.bfloat16)
    tokens = random_tokens(lm.model.config, 16).cuda()
    settings = harness.BenchSettings(warmup=1, repeats=2, micro_repeats=3, peak=True, peak_size=256)
    res = harness.bench(lm.model, tokens, ["prefill", "chunked"], settings=settings)
    assert res.env["device_name"] == torch.cuda.get_device_name(0)
    assert res.memory_kind == "cuda allocator peak"
    assert all(isinstance(c.peak_mem, int) and c.peak_mem > 0 for c in res.cells)
    assert res.peak is not None and res.peak.dtype == "bfloat16"


# -- keeping to the budget ------------------------------------------------------------------------
class FakeDecodeSampler:
    """A `sample_decode` whose every one-token step "takes" `step_s` on the fake clock (fixed: x factor)."""

    def __init__(self, clock, step_s, factor=1.1):
        self.clock, self.step_s, self.factor, self.calls = clock, step_s, factor, []

    def __call__(self, model, tokens, logic, sample, measure, caches=None):
        self.calls.append((logic, sample.start, sample.steps))
        d = sample.steps * self.step_s * (self.factor if logic == "fixed" else 1.0)
        return measure(lambda: setattr(self.clock, "t", self.clock.t + d))


def test_bench_samples_decode_when_whole_decodes_overrun_the_budget(tiny):
    clock = FakeClock()
    sampler = FakeDecodeSampler(clock, step_s=0.5)  # a whole 64-token decode "takes" 32 s
    tokens = random_tokens(tiny.config, 64)
    settings = harness.BenchSettings(warmup=1, micro=False, peak=False, memory=False, budget_s=20.0)
    res = harness.bench(tiny, tokens, ["decode"], ["old", "fixed"], ScheduleOptions(), settings,
                        timer=meters.Timer("cpu", clock), run=Recorder(clock), sample_decode=sampler)
    old, fixed = res.cell("decode", "old"), res.cell("decode", "fixed")
    k = old.sampled.steps
    assert 8 <= k < 64 and old.sampled.total == 64 and fixed.sampled == old.sampled
    # every timed sample is k steps' time scaled to 64 steps: the whole decode's 32 s
    assert old.samples == pytest.approx([32.0] * len(old.samples))
    assert fixed.samples == pytest.approx([32.0 * 1.1] * len(fixed.samples))
    assert res.ratio("decode").summary.median == pytest.approx(1.1)
    assert clock.t <= 2 * settings.budget_s  # what the fake decodes "took" in all
    doc = report.to_json(res)
    cell = doc["cells"][0]
    assert cell["sampled"]["timed_steps"] == k and cell["sampled"]["of_steps"] == 64
    assert cell["steps"] == 64 and cell["tokens"] == 64


def test_bench_times_whole_decodes_when_they_fit(tiny):
    clock = FakeClock()
    sampler = FakeDecodeSampler(clock, step_s=0.001)
    settings = harness.BenchSettings(warmup=1, micro=False, peak=False, memory=False, budget_s=20.0)
    res = harness.bench(tiny, random_tokens(tiny.config, 64), ["decode"], ["old", "fixed"], ScheduleOptions(),
                        settings, timer=meters.Timer("cpu", clock), run=Recorder(clock), sample_decode=sampler)
    assert res.cell("decode", "old").sampled is None
    assert len(sampler.calls) == 2  # the probe only


def test_report_says_when_pairs_are_too_few_for_an_iqr_and_the_peak_method(tiny):
    from rich.console import Console
    clock = FakeClock()
    settings = harness.BenchSettings(warmup=0, repeats=2, micro=False, peak=False, memory=False)
    res = harness.bench(tiny, random_tokens(tiny.config, 8), ["prefill"], ["old", "fixed"], ScheduleOptions(),
                        settings, timer=meters.Timer("cpu", clock), run=Recorder(clock))
    res.peak = meters.Peak(64, "float32", [2.0, 1.0, 3.0], warmup=4)
    con = Console(record=True, width=200)
    report.render(res, con)
    text = con.export_text()
    assert "IQR not shown: only 2 pair(s)" in text
    assert "best of 3 after 4 warm-up" in text
    assert res.peak.flops_per_s == pytest.approx(2 * 64 ** 3 / 1.0)  # the fastest sample


def test_peak_is_best_of_n_after_warmup():
    clock = FakeClock()
    times = iter([5.0, 4.0, 3.0] + [2.0, 1.5, 1.0, 1.2, 1.1])  # warm-up, then timed

    class T(meters.Timer):
        def measure(self, fn):
            fn()
            clock.t += (d := next(times))
            return d
    p = meters.measure_peak(torch.device("cpu"), torch.float32, T("cpu", clock), size=8, warmup=3,
                            repeats=5, warmup_s=0.0, max_s=100.0)
    assert p.warmup == 3 and p.samples == [2.0, 1.5, 1.0, 1.2, 1.1] and min(p.samples) == 1.0


def test_memory_from_warmup_when_the_extra_run_does_not_fit():
    clock, order = FakeClock(), []
    fns = _fake_fns(order, clock, {"old": 1.0, "fixed": 1.0})
    measured = []

    def memory(fn):
        measured.append(clock.t)
        fn()
        return 7
    rounds = alternate(fns, 1, 2, meters.Timer("cpu", clock).measure, memory=memory,
                               memory_extra=lambda round_s: False)
    assert order == ["old", "fixed"] * 3  # warm-up, two timed rounds, no extra run
    assert rounds.memory == {"old": 7, "fixed": 7} and measured == [0.0, 1.0]  # in the warm-up round
