"""Hold the census to bugs people reported: benchmarks/public_bugs/bugs.toml lists cached-path bugs
reported on huggingface/transformers, each with the release that had it, the release that fixed it
(or "open") and a probe without smearcli. For each bug this runs the probe and
`smearcli scan --release R --only ARCH` on both releases, decides whether the census found the bug
on the buggy release (a bug or a crash in their code on a named architecture, on the path the report
names or a combination containing it) and nothing for that path on the fixing release, and writes
docs/guide/public-bugs.md with the recall at the top.

    python scripts/public_bugs.py                  # scans what is not cached yet, then the page
    python scripts/public_bugs.py --no-run         # the page from the cached records and probes only
    python scripts/public_bugs.py --only mamba2-multi-token

Records are cached under $SMEARCLI_RELEASES/public-bugs/census-<key>/<release>/<arch>.jsonl, where
<key> hashes smearcli's own source: a rerun of the same census resumes where it stopped, and a rerun
after the census changed scans afresh (so the page always says what the census on this checkout
finds). Probe results are cached by the probe file's hash under public-bugs/probes/. Releases are
fetched and run as `scan --release` does ($SMEARCLI_RELEASES, default /tmp/smearcli-releases here). The census's own rules decide; nothing here names a bug's architecture to the
census. What counts as the report's path is each bug's `paths`: globs over the census's schedule
names, boundary names and the public-API paths of a finding's `reach`.
"""
from __future__ import annotations

import argparse
import dataclasses
import fnmatch
import hashlib
import json
import os
import re
import subprocess
import sys
import time
import tomllib
from pathlib import Path
from typing import Optional

import smearcli.engines  # noqa: F401 - every engine registered: known.toml places a record as its engine's
from smearcli.util.defaults import GENERATE_PATH
from smearcli.judging.verdicts import BUG as _BUG, CRASHED, NOT_BUILT, TIMED_OUT

ROOT = Path(__file__).resolve().parent.parent
BUGS = ROOT / "benchmarks" / "public_bugs" / "bugs.toml"
PAGE = ROOT / "docs" / "guide" / "public-bugs.md"

FIELDS = ("slug", "link", "title", "description", "architectures", "path_class", "paths", "buggy",
          "fixed", "probe", "set", "found_by", "combination")
FAILING = (str(_BUG), str(CRASHED))  # what counts as the census finding something (a bug or their crash)
LINK = re.compile(r"^huggingface/transformers#[0-9]+$")
VERSION = re.compile(r"^5\.[0-9]+\.[0-9]+$")
SETS = ("development", "independent")
RAISED = re.compile(r"^(.+?) (?:raised|crashed)\b")  # a crashed record's note naming the schedule that raised


# --------------------------------------------------------------------------- the list


def version_key(v: str) -> tuple:
    return tuple(int(x) for x in v.split("."))


def load(path: Path = BUGS) -> list[dict]:
    """The bugs of `path`, each checked (`problems`); a list with a problem is refused."""
    bugs = tomllib.loads(Path(path).read_text())["bug"]
    bad = [p for b in bugs for p in problems(b)]
    seen = [b.get("slug") for b in bugs]
    bad += [f"{s}: slug twice" for s in set(seen) if seen.count(s) > 1]
    if bad:
        raise SystemExit(f"{path}: " + "; ".join(bad))
    return bugs


