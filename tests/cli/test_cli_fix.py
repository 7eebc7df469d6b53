"""`smearcli fix` on copies of the test stand-in: the diff alone on stdout, --write with a backup,
the audit before and after, and unrecognised code left untouched with the reason."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from smearcli.cli.app import app

OLD = Path(__file__).resolve().parents[1] / "standin" / "old"
runner = CliRunner()
AUDIT = ["--model", "random", "--depth", "1", "--seq-len", "24", "--gen-len", "4", "--chunks", "3",
         "--schedules", "chunked", "--device", "cpu"]


@pytest.fixture
def checkout(tmp_path) -> Path:
    shutil.copytree(OLD, tmp_path / "ck")
    return tmp_path / "ck"


def invoke(*args):
    return runner.invoke(app, [str(a) for a in args])


def audit(path) -> int:
    return invoke("compare", "--impl", "nanochat", "--nanochat-path", path, "--check", *AUDIT).exit_code


def test_fix_prints_the_diff_then_write_makes_the_audit_pass(checkout):
    gpt = checkout / "nanochat" / "gpt.py"
    before = gpt.read_text()
    assert audit(checkout) == 1  # the stand-in has the bug
    r = invoke("fix", "--nanochat-path", checkout)
    assert r.exit_code == 0, r.output
    assert r.stdout.startswith("--- a/nanochat/gpt.py\n+++ b/nanochat/gpt.py\n")
    assert "smearcli:" not in r.stdout and "chunk-boundary smear bug" in r.stderr
    assert gpt.read_text() == before  # printing changes nothing
    w = invoke("fix", "--nanochat-path", checkout, "--write")
    assert w.exit_code == 0, w.output
    assert w.stdout == r.stdout
    assert (checkout / "nanochat" / "gpt.py.orig").read_text() == before
    assert "smearcli compare --impl nanochat" in w.stderr and "--check" in w.stderr
    assert audit(checkout) == 0
    again = invoke("fix", "--nanochat-path", checkout)
    assert again.exit_code == 0 and again.stdout == "" and "already fixed" in again.stderr


def test_unrecognised_code_changes_nothing_and_says_why(checkout):
    gpt = checkout / "nanochat" / "gpt.py"
    text = gpt.read_text()
    # the smear block tests more than `kv_cache is None`: not a shape fix knows
    assert text.count("if kv_cache is None:") == 1
    odd = text.replace("if kv_cache is None:", "if kv_cache is None and T > 0:")
    gpt.write_text(odd)
    r = invoke("fix", "--nanochat-path", checkout, "--write")
    assert r.exit_code == 1, r.output
    assert r.stdout == "" and "not fixed" in r.stderr and "kv_cache is None" in r.stderr and "docs/guide/fix.md" in r.stderr
    assert gpt.read_text() == odd and not (checkout / "nanochat" / "gpt.py.orig").exists()


def test_not_a_checkout_is_a_usage_error(tmp_path):
    r = invoke("fix", "--nanochat-path", tmp_path)
    assert r.exit_code == 2 and "not a nanochat checkout" in r.stderr


def test_existing_backup_refuses_to_write(checkout):
    (checkout / "nanochat" / "gpt.py.orig").write_text("mine")
    before = (checkout / "nanochat" / "gpt.py").read_text()
    r = invoke("fix", "--nanochat-path", checkout, "--write")
    assert r.exit_code == 2 and "already exists" in r.stderr
    assert (checkout / "nanochat" / "gpt.py").read_text() == before


def error_lines(r) -> list:
    return [line for line in r.stderr.splitlines() if line.startswith("smearcli: error:")]


def test_refusals_are_one_line_and_exit_2(checkout, tmp_path):
    gpt = checkout / "nanochat" / "gpt.py"
    r = invoke("fix", "--nanochat-path", gpt)  # a file, not a checkout
    assert r.exit_code == 2 and error_lines(r) == [f"smearcli: error: {gpt}: not a directory; give the "
                                                   "checkout (the directory holding nanochat/gpt.py)"]
    real = tmp_path / "gpt.py"
    gpt.rename(real)
    gpt.symlink_to(real)
    r = invoke("fix", "--nanochat-path", checkout, "--write")
    assert r.exit_code == 2 and len(error_lines(r)) == 1 and "symbolic link" in r.stderr, r.output
    assert gpt.is_symlink() and not (checkout / "nanochat" / "gpt.py.orig").exists()
    gpt.unlink()
    real.rename(gpt)
    with open(gpt, "ab") as f:  # 3 MiB of comment: over the cap, refused before it is read
        f.write((b"#" * 1023 + b"\n") * 3 * 1024)
    r = invoke("fix", "--nanochat-path", checkout)
    assert r.exit_code == 2 and len(error_lines(r)) == 1 and "3.0 MiB, larger than" in r.stderr, r.output


def test_out_of_memory_suggests_only_what_fix_has(checkout, monkeypatch):
    from smearcli.engines.nanochat import fix as nf

    def oom(*args, **kwargs):
        raise MemoryError()
    monkeypatch.setattr(nf, "apply_fix", oom)
    r = invoke("fix", "--nanochat-path", checkout)
    assert r.exit_code == 2 and len(error_lines(r)) == 1 and "out of memory" in r.stderr
    fix_help = invoke("fix", "--help").output
    flags = set(re.findall(r"--[a-z][a-z-]+", r.stderr))
    assert flags <= set(re.findall(r"--[a-z][a-z-]+", fix_help)), flags  # no --seq-len, --batch, ...
