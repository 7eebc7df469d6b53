"""The census on llama.cpp in docs/guide/llamacpp.md, from a fresh run (`scripts/regen.py --only llamacpp-census`):

    SMEARCLI_LLAMACPP_PYTHON=~/llamacpp-env/bin/python python scripts/gen_llamacpp_census.py [--resume | --write-only]

Runs `smearcli scan --engine llamacpp --jobs 2` (each architecture in its own process with its own
llama.cpp worker, one thread each: two at once on two cores) to build/llamacpp-census.jsonl, the
findings' reproducers and their GGUF files to build/llamacpp-census-repro/. Then the census's
Markdown (`--merge` of the records, with the run's benchmark and load) goes between the
`<!-- llamacpp-census:start -->` and `<!-- llamacpp-census:end -->` markers of the guide, and its figure
(every architecture x schedule, each cell the distance from llama.cpp's own one-call prefill as a
multiple of the float64 floor) to docs/figures/llamacpp-census.png.
`--resume` continues a stopped census; `--write-only` writes the guide from the records there are.
Without $SMEARCLI_LLAMACPP_PYTHON it says so and exits 0: the step is skipped, nothing changes.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # run as a script or loaded by path
from census_block import write_block  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "build" / "llamacpp-census.jsonl"
BENCH = ROOT / "build" / "llamacpp-census.benchmark.json"  # the last run's benchmark line, for --write-only
REPRO = ROOT / "build" / "llamacpp-census-repro"
GUIDE = ROOT / "docs" / "guide" / "llamacpp.md"
FIGURE = ROOT / "docs" / "figures" / "llamacpp-census.png"
START, END = "<!-- llamacpp-census:start -->", "<!-- llamacpp-census:end -->"
JOBS = 2
TIMEOUT_S = 300  # one architecture: 10 to 25 s on two busy cores; the worker's own limit is 15 s less


def scan(*args: str) -> None:
    cmd = [sys.executable, "-m", "smearcli", "scan", "--engine", "llamacpp", "--jobs", str(JOBS), "--out", str(OUT),
           "--repro-dir", str(REPRO), "--timeout", str(TIMEOUT_S), "--json", *args]
    print("gen_llamacpp_census:", " ".join(cmd[1:]), flush=True)
    p = subprocess.run(cmd, cwd=ROOT, stdout=subprocess.PIPE, text=True)
    if p.returncode not in (0, 1):
        sys.exit(f"gen_llamacpp_census: the census failed (exit {p.returncode})")
    doc = json.loads(p.stdout)
    meta = {**{k: doc.get(k) for k in ("benchmark", "load", "llama_cpp_python")}, "jobs": JOBS}
    BENCH.write_text(json.dumps(meta) + "\n")
    print("gen_llamacpp_census:", json.dumps(meta), flush=True)


def benchmark() -> str:
    from smearcli.engines.llamacpp.session import summary_line

    if not BENCH.exists():
        return ""
    meta = json.loads(BENCH.read_text())
    b = meta.get("benchmark")
    if not b:
        return ""
    return (f"{summary_line(b)}; --jobs {meta.get('jobs')}, load average {meta.get('load')} (1, 5, 15 min) at "
            "the end, on a 2-core machine shared with other work. A resumed run counts only what it ran.")


def write_guide() -> None:
    write_block(GUIDE, START, END, [OUT], benchmark(), "gen_llamacpp_census")
    write_figure()


def write_figure() -> None:
    from smearcli.census import record
    from smearcli.render import figures, scan_figure

    recs = [record.bare(**json.loads(line)) for line in OUT.read_text().splitlines() if line.strip()]
    figures.save(scan_figure.figure(recs, value=scan_figure.against_own_prefill), FIGURE)
    print(f"gen_llamacpp_census: {FIGURE.relative_to(ROOT)} written", flush=True)


def main() -> None:
    if not os.environ.get("SMEARCLI_LLAMACPP_PYTHON", "").strip():
        print("gen_llamacpp_census: skipped: set SMEARCLI_LLAMACPP_PYTHON to the Python of llama.cpp's environment "
              "(scripts/make_llamacpp_env.sh DIR makes one)", flush=True)
        return
    args = sys.argv[1:]
    if "--write-only" not in args:
        OUT.parent.mkdir(parents=True, exist_ok=True)
        if "--resume" not in args:
            OUT.unlink(missing_ok=True)
        scan("--resume")
    write_guide()


if __name__ == "__main__":
    main()
