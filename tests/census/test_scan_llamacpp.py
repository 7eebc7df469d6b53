"""`scan --engine llamacpp` without compiling llama.cpp: the census against the stand-in worker
(tests/llamacpp_standin.py: it speaks the worker's protocol, lists the converter's architectures
as $SMEARCLI_STANDIN_ARCHS, and computes every schedule with transformers, misbehaving per mode).
The expected verdicts follow from what each mode does, not from a previous run: every schedule
equal to the full pass is ok with power; a micro-batch width off from position 5 is the cache
finding there; a one-call prefill off at position 3 on every path is the implementation's own
departure; a refused partial seq_rm is the rollback's `unsupported`; a refused conversion is
`not built`. The real engine is tests/census/test_scan_llamacpp_real.py."""

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

pytest.importorskip("transformers", reason="transformers is not installed: pip install 'smearcli[hf]'")

from smearcli.cli.app import app  # noqa: E402
from smearcli.engines.llamacpp import session as llamacpp  # noqa: E402
from conftest import standin_python  # noqa: E402

runner = CliRunner()
STANDIN = Path(__file__).resolve().parents[1] / "llamacpp_standin.py"
ALL = {"prefill", "ubatch", "chunked", "decode", "prefix", "rollback", "batched", "restore", "swa", "mixed", "split", "shift",
       "flash"}


@pytest.fixture
def fake_python(tmp_path):
    return standin_python(tmp_path, STANDIN)


def scan(tmp_path, python, monkeypatch, only, mode="good", *extra):
    monkeypatch.setenv("SMEARCLI_STANDIN_MODE", mode)
    out = tmp_path / f"{mode}.jsonl"
    r = runner.invoke(app, ["scan", "--engine", "llamacpp", "--engine-python", str(python), "--only", only,
                            "--out", str(out), "--repro-dir", str(tmp_path / "repro"), "--json", *extra])
    assert "Traceback" not in r.output, r.output
    doc = json.loads(r.stdout) if r.stdout.strip().startswith("{") else None
    return r, {a["model_type"]: a for a in doc["architectures"]} if doc else None, doc


def test_two_architectures_are_ok_with_every_schedule_and_a_page(tmp_path, fake_python, monkeypatch):
    md = tmp_path / "census.md"
    r, recs, doc = scan(tmp_path, fake_python, monkeypatch, "llama,mamba", "good", "--markdown", str(md))
    assert r.exit_code == 0, r.output
    assert sorted(recs) == ["llama", "mamba"]
    for rec in recs.values():
        assert rec["verdict"] == "ok", rec
        assert rec["engine"] == "llamacpp" and rec["llamacpp"]["llama_cpp_python"] == "0.3.36"
        assert set(rec["schedules"]) == ALL
        assert all(s["status"] == "ok" for s in rec["schedules"].values())
        assert rec["power"] and rec["floor"] > 0
    assert doc["benchmark"]["architectures"] == 2 and "census on llama.cpp: 2 architectures" in r.stderr
    page = md.read_text()
    assert "| llama | ok |" in page and "| mamba | ok |" in page and "2 architectures: 2 ok" in page
    # a pipe inside a cell is escaped, so the cell reads as written and the row keeps its columns
    assert "max \\|d log-prob\\|" in page and "/d log-prob/" not in page


