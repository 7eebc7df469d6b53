"""`scan --release` and `scan --bisect` (`smearcli.engines.transformers.releases`), on stand-in releases: tiny
transformers wheels built here (`release_standin.wheel`), installed in venvs under a scratch cache,
run by a stand-in smearcli (`release_standin.py`); nothing is downloaded. And derivation of a
multimodal registration from its text config (`tiny.derive.text_part`)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from smearcli.engines.transformers import releases
from smearcli.util.errors import UserError

import release_standin  # noqa: E402 - tests/ is on sys.path (conftest)
from hardening_util import invoke  # noqa: E402
from conftest import ROOT  # noqa: E402

STANDIN = Path(release_standin.__file__)
T = release_standin.STANDIN_TYPE
# the stand-in releases: toyarch missing, then ok, then a bug (verdict None: not registered)
VERDICTS = {"5.90.0": None, "5.91.0": "ok", "5.92.0": "bug"}


@pytest.fixture(scope="module")
def wheels(tmp_path_factory):
    d = tmp_path_factory.mktemp("wheels")
    for v, verdict in VERDICTS.items():
        release_standin.wheel(d, v, verdict, requires=["packaging>=20", "tokenizers>=0.1; extra == 'x'"])
    return d


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return tmp_path_factory.mktemp("releases")


@pytest.fixture
def standin(monkeypatch, cache, tmp_path):
    """The stand-in smearcli in each release's Python, the scratch cache, what it saw."""
    monkeypatch.setattr(releases, "PROGRAM", (str(STANDIN),))
    monkeypatch.setenv(releases.ENV_VAR, str(cache))
    seen = tmp_path / "seen.jsonl"
    monkeypatch.setenv("STANDIN_SEEN", str(seen))
    monkeypatch.chdir(tmp_path)
    return seen


def saw(seen: Path) -> list[dict]:
    return [json.loads(line) for line in seen.read_text().splitlines()] if seen.exists() else []


# -- wheels, release numbers, ranges ----------------------------------------------------------------
def test_a_file_that_is_not_a_transformers_wheel_of_that_release_is_refused(tmp_path, wheels):
    fake = tmp_path / "transformers-5.91.0-py3-none-any.whl"
    fake.write_text("<html>not found</html>")
    with pytest.raises(UserError, match="not a wheel"):
        releases.read_wheel(fake)
    other = release_standin.wheel(tmp_path, "5.91.0", "ok", name="tokenizers")
    with pytest.raises(UserError, match="a wheel of tokenizers 5.91.0, not of transformers"):
        releases.read_wheel(other)
    with pytest.raises(UserError, match="not of 5.92.0"):
        releases.read_wheel(wheels / "transformers-5.91.0-py3-none-any.whl", "5.92.0")
    renamed = tmp_path / "w" / "transformers-5.92.0-py3-none-any.whl"  # its name lies: its metadata says 5.91
    renamed.parent.mkdir()
    renamed.write_bytes((wheels / "transformers-5.91.0-py3-none-any.whl").read_bytes())
    with pytest.raises(UserError, match="a wheel of transformers 5.91.0, not of 5.92.0"):
        releases.fetch("5.92.0", renamed.parent)
    w = releases.read_wheel(wheels / "transformers-5.91.0-py3-none-any.whl", "5.91")
    assert w.version == "5.91.0" and releases.pins(w) == ["packaging>=20"]  # the extra's pin left out


def test_release_numbers_ranges_and_the_listing_of_a_wheel_directory(wheels, tmp_path):
    assert releases.release("5.23") == "5.23.0" and releases.release(" 5.24.0 ") == "5.24.0"
    for bad, said in (("4.57.1", "only 5.x"), ("five", "not a transformers release"), ("5.25.0rc1", "not a")):
        with pytest.raises(UserError, match=said):
            releases.release(bad)
    (tmp_path / "transformers-4.57.1-py3-none-any.whl").write_text("")
    (tmp_path / "transformers-5.10.0-py3-none-any.whl").write_text("")
    (tmp_path / "transformers-5.9.0-py3-none-any.whl").write_text("")
    (tmp_path / "tokenizers-5.1.0-py3-none-any.whl").write_text("")
    assert releases.listed(tmp_path) == ["5.9.0", "5.10.0"]  # 5.x only, in release order, not by name
    assert releases.listed(wheels) == list(VERDICTS)
    vs = ["5.20.0", "5.21.0", "5.22.0", "5.23.0"]
    assert releases.pick(vs, "5.21.0..5.22.0") == ["5.21.0", "5.22.0"]
    assert releases.pick(vs, "5.21..") == ["5.21.0", "5.22.0", "5.23.0"] and releases.pick(vs, None) == vs
    for span, said in (("5.22.0..5.21.0", "comes after"), ("5.19.0..", "not a release here"),
                       ("5.21.0", "not a range"), ("5.21.0..5.21.0", "two releases at least")):
        with pytest.raises(UserError, match=said):
            releases.pick(vs, span)


