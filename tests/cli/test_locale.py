"""The command line under a locale whose encoding is ASCII (LC_ALL=C, PYTHONUTF8=0): a checkpoint
under a non-ASCII name loads, and the table prints (its "Δ" escaped, the path as its bytes); the
files smearcli writes (scan --markdown, atomic outputs, reproducers) are UTF-8 all the same."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from hardening_util import FAST, write_checkpoint
from conftest import ROOT  # noqa: E402 - the clone's root


def test_c_locale_loads_a_non_ascii_checkpoint_and_prints_its_table(tmp_path):
    d = write_checkpoint(tmp_path / "caf\u00e9")
    env = {**os.environ, "LC_ALL": "C", "PYTHONUTF8": "0", "PYTHONPATH": str(ROOT), "COLUMNS": "200"}
    r = subprocess.run([sys.executable, "-m", "smearcli", "compare", *FAST, "--checkpoint", os.fsencode(d)],
                       env=env, capture_output=True, timeout=120)
    assert r.returncode == 0, r.stderr.decode(errors="replace")
    assert r.stderr.count(b"\n") == 1 and r.stderr.startswith(b"smearcli: checkpoint ")  # the notice alone
    assert r.stdout.startswith(os.fsencode(d) + b"@1: ")  # the name as it is on disk
    assert b"\\u0394logit" in r.stdout  # the table's header, escaped for ASCII


def ascii_locale(code: str, *args, cwd) -> subprocess.CompletedProcess:
    env = {**os.environ, "LC_ALL": "C", "PYTHONUTF8": "0", "PYTHONIOENCODING": "", "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-c", code, *map(str, args)], env=env, capture_output=True, cwd=cwd,
                          timeout=120)


def test_c_locale_writes_the_census_markdown_and_records_as_utf8(tmp_path):
    """Non-ASCII text in a record (a reason quoting a source line): --markdown and the files
    smearcli writes are UTF-8 whatever the locale, never an internal error."""
    rec = {"model_type": "llama", "verdict": "crashed", "reason": "modeling_llama.py:1 in f: caf\u00e9 \u0394 \u2264 0"}
    (tmp_path / "s.jsonl").write_text(json.dumps(rec, ensure_ascii=False) + "\n", encoding="utf-8")
    r = ascii_locale("import sys; sys.argv = ['smearcli', *sys.argv[1:]]; from smearcli.cli.app import run; run()",
                     "scan", "--merge", "s.jsonl", "--markdown", "c.md", cwd=tmp_path)
    assert r.returncode == 0, r.stderr.decode(errors="replace")
    assert "caf\u00e9 \u0394 \u2264 0" in (tmp_path / "c.md").read_text(encoding="utf-8")


def test_c_locale_writes_reproducers_and_atomic_outputs_as_utf8(tmp_path):
    code = ("import sys; from pathlib import Path; from smearcli.util.files import atomic_write; "
            "from smearcli.engines.transformers.repro import note_group\n"
            "with atomic_write('a.md') as f: f.write('caf\\u00e9')\n"
            "Path('r.py').write_text('\"\"\"Reproducer: caf\\u00e9\\n\"\"\"\\nprint(1)\\n', encoding='utf-8')\n"
            "note_group(Path('r.py'), ['\\u0394-arch'])\n")
    r = ascii_locale(code, cwd=tmp_path)
    assert r.returncode == 0, r.stderr.decode(errors="replace")
    assert (tmp_path / "a.md").read_text(encoding="utf-8") == "caf\u00e9"
    assert "The same code breaks: \u0394-arch" in (tmp_path / "r.py").read_text(encoding="utf-8")
