"""Regenerate every committed output from fresh runs, in one command:

    python scripts/regen.py              # snippets, errors, notebooks
    python scripts/regen.py --only census  # the scan census (minutes)
    python scripts/regen.py --only notebooks,errors
    python scripts/regen.py --only census --python ~/tf525/bin/python \
        --from new.jsonl --against old.jsonl --against-source OLD_SITE/transformers

- snippets: `docs/gen_snippets.py` (docs/snippets/*.txt, docs/figures/smear-error.png and the
  README blocks between `<!-- snippet: NAME -->` markers);
- errors: `docs/gen_errors.py` (docs/errors.md, the table of every error and exit code, from real
  runs of the cases in tests/errors_cases.py);
- census: `scripts/gen_census.py --engine transformers` (the `smearcli scan` census in
  docs/guide/scan.md; about 6.5 minutes on 2 cores, the one step not in the default list:
  `--only census`). The census is of the transformers that `--python` has (default: this
  Python, or $SMEARCLI_CENSUS_PYTHON), so a release installed in another environment (a venv
  with `--no-deps` transformers 5.25) is regenerated from here; `--from FILE` (repeated) makes
  the page from records already made instead of a run, and `--against FILE` with
  `--against-source DIR` (the previous release's records and transformers package directory)
  fills its "What changed" block;
- vllm-census: `scripts/gen_census.py --engine vllm` (the census on vLLM in docs/guide/vllm.md;
  needs $SMEARCLI_VLLM_PYTHON, skipped with a message without it; not in the default list either);
- llamacpp-census: `scripts/gen_census.py --engine llamacpp` (the census on llama.cpp in
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


def census_python(given) -> str:
    """The Python the census steps run with, checked: it must import transformers (the census is
    of its release). Exits with one line when it cannot."""
    python = str(given or os.environ.get("SMEARCLI_CENSUS_PYTHON") or sys.executable)
    try:
        p = subprocess.run([python, "-c", "import transformers; print(transformers.__version__)"],
                           capture_output=True, text=True, timeout=300)
    except (OSError, subprocess.TimeoutExpired) as e:
        sys.exit(f"regen: census: cannot run {python}: {e}")
    if p.returncode != 0:
        last = (p.stderr.strip().splitlines() or ["no output"])[-1]
        sys.exit(f"regen: census: {python} cannot import transformers: {last}")
    print(f"regen: census: transformers {p.stdout.strip()} ({python})", flush=True)
    return python


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
    ap.add_argument("--python", help="census: the Python whose transformers the census is of (default: this one, "
                    "or $SMEARCLI_CENSUS_PYTHON)")
    ap.add_argument("--from", dest="shards", action="append", default=[],
                    help="census: a record file the page is made from instead of a run (repeat for shards)")
    ap.add_argument("--against", help="census: the previous release's record file, for the page's diff")
    ap.add_argument("--against-source", help="census: the previous release's transformers package directory")
    args = ap.parse_args()
    steps = [s.strip() for s in args.only.split(",") if s.strip()]
    census_only = [f for f, v in (("--python", args.python), ("--from", args.shards), ("--against", args.against),
                                  ("--against-source", args.against_source)) if v]
    if census_only and "census" not in steps:
        ap.error(f"{', '.join(census_only)} {'steers' if len(census_only) == 1 else 'steer'} only the census step: "
                 "add census to --only")
    if args.against_source and not args.against:
        ap.error("--against-source needs --against")
    unknown = [s for s in steps if s not in STEPS]
    if unknown:
        ap.error(f"unknown step(s) {', '.join(unknown)}; choose from {', '.join(STEPS)}")
    env = {**os.environ, "MPLBACKEND": "Agg", "PYTHONPATH": str(ROOT)}
    if "snippets" in steps:
        run("snippets", [sys.executable, "docs/gen_snippets.py"], env)
    if "errors" in steps:
        run("errors", [sys.executable, "docs/gen_errors.py"], env)
    if "census" in steps:
        python = census_python(args.python)
        extra = [x for f in args.shards for x in ("--from", str(Path(f).resolve()))]
        if args.against:
            extra += ["--against", str(Path(args.against).resolve())]
        if args.against_source:
            extra += ["--against-source", str(Path(args.against_source).resolve())]
        run("census", [python, "scripts/gen_census.py", "--engine", "transformers", *extra], env)
    for step, engine in (("vllm-census", "vllm"), ("llamacpp-census", "llamacpp")):
        if step in steps:
            run(step, [sys.executable, "scripts/gen_census.py", "--engine", engine], env)
    if "notebooks" in steps:
        execute_notebooks(sorted((ROOT / "notebooks").glob("*.ipynb")))


if __name__ == "__main__":
    main()