def test_unmet_requirements_are_listed_with_what_is_installed():
    have = {"tokenizers": "0.22.0", "packaging": "24.0"}
    assert releases.unsatisfied(["tokenizers<0.24,>=0.23.1", "packaging>=20", "kernels<0.20,>=0.19.1"],
                                have.get) == ["tokenizers<0.24,>=0.23.1 (0.22.0 installed)",
                                              "kernels<0.20,>=0.19.1 (not installed)"]


def test_offline_the_error_says_how_to_point_at_a_wheel_directory(monkeypatch, tmp_path):
    """pip with no index (as offline): `Unreachable`, and the CLI's one line names --wheels."""
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(tmp_path))
    monkeypatch.setenv(releases.ENV_VAR, str(tmp_path / "cache"))
    with pytest.raises(releases.Unreachable, match="pip could not fetch transformers==5.93.0"):
        releases.fetch("5.93.0")
    assert not list((tmp_path / "cache" / "wheels").iterdir())  # nothing half-downloaded left
    r = invoke(["scan", "--release", "5.93.0", "--only", "llama"], allowed=(2,))
    assert "pass --wheels DIR" in r.stderr and "pip download --no-deps transformers==X -d DIR" in r.stderr


# -- the search, on probes given -----------------------------------------------------------------------
def search(verdicts: dict, failing=("bug",)):
    asked = []

    def check(v):
        asked.append(v)
        verdict = verdicts[v]
        return releases.Probe(v, verdict, verdict in failing)
    said = []
    return releases.bisect(list(verdicts), check, "arch", said.append), asked, said


def test_bisect_finds_where_a_finding_appears_and_where_it_is_gone_in_log_probes():
    vs = [f"5.{i}.0" for i in range(10, 26)]  # 16 releases
    appears = {v: "bug" if i >= 11 else "ok" for i, v in enumerate(vs)}
    found, asked, said = search(appears)
    assert (found.appeared, found.gone) == ("5.21.0", None) and len(asked) <= 2 + 4
    assert "appears in transformers 5.21.0" in found.answer and len(said) == len(asked)
    gone = {v: "bug" if i < 5 else "crashed" for i, v in enumerate(vs)}  # crashed: not a finding
    found, asked, _ = search(gone)
    assert (found.appeared, found.gone) == ("5.10.0", "5.15.0") and "gone in transformers 5.15.0" in found.answer
    found, asked, _ = search({v: "ok" for v in vs})
    assert found.appeared is None and len(asked) == 2 and "no finding at either end" in found.answer
    found, _, _ = search({v: "bug" for v in vs})
    assert found.appeared == "5.10.0" and found.gone is None and "every release probed" in found.answer


def test_a_release_without_the_architecture_counts_as_without_the_finding():
    vs = {"5.1.0": None, "5.2.0": None, "5.3.0": "ok", "5.4.0": "bug"}
    found, _, said = search(vs)
    assert found.appeared == "5.4.0" and "transformers 5.1.0: not in this release" in said[0]
    with pytest.raises(UserError, match="registered neither in transformers 5.1.0 nor in 5.2.0"):
        search({"5.1.0": None, "5.2.0": None})


# -- a stand-in release made and run ---------------------------------------------------------------
def test_scan_release_reruns_the_same_scan_in_the_release_python(standin, wheels, cache):
    r = invoke(["scan", "--release", "5.91.0", "--wheels", wheels, "--only", T, "--timeout", "30", "--check", "all"])
    assert r.exit_code == 0, r.output
    (run,) = saw(standin)
    assert run["version"] == "5.91.0"  # the release's transformers, not smearcli's own
    # all but --release and --wheels, the positional `all` included
    assert run["argv"] == ["scan", "--only", T, "--timeout", "30.0", "--check", "all"]
    env = cache / "envs" / f"5.91.0-{releases.base_key()}"
    assert Path(run["python"]).parent.parent == env and (env / releases.READY).is_file()
    assert not [p for p in (cache / "envs").iterdir() if p.name.startswith(".")]  # no half-made venv left
    assert "(made in" in r.stderr
    again = invoke(["scan", "--release", "5.91.0", "--wheels", wheels, "--only", T])
    assert "(made in" not in again.stderr and saw(standin)[-1]["python"] == run["python"]  # kept, reused