@pytest.mark.slow  # a finding and its reruns: 12 s
def test_a_micro_batch_error_is_the_cache_finding_at_its_first_position(tmp_path, fake_python, monkeypatch):
    r, recs, _ = scan(tmp_path, fake_python, monkeypatch, "llama", "skew", "--check")
    assert r.exit_code == 1, r.output  # --check: unconfirmed fails on an engine without a float64 rerun
    rec = recs["llama"]
    assert rec["verdict"] == "unconfirmed" and rec["worst_schedule"] == "ubatch"
    assert rec["reason"].startswith(llamacpp.FINDING) and rec["born_at"] == "logits@5"
    assert rec["llamacpp"]["departure"] == llamacpp.CACHE
    assert rec["shape"].startswith(llamacpp.BOUNDARY["ubatch"])
    assert rec["schedules"]["ubatch"]["first"] == 5 and rec["schedules"]["prefill"]["status"] == "ok"
    repro = Path(rec["reproducer"])
    assert repro.name == "llama-llamacpp.py" and (repro.parent / "llama-llamacpp.gguf").is_file()
    text = repro.read_text()
    assert "import smearcli" not in text and "'width': 5" in text
    assert rec["reproducer_status"] == 2  # the stand-in's "environment" has no llama.cpp: nothing reproduced
    # replicated before it is one: the same width departs on the next seed and at the default head counts
    rep = rec["replication"]
    assert rep["ties"] == 0 and rep["second_seed"]["departure"] == llamacpp.CACHE
    assert rep["default_counts"]["rerun"]["worst_schedule"] == "ubatch"
    assert any(n.startswith("replicated: on seed 1 (weights and tokens) ubatch departs again") for n in rec["notes"])


@pytest.mark.slow  # a finding and its reruns: 9 s
def test_a_cache_finding_a_rerun_does_not_show_again_is_not_replicated(tmp_path, fake_python, monkeypatch):
    monkeypatch.setenv("SMEARCLI_STANDIN_ONCE", str(tmp_path / "ran-once"))
    md = tmp_path / "census.md"
    r, recs, _ = scan(tmp_path, fake_python, monkeypatch, "llama", "once", "--markdown", str(md))
    rec = recs["llama"]
    assert rec["verdict"] == "unconfirmed" and rec["llamacpp"]["departure"] == llamacpp.NOT_REPLICATED
    assert rec["reason"].startswith("not replicated: on seed 1 (weights and tokens) ubatch gives ok; cache finding")
    assert rec["replication"]["second_seed"]["departure"] is None and "default_counts" not in rec["replication"]
    page = md.read_text()
    assert "## Findings" not in page  # not a cache finding: said in its row, not listed among the findings


def test_a_departure_already_in_the_one_call_prefill_is_the_implementations(tmp_path, fake_python, monkeypatch):
    r, recs, _ = scan(tmp_path, fake_python, monkeypatch, "llama", "own")
    rec = recs["llama"]
    assert rec["verdict"] == "unconfirmed" and rec["worst_schedule"] == "prefill"
    assert rec["reason"].startswith(llamacpp.OWN) and rec["reproducer"] is None and rec["born_at"] is None
    assert rec["llamacpp"]["departure"] == llamacpp.IMPLEMENTATION
    # one rule for every engine (`census.measured.verdict_fields`): the headline's rerun, and why none confirms it
    assert rec["confirmation"]["status"] == "unconfirmed" and rec["confirmation"]["float64_lifted"] is None
    assert rec["power"]["threshold"] > 0


def test_the_page_sorts_departures_by_the_field_not_the_reasons_words():
    """A record whose reason begins like a cache finding but whose engine data says the
    implementation's own departure is listed with the implementation's, and the other way round."""
    from smearcli.census.record import new

    base = dict(engine="llamacpp", schedules={"prefill": {"status": "unconfirmed", "max_abs": 0.5, "multiple": 9.0}})
    own = new("alpha", "unconfirmed", reason=llamacpp.FINDING + ": worded like one",
              llamacpp={"departure": llamacpp.IMPLEMENTATION}, **base)
    cache = new("beta", "unconfirmed", reason=llamacpp.OWN + ": worded like one", worst_schedule="ubatch",
                llamacpp={"departure": llamacpp.CACHE}, **base)
    page = "\n".join(llamacpp.sections([own, cache]))
    findings, _, rest = page.partition("## The implementation's own departures")
    assert "| beta |" in findings and "| alpha |" not in findings
    assert "| alpha |" in rest.split("## Every architecture")[0] and "| beta |" not in rest.split("## Every architecture")[0]


