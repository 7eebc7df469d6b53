"""scripts/regen.py's census steps and the one script they run, scripts/gen_census.py --engine
ENGINE: the census of the transformers another Python has (a release installed in its own venv),
the page from records already made, and the diff's previous release; vLLM's and llama.cpp's steps
skipped without their environment; an engine or an option the script does not know refused."""

import importlib.util
import stat
import subprocess
import sys

import pytest

from conftest import ROOT  # the clone's root


def load(name):
    spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def regen():
    return load("regen")


def test_the_census_step_runs_with_the_python_given_and_passes_the_records_on(tmp_path, monkeypatch, capsys):
    mod = regen()
    ran = []
    monkeypatch.setattr(mod, "run", lambda step, cmd, env: ran.append((step, cmd)))
    monkeypatch.setattr(sys, "argv", ["regen.py", "--only", "census", "--python", sys.executable,
                                      "--from", str(tmp_path / "new.jsonl"), "--against", str(tmp_path / "old.jsonl"),
                                      "--against-source", str(tmp_path / "old")])
    mod.main()
    ((step, cmd),) = ran
    assert step == "census"
    assert cmd == [sys.executable, "scripts/gen_census.py", "--engine", "transformers",
                   "--from", str(tmp_path / "new.jsonl"), "--against", str(tmp_path / "old.jsonl"),
                   "--against-source", str(tmp_path / "old")]
    import transformers

    assert f"regen: census: transformers {transformers.__version__} ({sys.executable})" in capsys.readouterr().out


def test_a_python_without_transformers_stops_the_step_in_one_line(tmp_path, monkeypatch):
    mod = regen()
    fake = tmp_path / "python"
    fake.write_text("#!/bin/sh\necho \"ModuleNotFoundError: No module named 'transformers'\" >&2\nexit 1\n")
    fake.chmod(fake.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setattr(mod, "run", lambda *a: pytest.fail("the census ran without transformers"))
    monkeypatch.setattr(sys, "argv", ["regen.py", "--only", "census", "--python", str(fake)])
    with pytest.raises(SystemExit) as e:
        mod.main()
    assert str(e.value) == (f"regen: census: {fake} cannot import transformers: "
                            "ModuleNotFoundError: No module named 'transformers'")


@pytest.mark.parametrize("argv, said", [
    (["--only", "snippets", "--python", "p"], "--python steers only the census step"),
    (["--only", "census", "--against-source", "d"], "--against-source needs --against"),
])
def test_census_options_without_their_step_are_refused(monkeypatch, capsys, argv, said):
    mod = regen()
    monkeypatch.setattr(mod, "run", lambda *a: pytest.fail("a step ran"))
    monkeypatch.setattr(sys, "argv", ["regen.py", *argv])
    with pytest.raises(SystemExit) as e:
        mod.main()
    assert e.value.code == 2
    assert said in capsys.readouterr().err


def test_the_vllm_and_llamacpp_steps_run_the_census_script_for_their_engine(monkeypatch):
    mod = regen()
    ran = []
    monkeypatch.setattr(mod, "run", lambda step, cmd, env: ran.append((step, cmd)))
    monkeypatch.setattr(sys, "argv", ["regen.py", "--only", "vllm-census,llamacpp-census"])
    mod.main()
    assert ran == [("vllm-census", [sys.executable, "scripts/gen_census.py", "--engine", "vllm"]),
                   ("llamacpp-census", [sys.executable, "scripts/gen_census.py", "--engine", "llamacpp"])]


@pytest.mark.parametrize("engine, var, whose", [("vllm", "SMEARCLI_VLLM_PYTHON", "vLLM's"),
                                                ("llamacpp", "SMEARCLI_LLAMACPP_PYTHON", "llama.cpp's")])
@pytest.mark.parametrize("args", [[], ["--resume"], ["--write-only"]])
def test_an_engines_census_without_its_environment_is_skipped_in_one_line(monkeypatch, capsys, engine, var, whose,
                                                                           args):
    gen = load("gen_census")
    monkeypatch.setenv(var, " ")
    monkeypatch.setattr(gen, "smearcli_scan", lambda *a, **k: pytest.fail("a scan ran without the environment"))
    monkeypatch.setattr(gen, "write_block", lambda *a, **k: pytest.fail("a page was written without the environment"))
    gen.main(["--engine", engine, *args])  # returns: exit status 0
    assert capsys.readouterr().out == (f"gen_census --engine {engine}: skipped: set {var} to the Python of {whose} "
                                       f"environment (scripts/make_env.sh {engine} DIR makes one)\n")


def test_an_unknown_engine_is_refused_naming_the_engines():
    r = subprocess.run([sys.executable, str(ROOT / "scripts" / "gen_census.py"), "--engine", "sglang"],
                       check=False, capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr.splitlines()[-1] == ("gen_census.py: error: argument --engine: invalid choice: 'sglang' "
                                         "(choose from 'transformers', 'vllm', 'llamacpp')"), r.stderr


@pytest.mark.parametrize("argv, said", [
    (["--resume"], "--resume is not an option of --engine transformers"),
    (["--engine", "vllm", "--from", "a.jsonl"], "--from is not an option of --engine vllm"),
    (["--engine", "llamacpp", "--against", "a.jsonl", "--diff-only"],
     "--against, --diff-only are not options of --engine llamacpp"),
    (["--diff-only"], "--diff-only needs --against"),
])
def test_an_option_of_another_engine_is_refused(monkeypatch, capsys, argv, said):
    gen = load("gen_census")
    monkeypatch.setattr(gen, "smearcli_scan", lambda *a, **k: pytest.fail("a scan ran"))
    with pytest.raises(SystemExit) as e:
        gen.main(argv)
    assert e.value.code == 2
    assert capsys.readouterr().err.splitlines()[-1] == f"gen_census.py: error: {said}"


def test_a_census_block_replaces_what_is_between_its_markers_alone(tmp_path, monkeypatch, capsys):
    gen = load("gen_census")
    monkeypatch.setattr(gen, "ROOT", tmp_path)
    page = tmp_path / "page.md"
    page.write_text("# T\n<!-- x:start -->\nold\n<!-- x:end -->\ntail <!-- x:end -->\n")
    gen.write_block(page, "x", "\nnew\n", "who")
    assert page.read_text() == "# T\n<!-- x:start -->\nnew\n<!-- x:end -->\ntail <!-- x:end -->\n"
    assert capsys.readouterr().out == "who: page.md updated\n"
    with pytest.raises(SystemExit) as e:
        gen.write_block(page, "census-diff", "", "gen_census")
    assert str(e.value) == f"gen_census: {page} has no census-diff markers"