def problems(bug: dict) -> list[str]:
    """What is wrong with one entry ([] when nothing is)."""
    name = bug.get("slug", "?")
    out = [f"{name}: no {f}" for f in FIELDS if f not in bug]
    if out:
        return out
    if not re.fullmatch(r"[a-z0-9-]+", bug["slug"]):
        out.append(f"{name}: slug is not [a-z0-9-]+")
    if not LINK.match(bug["link"]):
        out.append(f"{name}: link {bug['link']!r} is not huggingface/transformers#N")
    if not VERSION.match(bug["buggy"]):
        out.append(f"{name}: buggy {bug['buggy']!r} is not a 5.x release")
    if bug["fixed"] != "open":
        if not VERSION.match(bug["fixed"]):
            out.append(f"{name}: fixed {bug['fixed']!r} is neither a 5.x release nor 'open'")
        elif VERSION.match(bug["buggy"]) and version_key(bug["buggy"]) >= version_key(bug["fixed"]):
            out.append(f"{name}: buggy {bug['buggy']} is not before fixed {bug['fixed']}")
    if bug["set"] not in SETS:
        out.append(f"{name}: set {bug['set']!r} is not one of {SETS}")
    elif bug["set"] != set_of(bug["link"]):
        out.append(f"{name}: set {bug['set']!r}, but the link's number puts it in {set_of(bug['link'])!r}")
    for f in ("architectures", "paths"):
        if not bug[f] or not all(isinstance(x, str) and x for x in bug[f]):
            out.append(f"{name}: {f} must be a non-empty list of strings")
    if "raises" in bug:  # optional: the message pattern of a bug whose symptom is an exception
        try:
            re.compile(bug["raises"])
        except (re.error, TypeError) as e:
            out.append(f"{name}: raises {bug['raises']!r} is not a regular expression ({e})")
    if not (Path(BUGS).parent / bug["probe"]).is_file():
        out.append(f"{name}: probe {bug['probe']} is missing")
    for f in ("description", "title", "path_class", "found_by", "combination"):
        if not isinstance(bug[f], str) or not bug[f].strip():
            out.append(f"{name}: {f} is empty")
    return out


def set_of(link: str) -> str:
    """Development or independent, by the link's number: even or odd. Chosen before any census
    ran, so that neither half was picked for what the census finds."""
    return SETS[int(link.rsplit("#", 1)[1]) % 2]


def url(link: str) -> str:
    repo, n = link.split("#")
    return f"https://github.com/{repo}/issues/{n}"  # GitHub redirects an issue link to its PR


# --------------------------------------------------------------------------- the decision


@dataclasses.dataclass
class Seen:
    """What the census said on one release for one bug: `found` on the bug's path, and in words
    what caught it (the schedule or boundary and its shape) or what it said instead."""
    found: bool
    said: str
    ran: bool = True  # False: no record for an architecture yet


def _matches(name: Optional[str], globs) -> bool:
    return bool(name) and any(fnmatch.fnmatchcase(name, g) for g in globs)


def _status(x) -> Optional[str]:
    return None if x is None else getattr(x, "status", None)


def threads(rec, path: str) -> list[str]:
    """The numbers of the public threads known.toml places the record's finding on `path` against
    ("49036"); [] for a finding it calls new, or none. A path of generate's (a key of `reach`) is
    named as a headline names it, "generate: " + the path; one beside another headline (the census
    places headlines and boundaries) is placed here by the same table (`reach_threads`)."""
    said = [t.url.rstrip("/").rsplit("/", 1)[-1] for u in rec.upstream or []
            if u.path in (path, GENERATE_PATH + path) for t in u.threads or [] if t.url]
    return said or reach_threads(rec, path)


def reach_threads(rec, path: str) -> list[str]:
    """The public threads known.toml files a failing `reach` path of `rec` under (its crash, or its
    silent departure), placed as the census places a headline of that path: [] where none."""
    from smearcli.census import known, record
    from smearcli.measure.shapes import THROUGH_GENERATE

    got = rec.reach[path] if isinstance(rec.reach, dict) and path in rec.reach else None
    word = {"raises first": str(CRASHED), "silently wrong": str(_BUG)}.get(got.result if got is not None else None)
    if word is None:
        return []
    alone = record.bare(rec.model_type, word, worst_schedule=GENERATE_PATH + path, shape=THROUGH_GENERATE,
                        transformers_version=rec.transformers_version)
    known.place([alone])
    return [t.url.rstrip("/").rsplit("/", 1)[-1] for u in alone.upstream or []
            for t in u.threads or [] if t.url]