def test_a_refused_rollback_is_unsupported_and_a_refused_conversion_not_built(tmp_path, fake_python, monkeypatch):
    r, recs, _ = scan(tmp_path, fake_python, monkeypatch, "mamba", "refuse")
    rec = recs["mamba"]
    assert rec["verdict"] == "ok", rec
    assert rec["schedules"]["rollback"]["status"] == "unsupported"
    assert "documented limit" in rec["schedules"]["rollback"]["why"]
    r, recs, _ = scan(tmp_path, fake_python, monkeypatch, "llama", "noconvert")
    assert recs["llama"]["verdict"] == "not built" and "not supported" in recs["llama"]["reason"]
    # the temporary directory the model was converted in is not the record's (nor the page's) business
    assert "MODEL_DIR/model/config.json" in recs["llama"]["reason"], recs["llama"]["reason"]


def test_only_names_outside_the_converters_list_and_no_environment_are_refused(tmp_path, fake_python, monkeypatch):
    r, _, _ = scan(tmp_path, fake_python, monkeypatch, "gpt2")
    assert r.exit_code == 2 and "gpt2 is not an architecture both llama.cpp's converter" in r.output
    monkeypatch.delenv("SMEARCLI_LLAMACPP_PYTHON", raising=False)
    r = runner.invoke(app, ["scan", "--engine", "llamacpp", "--only", "llama", "--out", str(tmp_path / "x.jsonl")])
    assert r.exit_code == 2 and "--engine llamacpp needs --engine-python PATH (or $SMEARCLI_LLAMACPP_PYTHON)" in r.output


def test_a_setting_llamacpp_hard_codes_is_the_tiny_configs_and_the_default_is_rerun_beside_it(tmp_path, fake_python,
                                                                                           monkeypatch):
    """mistral's converter writes no sliding window: the census runs the window llama.cpp carries
    (none, as released Mistral-7B-v0.3 sets it) and says what the config class's default gave."""
    monkeypatch.setenv("SMEARCLI_STANDIN_ARCHS", "MistralForCausalLM")
    r, recs, _ = scan(tmp_path, fake_python, monkeypatch, "mistral")
    rec = recs["mistral"]
    assert rec["verdict"] == "ok", rec
    carried = rec["llamacpp"]["carried"]
    assert carried["settings"] == {"sliding_window": None} and carried["layers"] is None
    assert carried["default"]["verdict"] == "ok"  # the stand-in computes every run with transformers
    assert carried["kind"] == "hard-coded by llama.cpp"
    assert any(n.startswith("hard-coded by llama.cpp: the tiny config takes sliding_window None (the converter "
                            "converts mistral as llama") and n.endswith("with the config class's defaults it is ok")
               for n in rec["notes"])
    assert rec["config"]["sliding_window"] is None  # the record says the config it ran


def test_an_engine_keeps_a_whole_period_of_a_layer_pattern_it_hard_codes():
    from smearcli.tiny import derive

    plain = derive.derive("llama4_text")
    assert plain.config.num_hidden_layers == 2 and plain.config.attention_chunk_size == 4
    got = derive.derive("llama4_text", *(lambda c: (c.settings, c.layers))(llamacpp.CARRIED["llama4_text"]))
    c = got.config
    assert c.num_hidden_layers == 4 and c.attention_chunk_size == 8192
    assert c.layer_types == ["chunked_attention"] * 3 + ["full_attention"] and c.no_rope_layers == [1, 1, 1, 0]
    assert c.moe_layers == [0, 1, 2, 3] and got.changed["num_hidden_layers"] == (48, 4)
    assert got.changed["attention_chunk_size"] == (8192, 8192)  # the default, kept: what llama.cpp hard-codes


