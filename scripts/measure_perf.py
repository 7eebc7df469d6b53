#!/usr/bin/env python3
"""Where a compare's time goes, measured on the tree given (default: this checkout).

Three measurements, each printed as a row of one table (and, with --out, written as JSON):

1. build: `weights.random_model` of the d12 preset against a bare seeded `uniform_` fill of one
   tensor with the same number of elements, in the same process (target: at most 1.5x).
2. d12: `smearcli compare --preset d12 --seq-len 1024 --threads 1 --quiet` in a child process,
   under cProfile: its wall time, the share spent in the model's forwards (GPT.forward's
   cumulative time; target: the rest is at most 10%), model building and metrics, and the child's
   peak RSS. When the tree has a profile module (smearcli.measure.profile), the same run also gets SMEARCLI_PROFILE=1 and its
   table (stderr) is shown too.
3. chunks4: `smearcli compare --chunks 4` in a child process (target: at most 2 s beyond importing
   torch); median of --repeat runs. "Beyond torch" is the wall time of the program itself
   (`python -m smearcli`) minus that of a process that does nothing but `import torch`, the two
   interleaved. The bare process pays torch's exit too (about 0.5 s here, most of it the final
   garbage collection over torch's objects, which the program skips: it freezes them). Beside it,
   the same command in a harness that times its own `import torch`: the time from the end of that
   import to the end of the command (no exit), and the wall time minus the import.
   Bytecode: pip compiles an installed package's .py files, so a user's smearcli imports from
   cached bytecode. This sandbox sets PYTHONDONTWRITEBYTECODE=1 and the checkout is an editable
   install, so each run here would compile smearcli's ~40 modules from source (about 0.05-0.1 s).
   The children therefore run with a bytecode cache in a temporary PYTHONPYCACHEPREFIX (nothing is
   written into the tree), warmed by one untimed run; --no-bytecode measures without it too.

Usage: python scripts/measure_perf.py [--tree DIR] [--skip-d12] [--seq-len 1024] [--out f.json]
The load average is printed with every row: on a shared machine read the shares, not the seconds.
"""

from __future__ import annotations

import argparse
import json
import os
import pstats
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

CHILD_CLI = r"""
import sys, time
t0 = time.perf_counter()
import torch
t1 = time.perf_counter()
import cProfile
from smearcli.cli.app import run
sys.argv = ["smearcli"] + sys.argv[2:]
prof = cProfile.Profile() if sys.argv[1:2] == ["--cprofile"] else None
prof_out = None
if prof is not None:
    prof_out = sys.argv[2]
    sys.argv = ["smearcli"] + sys.argv[3:]
code = 0
try:
    if prof is not None:
        prof.enable()
    run()
except SystemExit as e:
    code = e.code or 0
finally:
    if prof is not None:
        prof.disable()
        prof.dump_stats(prof_out)
t2 = time.perf_counter()
import resource
rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux
sys.stderr.write(f"\nMEASURE import_torch={t1 - t0:.3f} rest={t2 - t1:.3f} code={code} rss_kib={rss}\n")
"""


def load() -> str:
    return "/".join(f"{x:.2f}" for x in os.getloadavg())


PYCACHE: dict = {}  # "prefix": the temporary bytecode cache of this run, when one is used


def env_for(tree: Path, **extra) -> dict:
    env = dict(os.environ, PYTHONPATH=str(tree), **extra)
    env.pop("SMEARCLI_PROFILE", None)
    if PYCACHE.get("prefix"):  # as an installed package runs: from cached bytecode
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        env["PYTHONPYCACHEPREFIX"] = PYCACHE["prefix"]
    env.update(extra)
    return env


def child(tree: Path, args: list[str], cprofile: str | None = None, **extra) -> dict:
    pre = ["--cprofile", cprofile] if cprofile else []
    t0 = time.perf_counter()
    p = subprocess.run([sys.executable, "-c", CHILD_CLI, "x", *pre, *args], cwd=tree, env=env_for(tree, **extra),
                       capture_output=True, text=True)
    wall = time.perf_counter() - t0
    line = [ln for ln in p.stderr.splitlines() if ln.startswith("MEASURE ")]
    if not line:
        raise SystemExit(f"child failed ({p.returncode}):\n{p.stderr[-3000:]}")
    vals = dict(kv.split("=") for kv in line[-1].split()[1:])
    if int(vals["code"]) != 0:
        raise SystemExit(f"smearcli {' '.join(args)} exited {vals['code']}:\n{p.stderr[-3000:]}")
    profile_table = p.stderr[:p.stderr.rfind("MEASURE")].strip()
    return {"wall_s": wall, "import_torch_s": float(vals["import_torch"]), "rest_s": float(vals["rest"]),
            "code": int(vals["code"]), "peak_rss_mib": int(vals["rss_kib"]) / 1024,
            "stderr": profile_table, "load": load()}


