"""scripts/regen.py's census step: the census of the transformers another Python has (a release
installed in its own venv), the page from records already made, and the diff's previous release."""

import importlib.util
import stat
import sys

import pytest

from conftest import ROOT  # the clone's root


def regen():
    spec = importlib.util.spec_from_file_location("regen", ROOT / "scripts" / "regen.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


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
    assert cmd == [sys.executable, "docs/gen_census.py", "--from", str(tmp_path / "new.jsonl"),
                   "--against", str(tmp_path / "old.jsonl"), "--against-source", str(tmp_path / "old")]
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
