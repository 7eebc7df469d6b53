"""The census on vLLM in docs/guide/vllm.md, from a fresh run (`scripts/regen.py --only vllm-census`):

    SMEARCLI_VLLM_PYTHON=~/vllm-env/bin/python python scripts/gen_vllm_census.py [--resume | --write-only]

Runs `smearcli scan --engine vllm` twice into build/vllm-census.jsonl: first the architectures the
guide's text names (Llama, Mistral, Qwen2, Mamba2), then every other one (`--resume`), so a run
stopped early still has those. The benchmark (the wall time, vLLM's imports, the engines' starts)
is summed from the records, so a stopped run counts too. Then the census's Markdown and the benchmark go
between the `<!-- vllm-census:start -->` and `<!-- vllm-census:end -->` markers of the guide.
`--resume` continues a stopped census; `--write-only` writes the guide from the records there are.
Without $SMEARCLI_VLLM_PYTHON it says so and exits 0: the step is skipped, nothing changes.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "build" / "vllm-census.jsonl"
REPRO = ROOT / "build" / "vllm-census-repro"
GUIDE = ROOT / "docs" / "guide" / "vllm.md"
START, END = "<!-- vllm-census:start -->", "<!-- vllm-census:end -->"
FIRST = "llama,mistral,qwen2,mamba2"
TIMEOUT_S = 900  # one architecture, its reproducer included, on two loaded cores


def scan(*args: str) -> None:
    cmd = [sys.executable, "-m", "smearcli", "scan", "--engine", "vllm", "--out", str(OUT), "--repro-dir", str(REPRO),
           "--timeout", str(TIMEOUT_S), "--memory-mb", "4096", "--json", *args]
    print("gen_vllm_census:", " ".join(cmd[1:]), flush=True)
    p = subprocess.run(cmd, cwd=ROOT, stdout=subprocess.PIPE, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
    if p.returncode not in (0, 1):  # 1: --check is not given, but keep the records of any run that ended
        sys.exit(f"gen_vllm_census: the census failed (exit {p.returncode})")
    print("gen_vllm_census:", json.dumps(json.loads(p.stdout).get("benchmark")), flush=True)


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


def benchmark() -> str:
    """The census's time from its records (so a run stopped early still counts): each
    architecture's wall time, vLLM's imports (each run's last count) and the engines' starts."""
    recs = [json.loads(ln) for ln in OUT.read_text().splitlines() if ln.strip()]
    runs = runs_of(recs)
    imports = sum(max((r.get("vllm") or {}).get("import_s_so_far") or 0 for r in run) for run in runs)
    engines = sum(float(s or 0) for r in recs for s in (r.get("vllm") or {}).get("engine_start_s") or [])
    wall = imports + sum(r.get("wall_s") or 0 for r in recs)
    pct = (lambda x: f"{100 * x / wall:.0f}%" if wall else "-")
    return (f"{len(recs)} architectures checked in {wall / 60:.1f} minutes over {len(runs)} run(s) of the census "
            f"(each architecture's wall time plus vLLM's imports), of which importing vLLM {imports:.0f} s "
            f"({pct(imports)}) and starting engines {engines:.0f} s ({pct(engines)}); the rest is the models' "
            "requests, the transformers reference, floor and power, and the reproducers.")


def write_guide() -> None:
    with tempfile.TemporaryDirectory() as d:
        md = Path(d) / "census.md"
        subprocess.run([sys.executable, "-m", "smearcli", "scan", "--merge", str(OUT), "--markdown", str(md)],
                       cwd=ROOT, check=True, stdout=subprocess.DEVNULL)
        body = md.read_text().split("\n", 1)[1].replace("\n## ", "\n#### ")  # under the guide's own heading
    text = GUIDE.read_text()
    head, rest = text.split(START, 1)
    _, tail = rest.split(END, 1)
    block = f"{START}\n\n_{benchmark()}_\n{body}\n{END}"
    GUIDE.write_text(head + block + tail)
    print(f"gen_vllm_census: {GUIDE.relative_to(ROOT)} updated", flush=True)


def main() -> None:
    if not os.environ.get("SMEARCLI_VLLM_PYTHON", "").strip():
        print("gen_vllm_census: skipped: set SMEARCLI_VLLM_PYTHON to the Python of vLLM's environment "
              "(scripts/make_vllm_env.sh DIR makes one)", flush=True)
        return
    args = sys.argv[1:]
    if "--write-only" not in args:
        OUT.parent.mkdir(parents=True, exist_ok=True)
        if "--resume" not in args:
            OUT.unlink(missing_ok=True)
            scan("--only", FIRST)
        scan("--resume")
    write_guide()


if __name__ == "__main__":
    main()
