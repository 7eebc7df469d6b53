"""The command line under a locale whose encoding is ASCII (LC_ALL=C, PYTHONUTF8=0): a checkpoint
under a non-ASCII name loads, and the table prints (its "Δ" escaped, the path as its bytes)."""

from __future__ import annotations

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
