"""The census on vLLM in docs/guide/vllm.md, from a fresh run (`scripts/regen.py --only vllm-census`):

    SMEARCLI_VLLM_PYTHON=~/vllm-env/bin/python python scripts/gen_vllm_census.py [--resume | --write-only]

Runs `smearcli scan --engine vllm` as LANES scans at once sharing one claims folder (`--claims`,
one record file each under build/), the documented way to use more than one core: each takes the
next architecture neither has taken, so the two end together however long each architecture
takes (fixed shares, `--shard`, left one lane 3 minutes behind the other); each has its own vLLM
worker, bound to a core of its own (`VLLM_CPU_OMP_THREADS_BIND`), so one lane's transformers side
runs while the other's vLLM does. The benchmark (the wall time, vLLM's imports, the engines' starts) is
summed from the records per lane, the census's wall time being the longest lane's, so a
stopped run counts too. Then the census's Markdown (`--merge` of the lanes) and the benchmark
go between the `<!-- vllm-census:start -->` and `<!-- vllm-census:end -->` markers of the guide.
`--resume` continues a stopped census; `--write-only` writes the guide from the records there are.
Without $SMEARCLI_VLLM_PYTHON it says so and exits 0: the step is skipped, nothing changes.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # run as a script or loaded by path
from census_block import write_block  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
LANES = 2  # scans at once: the two cores CI and the docs' numbers have
REPRO = ROOT / "build" / "vllm-census-repro"
GUIDE = ROOT / "docs" / "guide" / "vllm.md"
START, END = "<!-- vllm-census:start -->", "<!-- vllm-census:end -->"
TIMEOUT_S = 600  # one architecture and its reproducer: about 70 s on two busy cores, 5 minutes with a
# request stuck inside vLLM (the worker's watchdog, then the reproducer's, at 120 s each)


CLAIMS = ROOT / "build" / "vllm-census.claims"


def out_of(lane: int) -> Path:
    return ROOT / "build" / f"vllm-census.{lane}-of-{LANES}.jsonl"


def fresh_claims() -> None:
    """The claims folder anew, holding what the lanes' files already record (a resumed census
    checks none of it again, and no architecture lands in two files)."""
    shutil.rmtree(CLAIMS, ignore_errors=True)
    CLAIMS.mkdir(parents=True)
    for lane in range(1, LANES + 1):
        if out_of(lane).exists():
            for ln in out_of(lane).read_text().splitlines():
                if ln.strip():
                    (CLAIMS / json.loads(ln)["model_type"]).touch()


def scan(*args: str) -> None:
    """Every lane at once, each to its own file; waits for all of them."""
    fresh_claims()
    procs = []
    for lane in range(1, LANES + 1):
        cmd = [sys.executable, "-m", "smearcli", "scan", "--engine", "vllm", "--claims", str(CLAIMS),
               "--out", str(out_of(lane)), "--repro-dir", str(REPRO), "--timeout", str(TIMEOUT_S),
               "--memory-mb", "4096", "--json", *args]
        print("gen_vllm_census:", " ".join(cmd[1:]), flush=True)
        bind = str(lane - 1) if (os.cpu_count() or 1) >= LANES else "auto"
        env = {**os.environ, "OMP_NUM_THREADS": "1", "VLLM_CPU_OMP_THREADS_BIND": bind}
        procs.append(subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, text=True, env=env))
    for p in procs:
        out, _ = p.communicate()
        if p.returncode not in (0, 1):  # 1: --check is not given, but keep the records of any run that ended
            sys.exit(f"gen_vllm_census: a lane of the census failed (exit {p.returncode})")
        print("gen_vllm_census:", json.dumps(json.loads(out).get("benchmark")), flush=True)


def runs_of(recs: list) -> list:
    """The records split into the runs that wrote them: each record holds its run's vLLM import
    time so far and worker starts; within a run the import time changes only with a new start."""
    runs, last = [], None
    for r in recs:
        v = r.get("vllm") or {}
        mark = (v.get("starts") or 0, v.get("import_s_so_far") or 0.0)
        if last is None or mark != last and mark[0] <= last[0]:
            runs.append([])
        runs[-1].append(r)
        last = mark
    return runs


def lane_time(recs: list) -> tuple[float, float, float]:
    """One lane's (wall time, vLLM imports, engine starts) from its records."""
    runs = runs_of(recs)
    imports = sum(max((r.get("vllm") or {}).get("import_s_so_far") or 0 for r in run) for run in runs)
    engines = sum(float(s or 0) for r in recs for s in (r.get("vllm") or {}).get("engine_start_s") or [])
    return imports + sum(r.get("wall_s") or 0 for r in recs), imports, engines


def benchmark() -> str:
    """The census's time from its records (so a run stopped early still counts): per lane, each
    architecture's wall time, vLLM's imports (each run's last count) and the engines' starts; the
    census takes as long as its longest lane."""
    lanes = [[json.loads(ln) for ln in out_of(i).read_text().splitlines() if ln.strip()]
             for i in range(1, LANES + 1) if out_of(i).exists()]
    times = [lane_time(recs) for recs in lanes]
    wall = max((t[0] for t in times), default=0.0)
    busy, imports, engines = (sum(t[k] for t in times) for k in range(3))
    pct = (lambda x: f"{100 * x / busy:.0f}%" if busy else "-")
    return (f"{sum(map(len, lanes))} architectures checked in {wall / 60:.1f} minutes, {len(lanes)} scans at once "
            "sharing the architectures "
            f"on two cores (the longest scan's time: its architectures' wall times plus vLLM's imports). Of the "
            f"scans' {busy / 60:.1f} minutes together, importing vLLM took {imports:.0f} s ({pct(imports)}) and "
            f"starting engines {engines:.0f} s ({pct(engines)}); the rest is the models' requests, the "
            "transformers reference, floor and power, and the reproducers.")


def write_guide() -> None:
    write_block(GUIDE, START, END, [out_of(i) for i in range(1, LANES + 1) if out_of(i).exists()], benchmark(),
                "gen_vllm_census")


def main() -> None:
    if not os.environ.get("SMEARCLI_VLLM_PYTHON", "").strip():
        print("gen_vllm_census: skipped: set SMEARCLI_VLLM_PYTHON to the Python of vLLM's environment "
              "(scripts/make_vllm_env.sh DIR makes one)", flush=True)
        return
    args = sys.argv[1:]
    if "--write-only" not in args:
        REPRO.parent.mkdir(parents=True, exist_ok=True)
        if "--resume" not in args:
            for lane in range(1, LANES + 1):
                out_of(lane).unlink(missing_ok=True)
        scan("--resume")
    write_guide()


if __name__ == "__main__":
    main()
