"""`scan --engine llamacpp` on the real llama.cpp: runs when $SMEARCLI_LLAMACPP_PYTHON names the Python
of an environment made by scripts/make_env.sh llamacpp (skipped with the reason otherwise). The
converter's list must hold Llama and Mamba; a tiny Llama must be ok on every schedule; a tiny
Mamba must give every schedule a result, its partial seq_rm refused as llama.cpp documents
(`unsupported`) or run, never a crash of smearcli's."""

import json

import pytest
from typer.testing import CliRunner

pytest.importorskip("transformers", reason="transformers is not installed: pip install 'smearcli[hf]'")

from smearcli.cli.app import app  # noqa: E402
from smearcli.engines.llamacpp import LLAMACPP_SCHEDULES, session as llamacpp  # noqa: E402

from conftest import LLAMACPP_PYTHON as PYTHON, NEEDS_LLAMACPP  # noqa: E402

pytestmark = NEEDS_LLAMACPP
ALL = set(LLAMACPP_SCHEDULES)  # the engine's own list


def test_the_converters_architectures_include_llama_and_mamba():
    names = llamacpp.names_for(PYTHON)
    assert {"llama", "mamba", "jamba", "lfm2"} <= set(names) and len(names) >= 40


def test_a_tiny_llama_is_ok_and_a_tiny_mamba_gives_every_schedule_a_result(tmp_path):
    r = CliRunner().invoke(app, ["scan", "--engine", "llamacpp", "--engine-python", PYTHON, "--only", "llama,mamba",
                                 "--jobs", "2", "--out", str(tmp_path / "s.jsonl"), "--repro-dir",
                                 str(tmp_path / "repro"), "--json"])
    assert "Traceback" not in r.output, r.output
    recs = {a["model_type"]: a for a in json.loads(r.stdout)["architectures"]}
    llama, mamba = recs["llama"], recs["mamba"]
    assert llama["verdict"] == "ok" and set(llama["schedules"]) == ALL, llama
    assert all(s["status"] == "ok" for s in llama["schedules"].values())
    assert llama["llamacpp"]["arch"] == "llama" and llama["llamacpp"]["convert_s"] is not None
    assert set(mamba["schedules"]) == ALL and mamba["llamacpp"]["recurrent"] is True
    assert mamba["verdict"] in ("ok", "unconfirmed", "crashed", "inconclusive"), mamba
    rollback = mamba["schedules"]["rollback"]
    assert rollback["status"] in ("ok", "unsupported", "unconfirmed", "crashed"), rollback
    if rollback["status"] == "unsupported":
        assert "documented limit" in rollback["why"]
