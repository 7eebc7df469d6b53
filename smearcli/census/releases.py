"""Other transformers releases for the census: where they are kept, how one is made ready, and the
search for the release a finding appears in.

A release is one transformers wheel, kept in a cache directory (`cache_dir`: `$SMEARCLI_RELEASES`, or
~/.cache/smearcli/releases): `fetch` takes it from a directory of wheels the user names, from the
cache, or from the package index with pip (`pip download --no-deps`), and `read_wheel` checks that
the file is a wheel of transformers at that version (anything else is one `UserError`).
`environment` makes the Python that runs it: a venv per release (and per base Python) with
`--system-site-packages` over smearcli's own Python, so torch and smearcli are the ones already
installed, and the wheel installed in it with `--no-deps`; each of the wheel's requirements (its
`Requires-Dist` without extras) is checked against what is installed, and those not met are
installed into that venv (from the same wheel directory where one was named), or the release is
refused with the list. A venv is made in a temporary directory beside its place and renamed into it
once complete, so a half-made one is never used. The release smearcli's own Python has installed
needs no venv: its Python is used.

`listed` gives the 5.x releases (the index's, by `pip index versions`, or the wheel directory's), and
`pick` a range of them ("5.20.0..5.25.0"). `command` is smearcli's own program in a release's Python
(the census runs there exactly as it runs here: nothing of its loop is copied). `bisect` finds,
among releases in order, the first where a finding appears and the first after it where it is gone,
by binary search over `probe`s as `git bisect` does over commits, saying each probe's verdict as it
goes; `probe` runs one architecture on one release into a record file under the cache (kept, so a
second search reuses it) and reads its verdict, and says when the architecture does not exist in
that release.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import site
import subprocess
import sys
import tempfile
import time
import zipfile
from dataclasses import dataclass, field
from email.parser import Parser
from pathlib import Path
from typing import Callable, Optional, Sequence

from ..errors import UserError

ENV_VAR = "SMEARCLI_RELEASES"
PACKAGE = "transformers"
MAJOR = 5  # the releases listed and searched: 5.x (the hf extra's range)
PROGRAM = ("-m", "smearcli")  # smearcli in a release's Python, after the interpreter
READY = "smearcli-release.json"  # written last inside a venv being made: what it holds
PIP_TIMEOUT = 600  # seconds for one pip call (a download, an install)
WHEEL_NAME = re.compile(r"^([A-Za-z0-9_.]+)-([^-]+)-.+\.whl$")
IN_MAPPING = ("import sys\nfrom transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES as m\n"
              "sys.exit(0 if sys.argv[1] in m else 3)")


class Unreachable(UserError):
    """The package index could not give what was asked (offline, or no such release there)."""


def cache_dir() -> Path:
    """Where releases are kept: `$SMEARCLI_RELEASES`, else ~/.cache/smearcli/releases."""
    given = os.environ.get(ENV_VAR, "").strip()
    return Path(given).expanduser() if given else Path.home() / ".cache" / "smearcli" / "releases"


def _version(text: str):
    from packaging.version import InvalidVersion, Version

    try:
        return Version(text)
    except InvalidVersion:
        return None


def release(text: str) -> str:
    """A release number as transformers spells it ("5.25.0"), refused when it is not one."""
    v = _version(text.strip())
    if v is None or v.is_prerelease or v.is_devrelease or len(v.release) > 3:
        raise UserError(f"{text!r} is not a transformers release number (like 5.25.0)")
    if v.major != MAJOR:
        raise UserError(f"transformers {text}: only {MAJOR}.x releases are censused (the hf extra's range)")
    return ".".join(str(x) for x in (v.release + (0, 0))[:3])


def _same(a: str, b: str) -> bool:
    va, vb = _version(a), _version(b)
    return va is not None and va == vb


@dataclass
class Wheel:
    """A transformers wheel, checked: its file, release and requirements (`Requires-Dist` lines)."""
    path: Path
    version: str
    requires: list = field(default_factory=list)
    requires_python: Optional[str] = None


def read_wheel(path: Path, want: Optional[str] = None) -> Wheel:
    """The wheel at `path`, checked to be transformers (at release `want`, when given) by its own
    metadata, not its name: a file that is not a wheel, or a wheel of another package or release,
    is refused."""
    path = Path(path)
    try:
        with zipfile.ZipFile(path) as z:
            metas = [n for n in z.namelist() if n.count("/") == 1 and n.endswith(".dist-info/METADATA")]
            if len(metas) != 1:
                raise UserError(f"{path}: not a wheel (no .dist-info/METADATA in it)")
            meta = Parser().parsestr(z.read(metas[0]).decode("utf-8", "replace"))
    except zipfile.BadZipFile:
        raise UserError(f"{path}: not a wheel (not a zip file)") from None
    except OSError as e:
        raise UserError(f"{path}: cannot read it ({e.strerror or e})") from None
    name, version = (meta.get("Name") or "").strip(), (meta.get("Version") or "").strip()
    if name.lower().replace("_", "-") != PACKAGE:
        raise UserError(f"{path}: a wheel of {name or 'an unnamed package'} {version}, not of {PACKAGE}")
    if want is not None and not _same(version, want):
        raise UserError(f"{path}: a wheel of {PACKAGE} {version}, not of {want}")
    return Wheel(path, version, meta.get_all("Requires-Dist") or [], meta.get("Requires-Python"))


def _named(directory: Path, version: str) -> list[Path]:
    """The files of `directory` whose wheel name says transformers at `version`."""
    out = []
    for p in sorted(directory.glob("*.whl")):
        m = WHEEL_NAME.match(p.name)
        if m and m[1].lower().replace("_", "-") == PACKAGE and _same(m[2], version):
            out.append(p)
    return out


def pip(args: Sequence[str], python: Optional[str] = None, **options) -> subprocess.CompletedProcess:
    """pip `args` (the ordinary client) run by `python` (default smearcli's own; a release's venv
    imports the pip of the Python it is made over), its output captured. `options` are pip's own
    options given as its PIP_* environment variables (no_deps=True is PIP_NO_DEPS=1; find_links=DIR),
    beside the user's pip configuration; pip's version check is off."""
    env = {**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
    for key, value in options.items():
        env[f"PIP_{key.upper()}"] = "1" if value is True else str(value)
    return subprocess.run([python or sys.executable, "-m", "pip", *args], capture_output=True, text=True,
                          timeout=PIP_TIMEOUT, env=env)


def _last_error(p: subprocess.CompletedProcess) -> str:
    lines = [ln.strip() for ln in (p.stderr or "").splitlines() + (p.stdout or "").splitlines() if ln.strip()]
    errors = [ln for ln in lines if ln.startswith("ERROR")]
    return (errors or lines or [f"exit status {p.returncode}"])[0 if errors else -1]


def fetch(version: str, wheels: Optional[Path] = None, root: Optional[Path] = None) -> Wheel:
    """transformers `version`'s wheel, checked (`read_wheel`): from `wheels` (a directory the user
    names: nothing is downloaded then), else from the cache's wheels/, else downloaded there by pip.
    A download that fails raises `Unreachable`, with pip's reason."""
    if wheels is not None:
        if not Path(wheels).is_dir():
            raise UserError(f"{wheels}: not a directory of wheels")
        found = _named(Path(wheels), version)
        if not found:
            raise UserError(f"{wheels} holds no {PACKAGE} {version} wheel ({PACKAGE}-{version}-py3-none-any.whl)")
        return read_wheel(found[0], version)
    store = (root or cache_dir()) / "wheels"
    found = _named(store, version) if store.is_dir() else []
    if found:
        return read_wheel(found[0], version)
    store.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".download.", dir=store) as tmp:
        p = pip(["download", "-q", "-d", tmp, f"{PACKAGE}=={version}"], no_deps=True, only_binary=":all:")
        got = _named(Path(tmp), version)
        if p.returncode != 0 or not got:
            raise Unreachable(f"pip could not fetch {PACKAGE}=={version}: {_last_error(p)}")
        wheel = read_wheel(got[0], version)  # checked before it enters the cache
        target = store / got[0].name
        os.replace(got[0], target)
    return read_wheel(target, version)


