"""Regenerate a census page of the guide from `smearcli scan`: the census's Markdown goes between the
page's markers. One script for every engine; `scripts/regen.py` runs it as its census steps.

    python scripts/gen_census.py [--engine transformers] [--from F.jsonl ...] [--against OLD.jsonl ...]
    SMEARCLI_VLLM_PYTHON=DIR/bin/python python scripts/gen_census.py --engine vllm [--resume | --write-only]
    SMEARCLI_LLAMACPP_PYTHON=DIR/bin/python python scripts/gen_census.py --engine llamacpp [--resume | --write-only]

--engine transformers (the default; `regen.py --only census`): the census of the installed
transformers, `smearcli scan --jobs 2` over every causal LM (about 6.5 minutes on 2 idle cores),
into docs/guide/scan.md between its `census` markers; the scan's files (JSON Lines, reproducers,
bug-report drafts) go to build/scan/.

    python scripts/gen_census.py --against OLD.jsonl --against-source OLD_SITE/transformers
    python scripts/gen_census.py --diff-only --against OLD.jsonl ...   # the diff alone, from build/scan
    python scripts/gen_census.py --from A.jsonl --from B.jsonl        # the page from a census run in shards

With `--against` (the previous release's record file) the page's `census-diff` block gets what
changed per architecture (`smearcli.census.diff`), each change with the one line of explanation
docs/guide/scan-changes.json holds for it (model type -> line; a change without one says what
the records and the sources tell).

--engine vllm (`regen.py --only vllm-census`): the census on vLLM in docs/guide/vllm.md. Runs
`smearcli scan --engine vllm` as LANES scans at once sharing one claims folder (`--claims`, one
record file each under build/), the documented way to use more than one core: each takes the next
architecture neither has taken, so the two end together however long each architecture takes
(fixed shares, `--shard`, left one lane 3 minutes behind the other); each has its own vLLM worker,
bound to a core of its own (`VLLM_CPU_OMP_THREADS_BIND`), so one lane's transformers side runs
while the other's vLLM does. The benchmark (the wall time, vLLM's imports, the engines' starts) is
summed from the records per lane, the census's wall time being the longest lane's, so a stopped run
counts too. Then the census's Markdown (`--merge` of the lanes) and the benchmark go between the
`<!-- vllm-census:start -->` and `<!-- vllm-census:end -->` markers of the guide.

--engine llamacpp (`regen.py --only llamacpp-census`): the census on llama.cpp in
docs/guide/llamacpp.md. Runs `smearcli scan --engine llamacpp --jobs 2` (each architecture in its
own process with its own llama.cpp worker, one thread each: two at once on two cores) to
build/llamacpp-census.jsonl, the findings' reproducers and their GGUF files to
build/llamacpp-census-repro/. Then the census's Markdown (`--merge` of the records, with the run's
benchmark and load) goes between the `<!-- llamacpp-census:start -->` and
`<!-- llamacpp-census:end -->` markers of the guide, and its figure (every architecture x schedule,
each cell the distance from llama.cpp's own one-call prefill as a multiple of the float64 floor)
to docs/figures/llamacpp-census.png.

For vllm and llamacpp, `--resume` continues a stopped census and `--write-only` writes the guide
from the records there are; without the engine's $SMEARCLI_VLLM_PYTHON / $SMEARCLI_LLAMACPP_PYTHON
the script says so and exits 0: the step is skipped, nothing changes.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # this checkout's smearcli, for what is imported here
BUILD = ROOT / "build"
GUIDE = ROOT / "docs" / "guide"
ENGINES = ("transformers", "vllm", "llamacpp")


# What every engine shares: the scan subprocess, the record files, the block between markers.

def smearcli_scan(args: list[str], stdout=subprocess.DEVNULL, env: dict | None = None, wait: bool = True):
    """`smearcli scan ARGS` of this checkout, run from the root; waited for unless `wait` is False
    (then the Popen, for scans side by side)."""
    cmd = [sys.executable, "-m", "smearcli", "scan", *args]
    env = {**os.environ, "PYTHONPATH": str(ROOT), **(env or {})}
    if not wait:
        return subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=stdout, text=True)
    return subprocess.run(cmd, check=False, cwd=ROOT, env=env, stdout=stdout, text=True)


def census_markdown(records: list[Path], md: Path, who: str, *extra: str) -> str:
    """The Markdown `smearcli scan --merge` makes of `records` (`extra`: more of scan's arguments),
    written to `md` and returned."""
    p = smearcli_scan([*extra, "--markdown", str(md), *(a for r in records for a in ("--merge", str(r)))])
    if p.returncode != 0:
        sys.exit(f"{who}: the scan failed (exit {p.returncode})")
    return md.read_text()


def read_records(path: Path) -> list:
    """The records of one JSON Lines file, as `census.record.Record`s (none when it does not exist;
    a last line a stopped scan left half written is left out, as a resumed scan leaves it)."""
    import smearcli.engines  # noqa: F401 - every engine registered: its fields are read, its data as its part
    from smearcli.census import records

    return records.read(path, torn_ok=True).records if path.exists() else []


def write_block(page: Path, name: str, body: str, who: str, said: str = " updated") -> None:
    """Replace what is between the `<!-- NAME:start -->` and `<!-- NAME:end -->` markers of `page`
    with `body`; exits in one line when the page has no such markers."""
    start, end = f"<!-- {name}:start -->", f"<!-- {name}:end -->"
    text = page.read_text()
    head, found, rest = text.partition(start)
    if not found or end not in rest:
        sys.exit(f"{who}: {page} has no {name} markers")
    tail = rest.split(end, 1)[1]
    page.write_text(head + start + body + end + tail)
    print(f"{who}: {page.relative_to(ROOT)}{said}", flush=True)


def needs_python(var: str, engine: str, what: str, who: str) -> bool:
    """Whether the engine's environment is named ($VAR); says the step is skipped when it is not."""
    if os.environ.get(var, "").strip():
        return True
    print(f"{who}: skipped: set {var} to the Python of {what} environment "
          f"(scripts/make_env.sh {engine} DIR makes one)", flush=True)
    return False


def engine_block(records: list[Path], banner: str, who: str) -> str:
    """The block of an engine's guide (vLLM's, llama.cpp's): `banner` in italics (none when empty)
    and the census's Markdown, its sections one level under the guide's own heading."""
    with tempfile.TemporaryDirectory() as d:
        md = census_markdown(records, Path(d) / "census.md", who)
    body = md.split("\n", 1)[1].replace("\n## ", "\n#### ")
    return "\n\n" + (f"_{banner}_\n" if banner else "") + f"{body}\n"


# transformers: the census of the installed release in docs/guide/scan.md.

SCAN_PAGE = GUIDE / "scan.md"
WHY = GUIDE / "scan-changes.json"
SCAN_OUT = BUILD / "scan"
TRANSFORMERS = "gen_census"


def transformers_census(shards=None) -> None:
    """The scan run here (or, with `shards`, the record files of one run in shards, merged), its
    Markdown into the page with a line saying how it was made."""
    SCAN_OUT.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    md_path = SCAN_OUT / "census.md"
    if shards:
        md = census_markdown(shards, md_path, TRANSFORMERS, "--quiet")
    else:
        p = smearcli_scan(["--jobs", "2", "--quiet", "--out", str(SCAN_OUT / "census.jsonl"),
                           "--repro-dir", str(SCAN_OUT / "repro"), "--markdown", str(md_path)])
        if p.returncode != 0:
            sys.exit(f"{TRANSFORMERS}: the scan failed (exit {p.returncode})")
        md = md_path.read_text()
    head, _, body = md.partition("\n")
    body = body.lstrip("\n").replace("\n## ", "\n### ")  # under the page's own heading
    version = head.rsplit("transformers ", 1)[-1].strip()
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    if shards:  # the architectures' own seconds: the run's wall clock is not known here
        total = sum(r.wall_s or 0 for f in shards for r in read_records(Path(f)))
        files = "1 record file" if len(shards) == 1 else f"{len(shards)} record files (shards)"
        stamp = (f"*transformers {version}; the records of `smearcli scan` from {files}, {total:.0f} s of "
                 f"architectures in all ({os.cpu_count()} cores, load {load:.1f} when merged); made into this page by "
                 f"`python scripts/gen_census.py --from ...`.*\n\n")
    else:
        stamp = (f"*transformers {version}; generated by `python scripts/gen_census.py` in {time.time() - t0:.0f} s "
                 f"with `--jobs 2` ({os.cpu_count()} cores, load {load:.1f}).*\n\n")
    write_block(SCAN_PAGE, "census", "\n" + stamp + body, TRANSFORMERS)


def transformers_changes(against: Path, source, shards=None, common: bool = False) -> None:
    """The page's diff block: this census (build/scan, or its shards) against the previous
    release's records; `common`: only the architectures the previous census holds (one rerun on
    a subset), said in the block."""
    from smearcli.census import diff, records

    previous, current = records.merge([against]), records.merge(shards or [SCAN_OUT / "census.jsonl"])
    said = ""
    if common:
        held = {r.model_type for r in previous}
        said = (f"The previous release's census here covers {len(held)} of the {len(current)} architectures; "
                "the diff compares those alone.\n\n")
        current = [r for r in current if r.model_type in held]
    sources = None
    if source is not None:
        from smearcli.engines.transformers.sources import Sources

        sources = Sources.installed(Path(source))
    found = diff.compare(previous, current, sources)
    why = json.loads(WHY.read_text()) if WHY.exists() else {}
    body = said + diff.markdown(found, diff.release(previous), diff.release(current), why)
    write_block(SCAN_PAGE, "census-diff", "\n" + body, TRANSFORMERS,
                f": {len(found)} changes against {diff.release(previous)}")


def run_transformers(args) -> None:
    if not args.diff_only:
        transformers_census(args.shards)
    if args.against is not None:
        transformers_changes(args.against, args.against_source, args.shards, args.common)


# vllm: LANES scans sharing a claims folder, into docs/guide/vllm.md.

VLLM = "gen_census --engine vllm"
LANES = 2  # scans at once: the two cores CI and the docs' numbers have
VLLM_REPRO = BUILD / "vllm-census-repro"
VLLM_CLAIMS = BUILD / "vllm-census.claims"
VLLM_TIMEOUT_S = 600  # one architecture and its reproducer: about 70 s on two busy cores, 5 minutes with a
# request stuck inside vLLM (the worker's watchdog, then the reproducer's, at 120 s each)


def lane_file(lane: int) -> Path:
    return BUILD / f"vllm-census.{lane}-of-{LANES}.jsonl"


def vllm_files() -> list[Path]:
    return [lane_file(i) for i in range(1, LANES + 1)]


def fresh_claims() -> None:
    """The claims folder anew, holding what the lanes' files already record (a resumed census
    checks none of it again, and no architecture lands in two files)."""
    shutil.rmtree(VLLM_CLAIMS, ignore_errors=True)
    VLLM_CLAIMS.mkdir(parents=True)
    for f in vllm_files():
        for r in read_records(f):
            (VLLM_CLAIMS / r.model_type).touch()


def vllm_scan(*args: str) -> None:
    """Every lane at once, each to its own file; waits for all of them."""
    fresh_claims()
    procs = []
    for lane, out in enumerate(vllm_files(), 1):
        cmd = ["--engine", "vllm", "--claims", str(VLLM_CLAIMS), "--out", str(out), "--repro-dir", str(VLLM_REPRO),
               "--timeout", str(VLLM_TIMEOUT_S), "--memory-mb", "4096", "--json", *args]
        print(f"{VLLM}: -m smearcli scan", " ".join(cmd), flush=True)
        bind = str(lane - 1) if (os.cpu_count() or 1) >= LANES else "auto"
        procs.append(smearcli_scan(cmd, stdout=subprocess.PIPE, wait=False,
                                   env={"OMP_NUM_THREADS": "1", "VLLM_CPU_OMP_THREADS_BIND": bind}))
    for p in procs:
        out, _ = p.communicate()
        if p.returncode not in (0, 1):  # 1: --check is not given, but keep the records of any run that ended
            sys.exit(f"{VLLM}: a lane of the census failed (exit {p.returncode})")
        print(f"{VLLM}:", json.dumps(json.loads(out).get("benchmark")), flush=True)


def runs_of(recs: list) -> list:
    """The records split into the runs that wrote them: each record holds its run's vLLM import
    time so far and worker starts; within a run the import time changes only with a new start."""
    runs, last = [], None
    for r in recs:
        mark = (r.vllm.starts or 0, r.vllm.import_s_so_far or 0.0) if r.vllm is not None else (0, 0.0)
        if last is None or mark != last and mark[0] <= last[0]:
            runs.append([])
        runs[-1].append(r)
        last = mark
    return runs


def lane_time(recs: list) -> tuple[float, float, float]:
    """One lane's (wall time, vLLM imports, engine starts) from its records."""
    runs = runs_of(recs)
    imports = sum(max((r.vllm.import_s_so_far or 0) if r.vllm is not None else 0 for r in run) for run in runs)
    engines = sum(float(s or 0) for r in recs if r.vllm is not None for s in r.vllm.engine_start_s or [])
    return imports + sum(r.wall_s or 0 for r in recs), imports, engines


def vllm_benchmark() -> str:
    """The census's time from its records (so a run stopped early still counts): per lane, each
    architecture's wall time, vLLM's imports (each run's last count) and the engines' starts; the
    census takes as long as its longest lane."""
    lanes = [read_records(f) for f in vllm_files() if f.exists()]
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


def vllm_fresh() -> None:
    """Before a census that does not resume: the lanes' files of the last one removed."""
    for f in vllm_files():
        f.unlink(missing_ok=True)


def vllm_write() -> None:
    block = engine_block([f for f in vllm_files() if f.exists()], vllm_benchmark(), VLLM)
    write_block(GUIDE / "vllm.md", "vllm-census", block, VLLM)


# llamacpp: one scan with --jobs 2, into docs/guide/llamacpp.md and its figure.

LLAMACPP = "gen_census --engine llamacpp"
LLAMACPP_OUT = BUILD / "llamacpp-census.jsonl"
LLAMACPP_BENCH = BUILD / "llamacpp-census.benchmark.json"  # the last run's benchmark line, for --write-only
LLAMACPP_REPRO = BUILD / "llamacpp-census-repro"
LLAMACPP_FIGURE = ROOT / "docs" / "figures" / "llamacpp-census.png"
LLAMACPP_JOBS = 2
LLAMACPP_TIMEOUT_S = 300  # one architecture: 10 to 25 s on two busy cores; the worker's own limit is 15 s less


def llamacpp_scan(*args: str) -> None:
    cmd = ["--engine", "llamacpp", "--jobs", str(LLAMACPP_JOBS), "--out", str(LLAMACPP_OUT), "--repro-dir",
           str(LLAMACPP_REPRO), "--timeout", str(LLAMACPP_TIMEOUT_S), "--json", *args]
    print(f"{LLAMACPP}: -m smearcli scan", " ".join(cmd), flush=True)
    p = smearcli_scan(cmd, stdout=subprocess.PIPE)
    if p.returncode not in (0, 1):
        sys.exit(f"{LLAMACPP}: the census failed (exit {p.returncode})")
    doc = json.loads(p.stdout)
    meta = {**{k: doc.get(k) for k in ("benchmark", "load", "llama_cpp_python")}, "jobs": LLAMACPP_JOBS}
    LLAMACPP_BENCH.write_text(json.dumps(meta) + "\n")
    print(f"{LLAMACPP}:", json.dumps(meta), flush=True)


def llamacpp_benchmark() -> str:
    from smearcli.engines.llamacpp.session import summary_line

    if not LLAMACPP_BENCH.exists():
        return ""
    meta = json.loads(LLAMACPP_BENCH.read_text())
    b = meta.get("benchmark")
    if not b:
        return ""
    return (f"{summary_line(b)}; --jobs {meta.get('jobs')}, load average {meta.get('load')} (1, 5, 15 min) at "
            "the end, on a 2-core machine shared with other work. A resumed run counts only what it ran.")


def llamacpp_fresh() -> None:
    LLAMACPP_OUT.unlink(missing_ok=True)


def llamacpp_write() -> None:
    block = engine_block([LLAMACPP_OUT], llamacpp_benchmark(), LLAMACPP)
    write_block(GUIDE / "llamacpp.md", "llamacpp-census", block, LLAMACPP)
    llamacpp_figure()


def llamacpp_figure() -> None:
    from smearcli.render import figures, scan_figure

    recs = read_records(LLAMACPP_OUT)
    figures.save(scan_figure.figure(recs, value=scan_figure.against_own_prefill), LLAMACPP_FIGURE)
    print(f"{LLAMACPP}: {LLAMACPP_FIGURE.relative_to(ROOT)} written", flush=True)


class OwnEnvironment(NamedTuple):
    """An engine that runs in an environment of its own (made by scripts/make_env.sh), its census
    run here and written into its guide: what differs between vLLM and llama.cpp."""
    var: str  # the variable naming its Python; the step is skipped without it
    what: str  # whose environment, in the skip message
    who: str  # the prefix of what the script says
    fresh: Callable[[], None]  # the last census's records removed (a census that does not resume)
    scan: Callable[..., None]  # the census, given scan's extra arguments
    write: Callable[[], None]  # the guide (and figure) from the records there are


OWN_ENVIRONMENT = {
    "vllm": OwnEnvironment("SMEARCLI_VLLM_PYTHON", "vLLM's", VLLM, vllm_fresh, vllm_scan, vllm_write),
    "llamacpp": OwnEnvironment("SMEARCLI_LLAMACPP_PYTHON", "llama.cpp's", LLAMACPP, llamacpp_fresh, llamacpp_scan,
                               llamacpp_write),
}


def run_own_environment(engine: str, args) -> None:
    e = OWN_ENVIRONMENT[engine]
    if not needs_python(e.var, engine, e.what, e.who):
        return
    if not args.write_only:
        BUILD.mkdir(parents=True, exist_ok=True)
        if not args.resume:
            e.fresh()
        e.scan("--resume")
    e.write()


# Which options belong to which engine: one given to another engine is refused.
OPTIONS = {
    "transformers": {"against": "--against", "against_source": "--against-source", "diff_only": "--diff-only",
                     "common": "--common", "shards": "--from"},
    "own": {"resume": "--resume", "write_only": "--write-only"},
}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="gen_census.py", description=__doc__.split("\n\n")[0])
    ap.add_argument("--engine", choices=ENGINES, default="transformers",
                    help="whose census: transformers (default; docs/guide/scan.md), vllm (docs/guide/vllm.md) or "
                         "llamacpp (docs/guide/llamacpp.md)")
    t = ap.add_argument_group("transformers")
    t.add_argument("--against", type=Path, help="the previous release's census record file")
    t.add_argument("--against-source", type=Path, help="the previous release's transformers package directory")
    t.add_argument("--diff-only", action="store_true", help="no scan: the diff of build/scan's census alone")
    t.add_argument("--common", action="store_true", help="diff only the architectures --against holds")
    t.add_argument("--from", dest="shards", type=Path, action="append", help="no scan: the census's shard files")
    o = ap.add_argument_group("vllm and llamacpp")
    o.add_argument("--resume", action="store_true", help="continue a stopped census")
    o.add_argument("--write-only", action="store_true", help="no scan: the guide from the records there are")
    args = ap.parse_args(argv)
    group = "transformers" if args.engine == "transformers" else "own"
    foreign = [flag for g, opts in OPTIONS.items() if g != group for dest, flag in opts.items() if getattr(args, dest)]
    if foreign:
        ap.error(f"{', '.join(foreign)} {'is not an option' if len(foreign) == 1 else 'are not options'} of "
                 f"--engine {args.engine}")
    if args.engine == "transformers":
        if args.diff_only and args.against is None:
            ap.error("--diff-only needs --against")
        run_transformers(args)
    else:
        run_own_environment(args.engine, args)


if __name__ == "__main__":
    main()