def another_thread(rec, path: str, link: str) -> bool:
    """Whether known.toml files the record's finding on `path` under public threads, none of them
    `link`'s ("huggingface/transformers#46084"): another reported bug on that path (#49036's crop on
    a release that fixed #46084's chunks), not this one."""
    filed = threads(rec, path)
    return bool(filed) and link.rsplit("#", 1)[-1] not in filed


def evidence(rec, globs, link: str = "", raises: Optional[str] = None) -> list[str]:
    """Every place in one record where the census found something (a bug, or their crash) on a
    path matching `globs`: a step plan, a boundary (their crop and the copy included), or a public
    API path of its reach (silently wrong, or raising inside their code once generate accepted the
    call: the census's crash on that path); a path whose finding upstream already files under
    another thread (`another_thread`) is that bug's, not evidence of this one. `raises`: for a bug
    whose symptom is an exception, a pattern its message must match, so that another crash on the
    same path (an earlier error that hides it) is not counted as this one."""
    if rec.verdict not in FAILING:
        return []

    def matches(name) -> bool:
        return _matches(name, globs) and not (link and another_thread(rec, name, link))

    def its(why) -> bool:  # a crash is this bug's when its message says so (or no pattern is given)
        return raises is None or bool(re.search(raises, str(why or "")))
    out = []
    worst = rec.worst_schedule
    if matches(worst) and (rec.verdict != CRASHED or its(rec.reason)):
        out.append(f"{worst}: {rec.verdict}" + (f" ({rec.shape})" if rec.shape and rec.shape != "-" else ""))
    boundaries = rec.boundaries or {}
    for name, s in (rec.schedules or {}).items():  # a boundary's row here is read from its entry below
        if name == worst or name in boundaries or s is None:
            continue
        if s.status in FAILING and matches(name):
            out.append(f"{name}: {s.status}")
    for name, b in boundaries.items():
        if name == worst or not matches(name):
            continue
        parts = [("", _status(b))]
        for sub in ("their_crop", "copy"):
            v = getattr(b, sub, None) if b.given(sub) else None
            parts.append((f" ({sub.replace('_', ' ')})", _status(v)))
        for label, st in parts:
            if st in FAILING and (st != CRASHED or its(getattr(b, "why", None))):
                out.append(f"{name}{label}: {st}" + (f" ({b.shape})" if label == "" and b.given("shape") and b.shape else ""))
                break
    for name, r in (rec.reach or {}).items():
        if r is None or not matches(name) or (out and worst == f"generate: {name}"):
            continue
        if r.result == "silently wrong":
            out.append(f"generate's {name}: silently wrong (reach)")
        elif r.result == "raises first" and its(r.why):
            out.append(f"generate's {name}: raises first (reach; {str(r.why or '')[:120]})")
    if rec.verdict == CRASHED and not out and its(rec.reason):  # the notes name the schedule that raised
        for note in rec.notes or []:
            m = RAISED.match(str(note))
            if m and matches(m.group(1)):
                out.append(f"{m.group(1)}: crashed ({(rec.reason or '').splitlines()[0][:160] if rec.reason else 'raised'})")
                break
    return out


def said(rec) -> str:
    """A record in a few words, for a bug it did not find."""
    if rec is None:
        return "not run yet"
    if rec.verdict in FAILING:
        what = rec.worst_schedule or "-"
        if rec.verdict == CRASHED and (not what or what == "-"):
            what = (rec.reason or "").splitlines()[0][:120] if rec.reason else "-"
        shape = f", {rec.shape}" if rec.shape and rec.shape != "-" else ""
        filed = threads(rec, what)
        filed = f" (upstream's #{filed[0]})" if filed else ""
        beside = [f"; generate's {p} {'raises' if e.result == 'raises first' else 'departs'} "
                  f"(upstream's #{t[0]})" for p, e in (rec.reach or {}).items() if e is not None
                  and GENERATE_PATH + p != what and (t := reach_threads(rec, p))]
        return f"{rec.verdict} elsewhere: {what}{shape}{filed}" + "".join(beside)
    if rec.verdict in (NOT_BUILT, TIMED_OUT) and rec.reason:
        return f"{rec.verdict}: {rec.reason.splitlines()[0][:120]}"
    return rec.verdict