def pins(wheel: Wheel) -> list[str]:
    """The wheel's requirements that apply here (extras left out, markers evaluated)."""
    from packaging.requirements import Requirement

    out = []
    for line in wheel.requires:
        r = Requirement(line)
        if r.marker is None or r.marker.evaluate({"extra": ""}):
            out.append(line.split(";")[0].strip())
    return out


def installed_version(name: str) -> Optional[str]:
    import importlib.metadata as md

    try:
        return md.version(name)
    except md.PackageNotFoundError:
        return None


def unsatisfied(requirements: Sequence[str], version_of: Callable[[str], Optional[str]] = installed_version) -> list[str]:
    """The requirements (as `pins` gives them) that what is installed does not meet, each with what
    is there ("kernels<0.20,>=0.19.1 (not installed)")."""
    from packaging.requirements import Requirement

    out = []
    for line in requirements:
        r = Requirement(line)
        have = version_of(r.name)
        if have is None:
            out.append(f"{line} (not installed)")
        elif not r.specifier.contains(have, prereleases=True):
            out.append(f"{line} ({have} installed)")
    return out


@dataclass
class Env:
    """The Python that runs transformers `version`; `made_s`: seconds spent making it now (None:
    it was ready, or is smearcli's own)."""
    version: str
    python: Path
    made_s: Optional[float] = None
    own: bool = False  # smearcli's own Python (its transformers is this release)