@pytest.mark.slow  # a census of two through the server: 10 s
def test_a_census_forks_its_workers_from_one_server_and_leaves_nothing_behind(tmp_path, fake_python, monkeypatch):
    """The census starts llama.cpp's Python once, as its fork server (`engines.llamacpp.forkserver`),
    and every architecture's worker is forked from it, past the imports that were nearly all of the
    census's time; the same verdicts as fresh workers; at the end the server and its socket are gone."""
    import tempfile

    starts, made, mkdtemp = tmp_path / "starts", [], tempfile.mkdtemp

    def recorded(*a, **k):  # the directories the census makes: the server's socket lives in one
        made.append(mkdtemp(*a, **k))
        return made[-1]
    monkeypatch.setattr(tempfile, "mkdtemp", recorded)
    monkeypatch.setenv("SMEARCLI_STANDIN_STARTS", str(starts))
    r, recs, _ = scan(tmp_path, fake_python, monkeypatch, "llama,mamba")
    assert r.exit_code == 0 and {a: x["verdict"] for a, x in recs.items()} == {"llama": "ok", "mamba": "ok"}, r.output
    assert starts.read_text().split() == ["serve"]  # one start of llama.cpp's Python as a worker: the server
    servers = [d for d in made if Path(d).name.startswith("smearcli-llamacpp-")]
    assert servers and not any(Path(d).exists() for d in servers), servers  # a deep TMPDIR too (pytest's)
    from smearcli.engines.llamacpp import forkserver

    assert forkserver.RUNNING == {}


def test_an_engine_setting_the_config_class_does_not_declare_is_written_all_the_same():
    """llama.cpp's converter reads config.json, not the config class: deepseek_v3's router needs
    `scoring_func`, a key transformers' class lacks (its code fixes sigmoid), so an engine's setting
    is kept even where the class has no such field, and said in what the derivation changed."""
    from smearcli.tiny import derive
    from smearcli.engines.llamacpp.session import CARRIED, CONVERTER_DEFECT, HARD_CODED

    got = derive.derive("deepseek_v3", {"scoring_func": "sigmoid"})
    assert got.error is None and got.config.scoring_func == "sigmoid"
    assert got.changed["scoring_func"] == (None, "sigmoid")
    assert "scoring_func" in got.config.to_dict()  # what save_pretrained writes, so the converter reads it
    assert CARRIED["deepseek_v3"].kind == HARD_CODED and CARRIED["glm"].kind == CONVERTER_DEFECT


def test_the_llamacpp_figure_shows_each_path_against_llamacpps_own_prefill():
    """The page's figure holds llama.cpp's cache as the census does: a schedule's distance from
    llama.cpp's one-call prefill (`vs_prefill`), not from transformers, as a multiple of the floor;
    the one-call prefill itself, and a schedule nobody measured, have no cell."""
    import math

    from smearcli.census.record import bare
    from smearcli.render import scan_figure

    recs = [bare(model_type="a", verdict="unconfirmed", floor=1e-7,
                 schedules={"prefill": {"status": "unconfirmed", "multiple": 5000.0},
                            "shift": {"status": "unconfirmed", "multiple": 5000.0, "vs_prefill": 1e-3},
                            "rollback": {"status": "unsupported", "why": "refused"}}),
            bare(model_type="b", verdict="ok", floor=2e-7,
                 schedules={"prefill": {"status": "ok", "multiple": 1.0},
                            "shift": {"status": "ok", "multiple": 1.0, "vs_prefill": 2e-7}})]
    rows, cols, cells = scan_figure.grid(recs, scan_figure.against_own_prefill)
    assert rows == ["a (unconfirmed)", "b (ok)"] and cols == ["shift"]
    assert [round(c[0], 6) for c in cells] == [4.0, 0.0]
    rows, cols, cells = scan_figure.grid(recs)  # the transformers page's: against the full pass
    assert cols == ["prefill", "shift"] and math.isclose(cells[0][0], math.log10(5000.0))