def seen(bug: dict, records: dict, buggy: bool = True) -> Seen:
    """The census on one release for one bug, from `records` (model_type -> Record or None). On the
    buggy release a crash must be the bug's own (`raises`); on the fixing release any finding on
    the path counts against the fix, whatever its message."""
    found, other, ran = [], [], True
    for arch in bug["architectures"]:
        rec = records.get(arch)
        if rec is None:
            ran = False
            other.append(f"{arch}: not run yet")
            continue
        ev = evidence(rec, bug["paths"], bug["link"], bug.get("raises") if buggy else None)
        if ev:
            found.append(f"{arch}: " + "; ".join(ev))
        else:
            other.append(f"{arch}: {said(rec)}")
    if found:
        return Seen(True, " / ".join(found), ran)
    return Seen(False, " / ".join(other), ran)


@dataclasses.dataclass
class Outcome:
    bug: dict
    buggy: Seen
    fixed: Optional[Seen]  # None: the bug is open
    word: str  # found | missed | found on the fixed release too | not run yet


def decide(bug: dict, buggy_records: dict, fixed_records: Optional[dict]) -> Outcome:
    """Found: the census finds the bug's path on the buggy release and (where it was fixed) not on
    the fixing release. Missed: nothing on that path on the buggy release. Found on the fixed
    release too: it is not telling the bug from what was fixed."""
    b = seen(bug, buggy_records)
    f = None if bug["fixed"] == "open" else seen(bug, fixed_records or {}, buggy=False)
    if not b.ran or (f is not None and not f.ran and b.found):
        word = "not run yet"
    elif not b.found:
        word = "missed"
    elif f is not None and f.found:
        word = "found on the fixed release too"
    else:
        word = "found"
    return Outcome(bug, b, f, word)


def recall(outcomes: list[Outcome], which: Optional[str] = None) -> tuple[int, int]:
    """(found, total) over the outcomes of one set (None: all)."""
    chosen = [o for o in outcomes if which is None or o.bug["set"] == which]
    return sum(o.word == "found" for o in chosen), len(chosen)


# --------------------------------------------------------------------------- running


def cache_root() -> Path:
    return Path(os.environ.get("SMEARCLI_RELEASES") or Path.home() / ".cache" / "smearcli" / "releases") / "public-bugs"


def census_key() -> str:
    """A hash of smearcli's own source (every .py and .toml under smearcli/): the census a record
    was made by. Records of another census are not reused."""
    h = hashlib.sha256()
    for f in sorted((ROOT / "smearcli").rglob("*")):
        if f.suffix in (".py", ".toml") and "__pycache__" not in f.parts:
            h.update(str(f.relative_to(ROOT)).encode() + b"\0" + f.read_bytes() + b"\0")
    return h.hexdigest()[:12]


def records_root() -> Path:
    return cache_root() / f"census-{census_key()}"


_PINNED: Optional[Path] = None  # main() pins the census it started with: edits made meanwhile change nothing


def record_file(release: str, arch: str, root: Optional[Path] = None) -> Path:
    return (root or _PINNED or records_root()) / release / f"{arch}.jsonl"


def probe_file(bug: dict, release: str, bugs_path: Path = BUGS) -> Path:
    digest = hashlib.sha256((bugs_path.parent / bug["probe"]).read_bytes()).hexdigest()[:8]
    return cache_root() / "probes" / release / f"{bug['slug']}-{digest}.json"


def read_record(path: Path):
    from smearcli.census import records

    if not path.is_file() or path.stat().st_size == 0:
        return None
    from smearcli.census import known

    return known.place(records.merge([path]), known.load())[0]  # each finding placed against upstream