def base_key() -> str:
    """What a venv is made over (smearcli's Python, its environment), as a short stable key."""
    text = f"{os.path.realpath(sys.executable)}|{sys.prefix}|{sys.version}"
    return f"py{sys.version_info[0]}{sys.version_info[1]}-{hashlib.sha256(text.encode()).hexdigest()[:8]}"


def environment(version: str, wheels: Optional[Path] = None, root: Optional[Path] = None,
                say: Callable[[str], None] = lambda s: None) -> Env:
    """The Python of transformers `version`: smearcli's own when its transformers is that release,
    else the release's venv under the cache (`envs/<version>-<base_key>`), made now if it is not
    there (`say` tells what is being done)."""
    if _same(installed_version(PACKAGE) or "", version):
        return Env(version, Path(sys.executable), own=True)
    root = root or cache_dir()
    final = root / "envs" / f"{version}-{base_key()}"
    python = final / "bin" / "python"
    if (final / READY).is_file():
        return Env(version, python)
    wheel = fetch(version, wheels, root)
    spec = wheel.requires_python
    if spec:
        from packaging.specifiers import SpecifierSet

        here = ".".join(map(str, sys.version_info[:3]))
        if not SpecifierSet(spec).contains(here, prereleases=True):
            raise UserError(f"{PACKAGE} {version} requires Python {spec}; smearcli's Python is {here}")
    say(f"{PACKAGE} {version}: making its environment in {final}")
    t0 = time.monotonic()
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.", suffix=".tmp", dir=final.parent))
    try:
        _make(tmp, wheel, wheels)
        (tmp / READY).write_text(json.dumps({"version": version, "wheel": str(wheel.path),
                                             "base_python": sys.executable, "base_prefix": sys.prefix}) + "\n")
        os.chmod(tmp, 0o755)  # mkdtemp's 0700: the venv is as readable as the cache around it
        try:
            os.rename(tmp, final)
        except OSError:  # made meanwhile by another scan: theirs is as good
            if not (final / READY).is_file():
                raise
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return Env(version, python, made_s=round(time.monotonic() - t0, 1))


def _run(cmd: list, what: str) -> subprocess.CompletedProcess:
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=PIP_TIMEOUT)
    if p.returncode != 0:
        raise UserError(f"{what} failed: {_last_error(p)}")
    return p


