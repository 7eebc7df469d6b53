#!/usr/bin/env python3
"""Before/after numbers of the decode fast path (see the changelog), measured in one run on one machine.

For a "before" revision (default e6769d0) and the "after" tree (this checkout, or --after REV):

1. wall time and peak RSS (/usr/bin/time -v, else resource.getrusage of the child) of
   `smearcli compare` on random weights of nanochat's d12 shape at 1,024 tokens and of its d20
   shape at 2,048 tokens. Both revisions load the same checkpoints (written once with the after
   tree's `weights.preset_model` + `save_checkpoint`), since the old revision cannot build these
   shapes itself; both JSON outputs are compared (they must agree: same runs, same numbers).
2. ours/upstream forward-time ratio at the nanochat-d12 shape: our GPT and upstream nanochat's own
   GPT (a checkout at --upstream-rev, default 92d63d4, put in the work directory with
   `git worktree add`) on the same weights and tokens, alternated, median of the per-pair ratios.

Usage (on a quiet machine: `uptime` load well under the core count; d20 needs ~25 GB):

    python scripts/measure_before_after.py --nanochat-repo PATH_TO_NANOCHAT_GIT [--skip-d20]

Writes a markdown table to stdout and everything (with load averages) to --out (JSON).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def sh(*args, cwd=None, env=None, check=True) -> subprocess.CompletedProcess:
    return subprocess.run(list(map(str, args)), cwd=cwd, env=env, check=check, capture_output=True, text=True)


def worktree(repo: Path, rev: str, dest: Path) -> Path:
    if not (dest / ".git").exists():
        if dest.exists():
            shutil.rmtree(dest)
        sh("git", "-C", repo, "worktree", "add", "--detach", dest, rev)
    return dest


def loadavg() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def make_checkpoint(tree: Path, preset: str, dest: Path) -> Path:
    if not any(dest.glob("model_*.pt")):
        code = ("import sys\n"
                "try:\n    from smearcli.gpt import weights\n"
                "except ImportError:\n    from smearcli import weights\n"  # a tree from before the grouping
                f"lm = weights.preset_model({preset!r}, seed=0); "
                f"weights.save_checkpoint(lm.model, {str(dest)!r}, 0)")
        sh(sys.executable, "-c", code, env={**os.environ, "PYTHONPATH": str(tree)}, cwd=tree)
    return dest


def timed_compare(tree: Path, ckpt: Path, seq_len: int, schedules: str, out_json: Path) -> dict:
    """Wall time and peak RSS of one `compare --json` in a child process. It runs in `tree`: for
    `python -m`, the working directory comes before PYTHONPATH on sys.path."""
    env = {**os.environ, "PYTHONPATH": str(tree)}
    cmd = [sys.executable, "-m", "smearcli", "compare", "--checkpoint", str(ckpt), "--seq-len", str(seq_len),
           "--schedules", schedules, "--json"]
    gnu_time = shutil.which("time") or ("/usr/bin/time" if Path("/usr/bin/time").exists() else None)
    load = loadavg()
    t0 = time.perf_counter()
    if gnu_time:
        p = subprocess.run([gnu_time, "-v", *cmd], env=env, capture_output=True, text=True, cwd=tree)
        m = re.search(r"Maximum resident set size \(kbytes\): (\d+)", p.stderr)
        rss = int(m.group(1)) * 1024 if m else None
        cpu = round(sum(float(x) for x in re.findall(r"(?:User|System) time \(seconds\): ([\d.]+)", p.stderr)), 2) or None
    else:
        import resource
        p = subprocess.run(cmd, env=env, capture_output=True, text=True, cwd=tree)
        ru = resource.getrusage(resource.RUSAGE_CHILDREN)
        rss = ru.ru_maxrss * 1024  # the largest child so far
        cpu = None
    wall = time.perf_counter() - t0
    out_json.write_text(p.stdout)
    return {"wall_s": round(wall, 2), "cpu_s": cpu, "peak_rss_bytes": rss, "rc": p.returncode, "loadavg_before": load,
            "loadavg_after": loadavg(), "stderr_tail": p.stderr.strip().splitlines()[-3:] if p.returncode else []}


FORWARD_CODE = r"""
import json, statistics, sys, time, torch
from smearcli.gpt import weights
from smearcli.measure import inputs
from smearcli.engines.nanochat.adapter import nanochat_from_model
from smearcli.engines.nanochat.sandbox import import_nanochat
ours = weights.preset_model("d12", seed=0).model
code = import_nanochat(sys.argv[1], dtype=torch.float32)
theirs = nanochat_from_model(code, ours).net
toks = inputs.random_tokens(ours.config, int(sys.argv[2]), 1, 0)
pairs = int(sys.argv[3])
def t(fn):
    t0 = time.perf_counter(); fn(); return time.perf_counter() - t0
with torch.inference_mode():
    a = ours(toks); b = theirs(toks)  # warm-up, and the outputs must agree
    same = float((a.float() - b.float()).abs().max())
    assert ours.__class__.__module__.startswith("smearcli")
    rows = []
    for i in range(pairs):
        o = t(lambda: ours(toks)); u = t(lambda: theirs(toks))
        rows.append((o, u))
print(json.dumps({"pairs": rows, "ratio_median": statistics.median(o / u for o, u in rows),
                  "ours_median_s": statistics.median(o for o, _ in rows),
                  "upstream_median_s": statistics.median(u for _, u in rows), "max_abs_logit_diff": same}))