def scan(release: str, arch: str, timeout: Optional[float], root: Optional[Path] = None) -> float:
    """`smearcli scan --release R --only ARCH` into the cache (once); seconds it took (0: cached)."""
    out = record_file(release, arch, root)
    if out.is_file() and out.stat().st_size:
        return 0.0
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(".partial")
    tmp.unlink(missing_ok=True)
    cmd = [sys.executable, "-m", "smearcli", "scan", "--release", release, "--only", arch, "--jobs", "1",
           "--out", str(tmp), "--repro-dir", str(out.parent / f"repro-{arch}"), "--quiet"]
    if timeout:
        cmd += ["--timeout", str(timeout)]
    print(f"scan {release} {arch} ...", file=sys.stderr, flush=True)
    t0 = time.monotonic()
    p = subprocess.run(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    took = time.monotonic() - t0
    if tmp.is_file() and tmp.stat().st_size:
        out.with_suffix(".seconds").write_text(f"{took:.1f}\n")  # before the record: a record always has its time
        tmp.rename(out)
        print(f"scan {release} {arch}: {read_record(out).verdict} ({took:.0f} s)", file=sys.stderr, flush=True)
    else:
        print(f"scan {release} {arch} wrote no record (exit {p.returncode}): {p.stderr.strip()[-400:]}",
              file=sys.stderr, flush=True)
    return took


def probe(bug: dict, release: str) -> dict:
    """The bug's probe run in `release`'s Python (cached): {rc, line}."""
    out = probe_file(bug, release)
    if out.is_file():
        return json.loads(out.read_text())
    from smearcli.engines.transformers import releases

    python = releases.environment(release).python
    script = BUGS.parent / bug["probe"]
    t0 = time.monotonic()
    p = subprocess.run([str(python), str(script)], cwd=script.parent, capture_output=True, text=True, timeout=600)
    lines = [ln for ln in p.stdout.splitlines() if ln.startswith("transformers ")]
    result = {"rc": p.returncode, "line": lines[-1] if lines else (p.stderr.strip().splitlines() or [""])[-1],
              "seconds": round(time.monotonic() - t0, 1)}
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result) + "\n")
    return result


def releases_of(bug: dict) -> list[str]:
    return [bug["buggy"]] + ([] if bug["fixed"] == "open" else [bug["fixed"]])


def outcome(bug: dict, root: Optional[Path] = None) -> Outcome:
    recs = {r: {a: read_record(record_file(r, a, root)) for a in bug["architectures"]} for r in releases_of(bug)}
    return decide(bug, recs[bug["buggy"]], None if bug["fixed"] == "open" else recs[bug["fixed"]])


# --------------------------------------------------------------------------- the page


def _probe_word(p: Optional[dict]) -> str:
    if p is None:
        return "not run"
    return {0: "exit 0", 1: "exit 1 (bug)"}.get(p["rc"], f"exit {p['rc']} (undecided)")