def program(tree: Path, args: list[str]) -> float:
    """Wall seconds of the smearcli program itself (`python -m smearcli ...`), as a user runs it:
    no harness around it that imports torch first (which makes every later import and garbage
    collection work against torch's objects) and times it."""
    t0 = time.perf_counter()
    p = subprocess.run([sys.executable, "-m", "smearcli", *args], cwd=tree, env=env_for(tree),
                       capture_output=True, text=True)
    if p.returncode:
        raise SystemExit(f"smearcli {' '.join(args)} exited {p.returncode}:\n{p.stderr[-3000:]}")
    return time.perf_counter() - t0


def bare_torch(tree: Path) -> float:
    """Wall seconds of a process that only imports torch: its start, the import and its exit
    (torch's interpreter teardown alone took about 0.5 s here), which every smearcli run pays too."""
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-c", "import torch"], cwd=tree, env=env_for(tree), check=True)
    return time.perf_counter() - t0


def cprofile_shares(path: str) -> dict:
    """Cumulative seconds of the outermost forward, random_model and the metrics, from a stats file."""
    st = pstats.Stats(path).stats
    def cum(file_end: str, names: tuple[str, ...]) -> float:
        # a tree from before the top level was grouped has smearcli/model.py, not smearcli/gpt/model.py
        ends = (file_end, "smearcli/" + file_end.split("/")[-1])
        return max((v[3] for (f, _, n), v in st.items() if f.replace("\\", "/").endswith(ends) and n in names),
                   default=0.0)
    total = max(v[3] for v in st.values())
    return {"total_s": total,
            "forward_s": cum("smearcli/gpt/model.py", ("forward",)),
            "build_s": cum("smearcli/gpt/weights.py", ("random_model",)),
            "metrics_s": cum("smearcli/measure/metrics.py", ("measure",)) + cum("smearcli/measure/metrics.py", ("noise_floor",))}