def test_the_release_scans_exit_status_is_the_commands(standin, wheels, monkeypatch):
    """The release's scan said its own error (here none: it only exits 1, as --check does)."""
    from hardening_util import runner
    from smearcli.cli.app import app

    monkeypatch.setenv("STANDIN_STATUS", "1")
    r = runner.invoke(app, ["scan", "--release", "5.91.0", "--wheels", str(wheels), "--only", T])
    assert r.exit_code == 1 and "smearcli: error" not in r.stderr and "Traceback" not in r.output


def test_an_unmet_requirement_that_cannot_be_installed_is_refused_and_leaves_no_venv(wheels, tmp_path, monkeypatch):
    d = tmp_path / "w"
    d.mkdir()
    release_standin.wheel(d, "5.95.0", "ok", requires=["smearcli-no-such-package>=1"])
    monkeypatch.setenv(releases.ENV_VAR, str(tmp_path / "cache"))
    with pytest.raises(UserError, match=r"needs smearcli-no-such-package>=1 \(not installed\), which smearcli's"):
        releases.environment("5.95.0", d)
    assert not list((tmp_path / "cache" / "envs").iterdir())


def test_bisect_on_stand_in_releases_finds_the_first_with_the_finding(standin, wheels, cache):
    r = invoke(["scan", "--bisect", T, "--wheels", wheels, "--timeout", "30"])
    assert r.exit_code == 0, r.output
    out = r.stdout.strip().splitlines()
    assert out[-1].startswith(f"{T}: the finding appears in transformers 5.92.0 (bug; 5.91.0: ok)")
    assert "transformers 5.90.0   not in this release" in out[0]
    probes = [s for s in r.stderr.splitlines() if s.startswith(f"bisect {T}: transformers")]
    assert len(probes) == 3  # both ends, then the one between
    records = {json.loads(p.read_text())["verdict"] for p in (cache / "records").glob(f"*/{T}.jsonl")}
    assert records == {"ok", "bug"}
    first = saw(standin)
    assert all(a["argv"][:3] == ["scan", "--only", T] and "--timeout" in a["argv"] for a in first)
    again = invoke(["scan", "--bisect", T, "--wheels", wheels, "--releases", "5.91.0..5.92.0"])
    assert again.stdout.strip().splitlines()[-1].startswith(f"{T}: the finding appears in transformers 5.92.0")
    assert "read from an earlier search" in again.stderr
    assert len(saw(standin)) == len(first)  # nothing probed again: the records under the cache were read
    other = invoke(["scan", "--bisect", T, "--wheels", wheels, "--releases", "5.91.0..5.92.0",
                    "--bisect-path", "no such path*"])  # the same records, followed on a path they do not fail on
    assert f"a finding only on a path matching 'no such path*'" in other.stderr
    assert "no finding at either end" in other.stdout.strip().splitlines()[-1], other.stdout


@pytest.mark.parametrize("args, said", [
    (["--bisect", T, "--release", "5.91.0"], "give one of them"),
    (["--releases", "5.91.0..5.92.0"], "it needs --bisect"),
    (["--wheels", "."], "it needs one of them"),
    (["--bisect", T, "--out", "x.jsonl"], "--out has no meaning with it"),
    (["--bisect", "a,b"], "one model type"),
    (["--bisect-path", "rollback*"], "it needs --bisect"),
])
def test_release_options_that_do_not_go_together_are_refused(args, said):
    r = invoke(["scan", *args], allowed=(2,))
    assert said in r.stderr