def page(outcomes: list[Outcome], probes: dict, wall_s: Optional[float], census: Optional[str] = None) -> str:
    f_all, n_all = recall(outcomes)
    lines = ["# Public bugs: the census held to what people reported", ""]
    lines.append(
        f"**Recall: {f_all} of {n_all}** public cached-path bugs found on the release that had them and "
        "not on the release that fixed them "
        + "(" + "; ".join(f"{s} set {recall(outcomes, s)[0]} of {recall(outcomes, s)[1]}" for s in SETS) + ").")
    fixed_ok = [o for o in outcomes if o.fixed is not None and o.fixed.ran]
    lines.append(
        f"On the fixing release the census found the bug's path in {sum(o.fixed.found for o in fixed_ok)} "
        f"of {len(fixed_ok)} (0 is right: it was fixed).")
    missed = [o for o in outcomes if o.word not in ("found", "not run yet")]
    if missed:
        lines += ["", "Not found, and what the census would have to run to find it:", ""]
        for o in missed:
            seen_there = (f" On the fixing release {o.bug['fixed']} the census saw: {o.fixed.said}."
                          if o.word == "found on the fixed release too" and o.fixed is not None else "")
            lines.append(f"- [{o.bug['link'].split('/')[-1]}]({url(o.bug['link'])}) {o.bug['slug']} "
                         f"({o.word}): {o.bug['combination']}.{seen_there}")
        lines.append("")
    pending = [o for o in outcomes if o.word == "not run yet"]
    if pending:
        lines.append(f"{len(pending)} not run yet: " + ", ".join(o.bug["slug"] for o in pending) + ".")
    lines += ["",
              "Each bug below was reported on huggingface/transformers, read in its thread and its fixing "
              "pull request, and confirmed by a probe without smearcli (torch and transformers only, a tiny "
              "random config: `benchmarks/public_bugs/probe_*.py`) that exits 1 on the release that had it "
              "and 0 on the release that fixed it. `scripts/public_bugs.py` runs each probe and "
              "`smearcli scan --release R --only ARCH` (the census of this checkout, as it is) on both releases, "
              "and counts a bug **found** when the census calls a bug or a crash in their code on a named "
              "architecture on the path the report names, or on a combination containing it (the bug's "
              "`paths` in `bugs.toml`: globs over the census's schedule and boundary names and the "
              "public-API paths of a finding's reach), and finds nothing on that path on the fixing "
              "release. The census's rules stay general: nothing names a bug's architecture to it.",
              "",
              "The list is split in two by the link's number, chosen before any census ran: even numbers "
              "are the **development** set (the one work on the census may look at), odd numbers the "
              "**independent** set (held out, to report recall on bugs nobody tuned for).",
              ""]
    if census:
        lines += [f"Census: {census}.", ""]
    scans = scan_seconds(outcomes)
    probe_s = sum(v.get("seconds") or 0 for v in probes.values())
    if scans:
        lines += [f"Time: {len(scans)} scans (one architecture on one release each, `--jobs 1`) took "
                  f"{sum(scans):.0f} s in all (longest {max(scans):.0f} s), {len(probes)} probe runs {probe_s:.0f} s"
                  + (f"; this run of the script {wall_s:.0f} s (what was cached counts 0)" if wall_s is not None else "")
                  + ".", ""]
    lines += ["| set | bug | path class | had it | fixed in | census on the buggy release | on the fixed release | result |",
              "|---|---|---|---|---|---|---|---|"]
    for o in outcomes:
        b = o.bug
        fixed = b["fixed"]
        lines.append(
            f"| {b['set']} | [{b['link'].split('/')[-1]}]({url(b['link'])}) {b['slug']} | {b['path_class']} | "
            f"{b['buggy']} | {fixed} | {_cell(o.buggy)} | {_cell(o.fixed) if o.fixed else 'open'} | **{o.word}** |")
    for which in SETS:
        lines += ["", f"## The {which} set", ""]
        for o in [o for o in outcomes if o.bug["set"] == which]:
            b = o.bug
            pb = probes.get((b["slug"], b["buggy"]))
            pf = probes.get((b["slug"], b["fixed"])) if b["fixed"] != "open" else None
            lines += [f"### {b['slug']}: {b['title']}", "",
                      f"[{b['link']}]({url(b['link'])}). {b['description'].strip()}", "",
                      f"- **Architectures**: {', '.join(b['architectures'])}; **path class**: {b['path_class']} "
                      f"(counted on: {', '.join('`' + p + '`' for p in b['paths'])})",
                      f"- **What the census must run to see it**: {b['combination']}",
                      f"- **Releases**: had it in {b['buggy']}; "
                      + ("open (no fixing release)" if b["fixed"] == "open" else f"fixed in {b['fixed']}")
                      + f"; found by: {b['found_by']}",
                      f"- **Probe** (`{b['probe']}`): {b['buggy']} {_probe_word(pb)}{_probe_line(pb)}"
                      + (f"; {b['fixed']} {_probe_word(pf)}{_probe_line(pf)}" if b["fixed"] != "open" else ""),
                      f"- **Census on {b['buggy']}**: {o.buggy.said}"]
            if o.fixed is not None:
                lines.append(f"- **Census on {b['fixed']}**: {o.fixed.said}")
            lines += [f"- **Result**: {o.word}", ""]
    return "\n".join(lines).rstrip() + "\n"