"""


def forward_ratio(tree: Path, upstream: Path, seq_len: int, pairs: int) -> dict:
    load = loadavg()
    p = sh(sys.executable, "-c", FORWARD_CODE, upstream, seq_len, pairs, env={**os.environ, "PYTHONPATH": str(tree)},
           check=False, cwd=tree)
    if p.returncode:
        return {"error": p.stderr.strip().splitlines()[-1:], "loadavg_before": load}
    return {**json.loads(p.stdout.strip().splitlines()[-1]), "loadavg_before": load, "loadavg_after": loadavg(),
            "seq_len": seq_len}


def same_json(a: Path, b: Path) -> bool | None:
    try:
        da, db = json.loads(a.read_text()), json.loads(b.read_text())
    except (OSError, ValueError):
        return None
    for d in (da, db):
        d.get("model", {}).pop("source", None)
    return da.get("runs") == db.get("runs") and da.get("verdict") == db.get("verdict")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--before", default="e6769d0", help="revision measured as 'before'")
    ap.add_argument("--after", default=None, help="revision measured as 'after' (default: this checkout)")
    ap.add_argument("--nanochat-repo", type=Path, help="a git clone of karpathy/nanochat (for the upstream ratio)")
    ap.add_argument("--upstream-rev", default="92d63d4")
    ap.add_argument("--work", type=Path, default=Path("/tmp/smearcli-measure"))
    ap.add_argument("--skip-d20", action="store_true", help="leave out the d20 compare (needs ~25 GB, minutes)")
    ap.add_argument("--skip-d12", action="store_true", help="leave out the d12 compare")
    ap.add_argument("--d20-schedules", default="prefill,decode,chunked,engine,speculative")
    ap.add_argument("--schedules", default="prefill,decode,chunked,engine,speculative")
    ap.add_argument("--repeats", type=int, default=1, help="compare runs per revision, alternated (median kept)")
    ap.add_argument("--forward-tokens", type=int, default=2048)
    ap.add_argument("--forward-pairs", type=int, default=7)
    ap.add_argument("--out", type=Path, default=Path("before_after.json"))
    args = ap.parse_args()

    args.work.mkdir(parents=True, exist_ok=True)
    before = worktree(ROOT, args.before, args.work / "before")
    after = ROOT if args.after is None else worktree(ROOT, args.after, args.work / "after")
    result = {"machine": {"cpus": os.cpu_count(), "loadavg_start": loadavg(), "python": sys.version.split()[0]},
              "before": args.before, "after": args.after or sh("git", "-C", ROOT, "rev-parse", "HEAD").stdout.strip(),
              "compare": []}
    cases = (([] if args.skip_d12 else [("d12", 1024, args.schedules)])
             + ([] if args.skip_d20 else [("d20", 2048, args.d20_schedules)]))
    for preset, T, scheds in cases:
        ckpt = make_checkpoint(after, preset, args.work / f"ckpt-{preset}")
        row = {"shape": f"nanochat-{preset}", "tokens": T, "schedules": scheds}
        runs = {"before": [], "after": []}
        for i in range(args.repeats):  # alternated, so drifting load hits both alike
            for name, tree in (("before", before), ("after", after)):
                r = timed_compare(tree, ckpt, T, scheds, args.work / f"{preset}-{name}.json")
                runs[name].append(r)
                print(f"{preset} {T} {name} #{i + 1}: {r}", file=sys.stderr)
        for name, rs in runs.items():  # the median run by wall time, all runs kept
            row[name] = {**sorted(rs, key=lambda r: r["wall_s"])[len(rs) // 2], "all": rs}
        row["same_results"] = same_json(args.work / f"{preset}-before.json", args.work / f"{preset}-after.json")
        result["compare"].append(row)
    if args.nanochat_repo:
        upstream = worktree(args.nanochat_repo, args.upstream_rev, args.work / "nanochat-upstream")
        result["forward_d12"] = forward_ratio(after, upstream, args.forward_tokens, args.forward_pairs)
    args.out.write_text(json.dumps(result, indent=1) + "\n")

    print("| shape | tokens | before wall | after wall | change | before CPU | after CPU | before RSS | after RSS "
          "| same results | load (b/a) |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for r in result["compare"]:
        b, a = r["before"], r["after"]
        gib = lambda n: "-" if n is None else f"{n / 2**30:.2f} GiB"  # noqa: E731
        change = f"{100 * (a['wall_s'] / b['wall_s'] - 1):+.0f}%" if b["rc"] == 0 and a["rc"] == 0 else "failed"
        print(f"| {r['shape']} | {r['tokens']} | {b['wall_s']} s | {a['wall_s']} s | {change} | {b['cpu_s']} s "
              f"| {a['cpu_s']} s | {gib(b['peak_rss_bytes'])} "
              f"| {gib(a['peak_rss_bytes'])} | {r['same_results']} | {b['loadavg_before'][0]} / {a['loadavg_before'][0]} |")
    f = result.get("forward_d12")
    if f and "ratio_median" in f:
        print(f"\nforward, nanochat-d12 shape, 1 x {f['seq_len']} tokens: ours/upstream = {f['ratio_median']:.3f} "
              f"(median of {len(f['pairs'])} pairs; ours {f['ours_median_s']:.3f} s, upstream "
              f"{f['upstream_median_s']:.3f} s; max |dlogit| {f['max_abs_logit_diff']:.2e}; load {f['loadavg_before'][0]})")
    elif f:
        print(f"\nforward ratio failed: {f['error']}")


if __name__ == "__main__":
    main()