def _make(venv: Path, wheel: Wheel, wheels: Optional[Path]) -> None:
    """A venv at `venv` over smearcli's Python with `wheel` installed and its unmet requirements."""
    import venv as venv_module

    venv_module.EnvBuilder(system_site_packages=True, with_pip=False, symlinks=os.name != "nt").create(venv)
    python = str(venv / "bin" / "python")
    purelib = _run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                   "reading the new environment's site-packages").stdout.strip()
    if sys.prefix != sys.base_prefix:  # smearcli runs in a venv itself: a venv made over it sees the
        # base interpreter's site-packages only, so its own site-packages are added by a .pth
        dirs = [d for d in site.getsitepackages() if os.path.isdir(d)]
        Path(purelib, "zz_smearcli_base.pth").write_text(
            "".join(f"import site; site.addsitedir({d!r})\n" for d in dirs))
    local = {"no_index": True, "find_links": str(wheels)} if wheels is not None else {}
    p = pip(["install", "-q", str(wheel.path)], python, no_deps=True, **local)
    if p.returncode != 0:
        raise UserError(f"installing {wheel.path.name} into {venv} failed: {_last_error(p)}")
    missing = unsatisfied(pins(wheel))
    if missing:
        wanted = [m.rsplit(" (", 1)[0] for m in missing]
        p = pip(["install", "-q", *wanted], python, **local)
        if p.returncode != 0:
            raise Unreachable(f"{PACKAGE} {wheel.version} needs {', '.join(missing)}, which smearcli's Python "
                              f"lacks, and pip could not install {'it' if len(wanted) == 1 else 'them'} into its "
                              f"environment: {_last_error(p)}")
    seen = _run([python, "-c", "import importlib.metadata as m; print(m.version('transformers'))"],
                "checking the new environment").stdout.strip()
    if not _same(seen, wheel.version):
        raise UserError(f"the environment made for {PACKAGE} {wheel.version} imports {seen} instead")


def listed(wheels: Optional[Path] = None) -> list[str]:
    """Every 5.x release, oldest first: the wheel directory's when one is named (nothing is asked of
    the index then), else the package index's (`pip index versions`), which raises `Unreachable`
    when it cannot answer."""
    if wheels is not None:
        if not Path(wheels).is_dir():
            raise UserError(f"{wheels}: not a directory of wheels")
        found = [m[2] for m in map(WHEEL_NAME.match, (p.name for p in Path(wheels).glob("*.whl")))
                 if m and m[1].lower().replace("_", "-") == PACKAGE]
    else:
        p = pip(["index", "versions", PACKAGE])
        line = next((ln for ln in p.stdout.splitlines() if ln.startswith("Available versions:")), None)
        if p.returncode != 0 or line is None:
            raise Unreachable(f"pip could not list {PACKAGE}'s releases: {_last_error(p)}")
        found = [v.strip() for v in line.partition(":")[2].split(",")]
    out = {}
    for v in found:
        parsed = _version(v)
        if parsed is not None and parsed.major == MAJOR and not (parsed.is_prerelease or parsed.is_devrelease):
            out.setdefault(parsed, v)
    return [out[k] for k in sorted(out)]


def pick(versions: Sequence[str], span: Optional[str]) -> list[str]:
    """The releases of `versions` (oldest first) within `span`, "A..B" (either end may be left out:
    "5.20.0..", "..5.24.0"; None: all), both ends included; an end that is not among them is refused."""
    if span is None:
        chosen = list(versions)
    else:
        lo, sep, hi = span.partition("..")
        if not sep:
            raise UserError(f"{span!r} is not a range of releases (like 5.20.0..5.25.0)")
        idx = []
        for end, default in ((lo, 0), (hi, len(versions) - 1)):
            if not end.strip():
                idx.append(default)
                continue
            v = release(end)
            at = [i for i, x in enumerate(versions) if _same(x, v)]
            if not at:
                raise UserError(f"{PACKAGE} {v} is not a release here ({', '.join(versions[-6:]) or 'none'} are the "
                                "newest listed)")
            idx.append(at[0])
        if idx[0] > idx[1]:
            raise UserError(f"{span}: the first release comes after the last")
        chosen = list(versions[idx[0]:idx[1] + 1])
    if len(chosen) < 2:
        raise UserError(f"a search needs two releases at least; {', '.join(chosen) or 'none'} listed")
    return chosen