def scan_seconds(outcomes: list[Outcome]) -> list[float]:
    """Seconds each distinct (release, architecture) scan of these bugs took, where recorded."""
    out = {}
    for o in outcomes:
        for release in releases_of(o.bug):
            for arch in o.bug["architectures"]:
                f = record_file(release, arch).with_suffix(".seconds")
                if f.is_file():
                    out[release, arch] = float(f.read_text())
    return list(out.values())


def describe_census() -> str:
    """Which census made the records: smearcli's commit, and whether smearcli/ differed from it."""
    def git(*a):
        p = subprocess.run(["git", *a], cwd=ROOT, capture_output=True, text=True)
        return p.stdout.strip() if p.returncode == 0 else ""
    commit = git("rev-parse", "--short", "HEAD") or "unknown commit"
    dirty = git("status", "--porcelain", "--", "smearcli")
    used, now = (_PINNED or records_root()).name.removeprefix("census-"), census_key()
    if used != now:
        return (f"the records of census key {used}, an earlier state of smearcli than this checkout's ({now}): "
                "rerun without --no-run to scan with this one")
    return (f"smearcli at {commit}" + (" with uncommitted changes under smearcli/" if dirty else "")
            + f" (census key {used}), each architecture by `scan --release R --only ARCH --jobs 1`")


def _probe_line(p: Optional[dict]) -> str:
    """What the probe printed, less its version prefix: ' (max |dlogit| 3.9e+00 ...)'."""
    if not p or not p.get("line"):
        return ""
    return f" ({p['line'].split(': ', 1)[-1]})"


def _cell(s: Seen) -> str:
    text = ("found: " if s.found else "") + s.said
    return text.replace("|", "/")[:200]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bugs", type=Path, default=BUGS)
    ap.add_argument("--page", type=Path, default=PAGE)
    ap.add_argument("--only", help="comma-separated slugs")
    ap.add_argument("--no-run", action="store_true", help="write the page from what is cached; run nothing")
    ap.add_argument("--no-probe", action="store_true", help="run no probe (their cached results still show)")
    ap.add_argument("--timeout", type=float, help="the scan's --timeout per architecture")
    args = ap.parse_args(argv)
    global _PINNED
    _PINNED = records_root()
    if args.no_run and not _PINNED.is_dir():  # the census changed since the last run: show that run's
        made = sorted(cache_root().glob("census-*"), key=lambda d: d.stat().st_mtime)
        if made:
            _PINNED = made[-1]
    bugs = load(args.bugs)
    chosen = [b for b in bugs if not args.only or b["slug"] in args.only.split(",")]
    t0 = time.monotonic()
    probes = {}
    for bug in chosen:
        for release in releases_of(bug):
            if not args.no_run:
                for arch in bug["architectures"]:
                    scan(release, arch, args.timeout)
            cached = probe_file(bug, release)
            if not args.no_run and not args.no_probe:
                probes[bug["slug"], release] = probe(bug, release)
            elif cached.is_file():
                probes[bug["slug"], release] = json.loads(cached.read_text())
        # the page after every bug: a run stopped midway leaves what it had
        _write(args.page, bugs, probes, None)
    wall = time.monotonic() - t0
    _write(args.page, bugs, probes, None if args.no_run else wall)
    outs = [outcome(b) for b in bugs]
    print(f"recall {recall(outs)[0]}/{recall(outs)[1]} "
          + " ".join(f"{s} {recall(outs, s)[0]}/{recall(outs, s)[1]}" for s in SETS) + f" ({wall:.0f} s)")
    return 0


def _write(path: Path, bugs: list, probes: dict, wall: Optional[float]) -> None:
    for bug in bugs:  # probes cached by earlier runs show too
        for release in releases_of(bug):
            cached = probe_file(bug, release)
            if (bug["slug"], release) not in probes and cached.is_file():
                probes[bug["slug"], release] = json.loads(cached.read_text())
    text = page([outcome(b) for b in bugs], probes, wall, describe_census())
    tmp = path.with_suffix(".tmp")
    tmp.write_text(text)
    tmp.rename(path)


if __name__ == "__main__":
    sys.exit(main())