def measure_build(tree: Path, repeat: int) -> dict:
    code = r"""
import sys, time, json, torch
from smearcli.gpt.config import preset_config
from smearcli.gpt import weights
from smearcli.gpt.model import param_shapes
torch.set_num_threads(1)
cfg = preset_config("d12")
n = 0
for s in param_shapes(cfg).values():
    k = 1
    for d in s: k *= d
    n += k
out = {"params": n, "fill_s": [], "build_s": []}
for _ in range(int(sys.argv[1])):
    t0 = time.perf_counter()
    t = torch.empty(n)
    t.uniform_(-1, 1, generator=torch.Generator().manual_seed(0))
    out["fill_s"].append(time.perf_counter() - t0)
    del t
    t0 = time.perf_counter()
    lm = weights.random_model(cfg, seed=0)
    out["build_s"].append(time.perf_counter() - t0)
    del lm
print(json.dumps(out))
"""
    p = subprocess.run([sys.executable, "-c", code, str(repeat)], cwd=tree, env=env_for(tree),
                       capture_output=True, text=True)
    if p.returncode:
        raise SystemExit(p.stderr[-3000:])
    out = json.loads(p.stdout.strip().splitlines()[-1])
    out["ratio"] = min(out["build_s"]) / min(out["fill_s"])
    out["load"] = load()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tree", type=Path, default=ROOT, help="the smearcli checkout to measure")
    ap.add_argument("--seq-len", type=int, default=1024)
    ap.add_argument("--repeat", type=int, default=3, help="runs of the build and chunks-4 measurements")
    ap.add_argument("--skip-d12", action="store_true")
    ap.add_argument("--skip-build", action="store_true")
    ap.add_argument("--skip-chunks", action="store_true")
    ap.add_argument("--no-bytecode", action="store_true",
                    help="also measure chunks-4 runs that compile smearcli from source (no bytecode cache)")
    ap.add_argument("--out", type=Path)
    ap.add_argument("--keep-prof", type=Path, help="keep the d12 run's cProfile stats in this file")
    a = ap.parse_args()
    tree = a.tree.resolve()
    has_profile = any((tree / "smearcli" / d / "profile.py").exists() for d in ("measure", "."))
    res: dict = {"tree": str(tree), "cores": os.cpu_count()}
    rows = []
    if not a.skip_build:
        b = res["build"] = measure_build(tree, a.repeat)
        rows.append(("d12 random model build", f"{min(b['build_s']):.2f} s", f"bare fill {min(b['fill_s']):.2f} s",
                     f"{b['ratio']:.2f}x (target <= 1.5x)", b["load"]))
    if not a.skip_chunks:
        modes = [("bytecode cached", True)] + ([("no bytecode cache", False)] if a.no_bytecode else [])
        for label, cached in modes:
            with tempfile.TemporaryDirectory() as pyc:
                PYCACHE["prefix"] = pyc if cached else None
                if cached:
                    child(tree, ["compare", "--chunks", "4"])  # untimed: fills the bytecode cache
                runs, bare, progs = [], [], []
                for _ in range(a.repeat):  # interleaved, so all three see the same load
                    progs.append(program(tree, ["compare", "--chunks", "4"]))
                    runs.append(child(tree, ["compare", "--chunks", "4"]))
                    bare.append(bare_torch(tree))
                PYCACHE["prefix"] = None
            prog_beyond = statistics.median(progs) - statistics.median(bare)
            beyond = statistics.median(r["wall_s"] for r in runs) - statistics.median(bare)
            in_process = statistics.median(r["rest_s"] for r in runs)
            old_way = statistics.median(r["wall_s"] - r["import_torch_s"] for r in runs)
            res["chunks4" if cached else "chunks4_no_bytecode"] = {
                "program_wall_s": progs, "program_beyond_torch_s": prog_beyond,
                "runs": runs, "bare_torch_wall_s": bare, "beyond_torch_s": beyond,
                "in_process_s": in_process, "wall_minus_import_s": old_way}
            rows.append((f"compare --chunks 4, {label}", f"{statistics.median(progs):.2f} s",
                         f"a process of import torch {statistics.median(bare):.2f} s",
                         f"beyond torch {prog_beyond:.2f} s (target <= 2 s)", runs[-1]["load"]))
            rows.append(("  in a harness that times import torch", f"{statistics.median(r['wall_s'] for r in runs):.2f} s",
                         f"after import torch, in process {in_process:.2f} s",
                         f"beyond torch {beyond:.2f} s; wall minus in-process import {old_way:.2f} s",
                         runs[-1]["load"]))
    if not a.skip_d12:
        with tempfile.TemporaryDirectory() as tmp:
            prof = os.path.join(tmp, "d12.prof")
            extra = {"SMEARCLI_PROFILE": "1"} if has_profile else {}
            r = child(tree, ["compare", "--preset", "d12", "--seq-len", str(a.seq_len), "--threads", "1", "--quiet"],
                      cprofile=prof, **extra)
            r.update(cprofile_shares(prof))
            if a.keep_prof:
                shutil.copyfile(prof, a.keep_prof)
        res["d12"] = r
        outside = 1 - r["forward_s"] / r["total_s"]
        rows.append((f"d12 compare, {a.seq_len} tokens (cProfile)", f"{r['total_s']:.1f} s",
                     f"forwards {r['forward_s']:.1f} s, build {r['build_s']:.1f} s, metrics {r['metrics_s']:.1f} s",
                     f"outside forwards {outside:.1%} (target <= 10%)", r["load"]))
        rows.append(("d12 compare peak RSS", f"{r['peak_rss_mib']:.0f} MiB", "", "", r["load"]))
    w = [max(len(str(row[i])) for row in rows) for i in range(5)]
    head = ("measurement", "time", "parts", "result", "load 1/5/15")
    w = [max(wi, len(h)) for wi, h in zip(w, head)]
    print(f"tree: {tree}  ({os.cpu_count()} cores)")
    for row in (head, tuple("-" * x for x in w), *rows):
        print("  ".join(str(c).ljust(x) for c, x in zip(row, w)).rstrip())
    if "d12" in res and res["d12"]["stderr"]:
        print("\nprofile table of the d12 run (SMEARCLI_PROFILE=1, under cProfile):\n" + res["d12"]["stderr"])
    if a.out:
        a.out.write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