def command(python: Path, args: Sequence[str]) -> list[str]:
    """smearcli `args` run by `python` (a release's)."""
    return [str(python), *PROGRAM, *args]


def child_environ() -> dict:
    """The environment of smearcli run in a release's Python: this smearcli's source directory first
    on PYTHONPATH when it is a checkout (not a site-packages directory, which would bring this
    Python's transformers before the release's)."""
    import smearcli

    env = dict(os.environ)
    top = os.path.dirname(os.path.dirname(os.path.abspath(smearcli.__file__)))
    sites = {os.path.realpath(d) for d in site.getsitepackages() + [site.getusersitepackages()]}
    if os.path.realpath(top) not in sites:
        env["PYTHONPATH"] = os.pathsep.join([top] + [p for p in [env.get("PYTHONPATH", "")] if p])
    return env


def rerun(env: Env, args: Sequence[str]) -> int:
    """smearcli `args` in the release's Python, its output passed through: its exit status."""
    return subprocess.run(command(env.python, args), env=child_environ()).returncode


@dataclass
class Probe:
    """One architecture on one release: its verdict (None: the release does not have it), whether
    that is a finding, the record file, the seconds it took (0 when read from an earlier search)."""
    version: str
    verdict: Optional[str]
    finding: bool
    record: Optional[Path] = None
    seconds: float = 0.0
    reused: bool = False


def record_path(version: str, model_type: str, root: Optional[Path] = None) -> Path:
    return (root or cache_dir()) / "records" / version / f"{model_type}.jsonl"


def _recorded(path: Path, model_type: str):
    from . import records

    if not path.is_file():
        return None
    try:
        return next((r for r in records.merge([path]) if r.model_type == model_type), None)
    except UserError:  # a torn file from a stopped probe: probed again
        return None


def probe(env: Env, model_type: str, args: Callable[[Path, Path], list], failing: Sequence[str],
          root: Optional[Path] = None) -> Probe:
    """`model_type` checked on `env`'s release: smearcli `args(record_file, repro_dir)` run there (a
    census of that one architecture into `records/<version>/<model_type>.jsonl` under the cache; a
    record already there is read instead), its verdict a finding when it is one of `failing`. A
    release whose transformers does not register the architecture is a `Probe` with no verdict."""
    out = record_path(env.version, model_type, root)
    rec = _recorded(out, model_type)
    if rec is not None:
        return Probe(env.version, rec.verdict, rec.verdict in failing, out, reused=True)
    out.parent.mkdir(parents=True, exist_ok=True)
    if out.exists():
        out.unlink()
    t0 = time.monotonic()
    p = subprocess.run(command(env.python, args(out, out.parent / "repro")), capture_output=True, text=True,
                       env=child_environ())
    took = round(time.monotonic() - t0, 1)
    rec = _recorded(out, model_type)
    if rec is not None:
        return Probe(env.version, rec.verdict, rec.verdict in failing, out, took)
    there = subprocess.run([str(env.python), "-c", IN_MAPPING, model_type], capture_output=True, text=True,
                           env=child_environ())
    if there.returncode == 3:
        return Probe(env.version, None, False, None, took)
    raise UserError(f"the census of {model_type} on {PACKAGE} {env.version} made no record "
                    f"(exit status {p.returncode}): {_last_error(p)}")


def word(p: Probe) -> str:
    """A probe's verdict as the search says it."""
    if p.verdict is None:
        return "not in this release"
    return f"{p.verdict} (a finding)" if p.finding else p.verdict


