"""Regenerate every committed output from fresh runs, in one command:

    python scripts/regen.py              # snippets, errors, notebooks
    python scripts/regen.py --only census  # the scan census (minutes)
    python scripts/regen.py --only notebooks,errors

- snippets: `docs/gen_snippets.py` (docs/snippets/*.txt, docs/figures/smear-error.png and the
  README blocks between `<!-- snippet: NAME -->` markers);
- errors: `docs/gen_errors.py` (docs/errors.md, the table of every error and exit code, from real
  runs of the cases in tests/errors_cases.py);
- census: `docs/gen_census.py` (the `smearcli scan` census in docs/guide/scan.md; about 6.5
  minutes on 2 cores, the one step not in the default list: `--only census`);
- vllm-census: `scripts/gen_vllm_census.py` (the census on vLLM in docs/guide/vllm.md; needs
  $SMEARCLI_VLLM_PYTHON, skipped with a message without it; not in the default list either);
- llamacpp-census: `scripts/gen_llamacpp_census.py` (the census on llama.cpp in
  docs/guide/llamacpp.md; needs $SMEARCLI_LLAMACPP_PYTHON, skipped with a message without it;
  about 15 minutes on 2 busy cores; not in the default list either);
- notebooks: every notebooks/*.ipynb executed in place (nbclient, one kernel each, one torch
  thread as the notebooks themselves set), so their outputs are what nbval compares.

Run it after any change to what the CLI or the library prints; CONTRIBUTING.md says when. Each
step runs in its own process and stops the script on failure, naming the step.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
STEPS = ("snippets", "errors", "notebooks", "census", "vllm-census", "llamacpp-census")
DEFAULT = ("snippets", "errors", "notebooks")


def run(step: str, cmd: list[str], env: dict) -> None:
    t0 = time.time()
    print(f"regen: {step}: {' '.join(cmd)}", flush=True)
    p = subprocess.run(cmd, cwd=ROOT, env=env)
    if p.returncode != 0:
        sys.exit(f"regen: {step} failed (exit {p.returncode})")
    print(f"regen: {step} done in {time.time() - t0:.0f} s", flush=True)


def execute_notebooks(paths: list[Path]) -> None:
    import nbformat
    from nbclient import NotebookClient

    for path in paths:
        t0 = time.time()
        nb = nbformat.read(path, as_version=4)
        NotebookClient(nb, timeout=1200, kernel_name="python3", resources={"metadata": {"path": str(path.parent)}}).execute()
        nbformat.write(nb, path)
        print(f"regen: notebooks: {path.name} in {time.time() - t0:.0f} s", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", default=",".join(DEFAULT), help=f"comma-separated steps of {', '.join(STEPS)}")
    steps = [s.strip() for s in ap.parse_args().only.split(",") if s.strip()]
    unknown = [s for s in steps if s not in STEPS]
    if unknown:
        ap.error(f"unknown step(s) {', '.join(unknown)}; choose from {', '.join(STEPS)}")
    env = {**os.environ, "MPLBACKEND": "Agg", "PYTHONPATH": str(ROOT)}
    if "snippets" in steps:
        run("snippets", [sys.executable, "docs/gen_snippets.py"], env)
    if "errors" in steps:
        run("errors", [sys.executable, "docs/gen_errors.py"], env)
    if "census" in steps:
        run("census", [sys.executable, "docs/gen_census.py"], env)
    if "vllm-census" in steps:
        run("vllm-census", [sys.executable, "scripts/gen_vllm_census.py"], env)
    if "llamacpp-census" in steps:
        run("llamacpp-census", [sys.executable, "scripts/gen_llamacpp_census.py"], env)
    if "notebooks" in steps:
        execute_notebooks(sorted((ROOT / "notebooks").glob("*.ipynb")))


if __name__ == "__main__":
    main()