# -- derivation of a multimodal registration ------------------------------------------------------------
def test_a_composite_registration_derives_from_its_text_config(monkeypatch):
    """A stand-in multimodal config whose causal LM is declared on its text config: the tiny config
    is that text config, shrunk (the composite's own derivation would make the vision part too, and
    a release whose model reads the composite's top level builds nothing); a composite whose text
    config the causal-LM mapping does not build stays as registered."""
    pytest.importorskip("transformers")
    import transformers
    from transformers import CONFIG_MAPPING, PretrainedConfig
    from transformers.models.auto import modeling_auto

    from smearcli.tiny import derive

    class StandinTextConfig(PretrainedConfig):
        model_type = "standin_mm_text"

        def __init__(self, hidden_size=4096, num_hidden_layers=32, num_attention_heads=32, vocab_size=150000, **kw):
            self.hidden_size, self.num_hidden_layers = hidden_size, num_hidden_layers
            self.num_attention_heads, self.vocab_size = num_attention_heads, vocab_size
            super().__init__(**kw)

    class StandinConfig(PretrainedConfig):
        model_type = "standin_mm"
        sub_configs = {"text_config": StandinTextConfig}

        def __init__(self, text_config=None, **kw):
            self.text_config = StandinTextConfig(**text_config) if isinstance(text_config, dict) else \
                text_config or StandinTextConfig()
            super().__init__(**kw)

    class StandinForCausalLM:
        config_class = StandinTextConfig

    mapping = {StandinConfig: StandinForCausalLM, StandinTextConfig: StandinForCausalLM}
    monkeypatch.setattr(modeling_auto, "MODEL_FOR_CAUSAL_LM_MAPPING", mapping)
    monkeypatch.setitem(CONFIG_MAPPING._extra_content, "standin_mm", StandinConfig)
    d = derive.derive("standin_mm")
    assert d.error is None and type(d.config) is StandinTextConfig
    assert (d.config.hidden_size, d.config.num_attention_heads, d.config.vocab_size) == (64, 4, 256)
    assert "hidden_size" in d.changed and not any(k.startswith("text_config.") for k in d.changed)
    del mapping[StandinTextConfig]  # the text config is not built by the mapping: the composite stays
    assert type(derive.derive("standin_mm").config) is StandinConfig
    assert transformers.__version__  # the installed release's own registrations are untouched


def test_a_reproducer_rebuilds_a_text_config_derived_from_a_composite_registration():
    """qwen3_5 registers its multimodal config and is derived from its text config: the reproducer
    rebuilds the text config (its own model_type), not the composite with text keys on top."""
    pytest.importorskip("transformers")
    import types

    import transformers

    from smearcli.tiny import derive
    from smearcli.engines.transformers import repro

    d = derive.derive("qwen3_5")
    assert d.error is None and type(d.config).__name__ == "Qwen3_5TextConfig"

    class Built:
        def __init__(self, cfg):
            self.config = cfg

        def float(self):
            return self

        def eval(self):
            return self

    fake = types.SimpleNamespace(CONFIG_MAPPING=transformers.CONFIG_MAPPING,
                                 AutoModelForCausalLM=types.SimpleNamespace(from_config=Built))
    scope = {"transformers": fake, "torch": __import__("torch"), "MODEL_TYPE": "qwen3_5", "SEED": 0,
             "CONFIG": {k: v for k, v in d.config.to_dict().items() if k not in ("transformers_version", "architectures")}}
    exec(repro.MODEL.replace("{{", "{").replace("}}", "}"), scope)  # the fragment every reproducer holds
    cfg = scope["build"]().config
    assert type(cfg) is type(d.config) and cfg.hidden_size == 64


def test_a_bisect_can_follow_one_path(tmp_path):
    """--bisect-path: a probe's record is a finding only where one of its findings lies on a matching
    path; a release whose finding lies elsewhere (qwen3_5: its chunk starts up to 5.6, then the
    crop of #49036) counts as without it, so the search follows the one finding asked about."""
    from smearcli.census import record as census_record

    env = releases.Env("5.20.0", Path(sys.executable))
    out = releases.record_path("5.20.0", "arch", tmp_path)
    out.parent.mkdir(parents=True)
    rec = census_record.new("arch", "bug", worst_schedule="rollback", shape="state not rolled back")
    out.write_text(json.dumps(rec.to_json()) + "\n")

    def probe(path):
        return releases.probe(env, "arch", lambda o, r: [], ("bug",), root=tmp_path, path=path)
    assert probe(None).finding and probe("rollback*").finding
    assert not probe("chunks of *").finding and probe("chunks of *").verdict == "bug"
    assert releases.on_path(rec, "rollback") and not releases.on_path(rec, "generate: *")