@dataclass
class Bisection:
    """What a search found: every probe, by release; `appeared` the first release with the finding
    (None: not within the range; the first release when it was already there), `gone` the first
    after it without (None: still there at the last release), and the one-line answer."""
    versions: list
    probes: dict
    appeared: Optional[str] = None
    gone: Optional[str] = None
    answer: str = ""


def bisect(versions: Sequence[str], check: Callable[[str], Probe], model_type: str,
           say: Callable[[str], None] = lambda s: None) -> Bisection:
    """The first release of `versions` (oldest first) where `model_type` has a finding and the first
    after it where it is gone, probing (`check(version) -> Probe`) both ends and then halving, as
    `git bisect` does: the search assumes one change between two releases that differ (a finding
    that comes and goes between two probes is not seen). A release without the architecture counts
    as without the finding; both ends without it is refused."""
    versions = list(versions)
    probes: dict = {}

    def at(i: int) -> Probe:
        v = versions[i]
        if v not in probes:
            p = probes[v] = check(v)
            steps = _steps_left(versions, probes)
            more = f"; about {steps} more to probe" if steps else ""
            said = f", {p.seconds:.0f} s" if not p.reused else ", read from an earlier search"
            say(f"bisect {model_type}: {PACKAGE} {v}: {word(p)}{said}{more}")
        return probes[v]

    first, last = at(0), at(len(versions) - 1)
    if first.verdict is None and last.verdict is None:
        raise UserError(f"{model_type} is registered neither in {PACKAGE} {versions[0]} nor in {versions[-1]}: "
                        "nothing to search between them")
    out = Bisection(versions, probes)
    if first.finding == last.finding:
        where = f"from {versions[0]} to {versions[-1]}"
        if first.finding:
            out.appeared = versions[0]
            out.answer = (f"{model_type}: a finding on every release probed {where} ({first.verdict} on "
                          f"{versions[0]}, {last.verdict} on {versions[-1]}): it appeared at {versions[0]} or before")
        else:
            out.answer = (f"{model_type}: no finding at either end {where} ({word(first)}, {word(last)}); one that "
                          "came and went in between would not show: narrow the range")
        return out
    lo, hi = 0, len(versions) - 1  # at(lo).finding != at(hi).finding, kept so while halving
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if at(mid).finding == last.finding:
            hi = mid
        else:
            lo = mid
    changed = versions[hi]
    if last.finding:
        out.appeared = changed
        out.answer = (f"{model_type}: the finding appears in {PACKAGE} {changed} ({probes[changed].verdict}; "
                      f"{versions[lo]}: {word(probes[versions[lo]])}) and is still there in {versions[-1]}")
    else:
        out.appeared, out.gone = versions[0], changed
        out.answer = (f"{model_type}: a finding from {versions[0]} on ({first.verdict}; it appeared there or "
                      f"before), gone in {PACKAGE} {changed} ({word(probes[changed])}; {versions[lo]}: "
                      f"{probes[versions[lo]].verdict})")
    return out


def _steps_left(versions: list, probes: dict) -> int:
    """About how many probes the search still needs: log2 of the releases between the nearest
    probed pair that differ (0 before both ends are known or once they are adjacent)."""
    done = [i for i, v in enumerate(versions) if v in probes]
    if 0 not in done or len(versions) - 1 not in done:
        return 1 if len(done) == 1 else 0
    flips = [(a, b) for a, b in zip(done, done[1:]) if probes[versions[a]].finding != probes[versions[b]].finding]
    if not flips:
        return 0
    gap = flips[0][1] - flips[0][0]
    return max(0, (gap - 1).bit_length())


def lines(b: Bisection) -> list[str]:
    """The search as printed: each release probed, oldest first, with its verdict and record, then
    the answer."""
    out = []
    for v in b.versions:
        p = b.probes.get(v)
        if p is not None:
            mark = " <- appears" if v == b.appeared and v != b.versions[0] else " <- gone" if v == b.gone else ""
            out.append(f"{PACKAGE} {v:<8} {word(p)}{mark}" + (f"  ({p.record})" if p.record else ""))
    return out + [b.answer]
