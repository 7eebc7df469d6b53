"""`scan --engine NAME` with a name that is not an engine: a usage error (exit 2) in one line that
names the value given and lists every engine the census runs on, before anything is started or
written (no --out, --markdown or reproducer directory appears, an existing --out is left as it was)."""

import pytest
from typer.testing import CliRunner

from smearcli.cli.app import app
from smearcli.cli.commands.scan import ENGINES


@pytest.mark.parametrize("name", ["sglang", "VLLM", "vllm ", "", "llama.cpp", "transformers,vllm"])
def test_an_unknown_engine_is_a_usage_error_listing_the_engines(name, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "scan.jsonl"
    out.write_text('{"an": "earlier record"}\n')
    r = CliRunner().invoke(app, ["scan", "--engine", name, "--out", str(out), "--markdown", "scan.md",
                                 "--repro-dir", "repro", "--only", "llama"])
    assert r.exit_code == 2, r.output
    lines = r.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("smearcli: error: --engine takes "), r.stderr
    assert lines[0].endswith(f"got {name!r}")
    listed = lines[0].removeprefix("smearcli: error: --engine takes ").split(", got ")[0]
    assert sorted(listed.replace(" or ", ", ").split(", ")) == sorted(ENGINES)
    assert r.stdout == ""
    assert sorted(p.name for p in tmp_path.iterdir()) == ["scan.jsonl"]
    assert out.read_text() == '{"an": "earlier record"}\n'
