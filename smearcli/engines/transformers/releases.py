"""Other transformers releases for the census: where they are kept, how one is made ready, and the
search for the release a finding appears in.

A release is one transformers wheel, kept in a cache directory (`cache_dir`: `$SMEARCLI_RELEASES`, or
~/.cache/smearcli/releases): `fetch` takes it from a directory of wheels the user names, from the
cache, or from the package index with pip (`pip download --no-deps`), and `read_wheel` checks that
the file is a wheel of transformers at that version, whole (anything else is one `UserError`; a
wheel in the cache that fails is removed and fetched again, never used).
`environment` makes the Python that runs it: a venv per release (and per base Python) with
`--system-site-packages` over smearcli's own Python, so torch and smearcli are the ones already
installed, and the wheel installed in it with `--no-deps`; each of the wheel's requirements (its
`Requires-Dist` without extras) is checked against what is installed, and those not met are
installed into that venv (from the same wheel directory where one was named), or the release is
refused with the list. A venv is made in a temporary directory beside its place and renamed into it
once complete, its READY file written last, so a half-made one is never used: one found in its place
without a READY that names its release is removed and made anew. A cache directory that is
read-only, full or not a directory is one `UserError` naming it, and nothing half-made is left in
it. The release smearcli's own Python has installed needs no venv: its Python is used.

`listed` gives the 5.x releases (the index's, by `pip index versions`, or the wheel directory's), and
`pick` a range of them ("5.20.0..5.25.0"). `command` is smearcli's own program in a release's Python
(the census runs there exactly as it runs here: nothing of its loop is copied). `bisect` finds,
among releases in order, the first where a finding appears and the first after it where it is gone,
by binary search over `probe`s as `git bisect` does over commits, saying each probe's verdict as it
goes; `probe` runs one architecture on one release into a record file under the cache (kept, so a
second search reuses it) and reads its verdict, and says when the architecture does not exist in
that release. A range the architecture is missing from at one end (added in a later release, or
removed) is searched over the releases of it that have the architecture, and the answer says so.
"""

from __future__ import annotations

import contextlib
import errno
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
import zlib
from dataclasses import dataclass, field
from email.parser import Parser
from pathlib import Path
from typing import Callable, Optional, Sequence

from ...util.errors import UserError

ENV_VAR = "SMEARCLI_RELEASES"
PACKAGE = "transformers"
MAJOR = 5  # the releases listed and searched: 5.x (the hf extra's range)
PROGRAM = ("-m", "smearcli")  # smearcli in a release's Python, after the interpreter
READY = "smearcli-release.json"  # written last inside a venv being made: what it holds
NEEDS = "from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES"  # a census's first import
PIP_TIMEOUT = 600  # seconds for one pip call (a download, an install)
METADATA_CAP = 1 << 20  # bytes of a wheel's METADATA read (transformers' is 50 KiB): a zip bomb stops here
STOP_S = 10  # seconds a release's smearcli has to stop its workers once told to (SIGTERM), then killed
STALE_S = 6 * 3600  # a temporary directory under the cache this old is a killed run's (a venv takes minutes)
WHEEL_NAME = re.compile(r"^([A-Za-z0-9_.]+)-([^-]+)-.+\.whl$")
IN_MAPPING = ("import sys\nfrom transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES as m\n"
              "sys.exit(0 if sys.argv[1] in m else 3)")


class Unreachable(UserError):
    """The package index could not give what was asked (offline, or no such release there)."""


def cache_dir() -> Path:
    """Where releases are kept: `$SMEARCLI_RELEASES`, else ~/.cache/smearcli/releases."""
    given = os.environ.get(ENV_VAR, "").strip()
    return Path(given).expanduser() if given else Path.home() / ".cache" / "smearcli" / "releases"


FULL = {errno.ENOSPC, errno.EDQUOT, errno.EFBIG}
READ_ONLY = {errno.EACCES, errno.EPERM, errno.EROFS}
NOT_A_DIRECTORY = {errno.ENOTDIR, errno.EEXIST}


def _cache_words(root: Path, code: Optional[int], doing: str, why: str) -> Optional[str]:
    """The one line for the cache refusing a write (`code`, an errno), None for any other failure."""
    if code in FULL:
        return (f"the release cache {root} is full ({why}) while {doing}: free space there or point ${ENV_VAR} at "
                "another directory (nothing half-made was kept)")
    if code in READ_ONLY:
        return (f"the release cache {root} is not writable ({why}) while {doing}: point ${ENV_VAR} at a writable "
                "directory")
    if code in NOT_A_DIRECTORY:
        return f"the release cache {root} is not a directory (a file is there): point ${ENV_VAR} at a directory"
    return None


@contextlib.contextmanager
def _writing(root: Path, doing: str):
    """What is written under the cache: the file system's refusal (read-only, full, over quota, a
    file where a directory goes) as one line naming the cache, not the temporary path it hit."""
    try:
        yield
    except OSError as e:
        said = _cache_words(root, e.errno, doing, e.strerror or str(e))
        if said is None:
            raise
        raise UserError(said) from None


def writable(root: Path, doing: str) -> Path:
    """The cache directory `root`, made if it is not there, refused in words before anything is
    downloaded or made when it is not a directory that can be written."""
    if os.path.islink(root) and not root.exists():  # a cache on a disk not mounted: no file is there
        raise UserError(f"the release cache {root} is a symlink to {os.readlink(root)!r}, which does not exist: "
                        f"mount what it points into, or point ${ENV_VAR} at a directory")
    with _writing(root, doing):
        root.mkdir(parents=True, exist_ok=True)
    if not root.is_dir():
        raise UserError(_cache_words(root, errno.ENOTDIR, doing, "a file is there"))
    if not os.access(root, os.W_OK | os.X_OK):  # as root, a read-only file system still says no
        raise UserError(_cache_words(root, errno.EROFS, doing, "no write access"))
    return root


def _pip_os_error(p: subprocess.CompletedProcess) -> Optional[tuple]:
    """(errno, path or None) of the OSError a failed pip call reports ("[Errno 28] No space left on
    device: '/path'"), None when it reports none: a disk that is full is not a network that is missing."""
    m = re.search(r"\[Errno (\d+)\][^:\n]*(?::\s*'([^'\n]+)')?", (p.stderr or "") + (p.stdout or ""))
    return (int(m[1]), m[2]) if m else None


def _pip_words(root: Path, failed: Optional[tuple], doing: str) -> Optional[str]:
    """The one line for pip's OSError: the cache's words when it hit the cache (or says no path),
    else the path it hit (a full $TMPDIR is not a full cache); None when it is not the file system's."""
    if failed is None:
        return None
    code, where = failed
    if where is None or _under(Path(where), root):
        return _cache_words(root, code, doing, os.strerror(code))
    if code in FULL | READ_ONLY:
        return f"pip failed while {doing}: {where}: {os.strerror(code)}"
    return None


def _under(path: Path, root: Path) -> bool:
    with contextlib.suppress(OSError, ValueError):
        return os.path.realpath(path).startswith(os.path.realpath(root) + os.sep)
    return False


def _sweep(directory: Path, pattern: str) -> None:
    """Temporary directories a killed run left under the cache (SIGKILL: no `finally` ran), once
    they are older than any run still making one could be."""
    now = time.time()
    for p in directory.glob(pattern):
        with contextlib.suppress(OSError):
            if p.is_dir() and not p.is_symlink() and now - p.lstat().st_mtime > STALE_S:
                shutil.rmtree(p, ignore_errors=True)


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
    metadata, not its name: a file that is not a wheel, one cut short or damaged (a member that
    fails its CRC-32), a wheel of another package or release, or one whose metadata says
    transformers over another package's files, is refused before any venv is made."""
    path = Path(path)
    try:
        with zipfile.ZipFile(path) as z:
            infos = z.infolist()
            metas = [i for i in infos if i.filename.count("/") == 1 and i.filename.endswith(".dist-info/METADATA")]
            if len(metas) != 1:
                raise UserError(f"{path}: not a wheel ({'no' if not metas else len(metas)} .dist-info/METADATA in it)")
            if metas[0].file_size > METADATA_CAP:
                raise UserError(f"{path}: not a wheel (its METADATA is {metas[0].file_size:,} bytes; "
                                f"at most {METADATA_CAP:,} are read)")
            meta = Parser().parsestr(z.read(metas[0]).decode("utf-8", "replace"))
            bad = z.testzip()  # every member read once, nothing kept: a torn or corrupted wheel stops here
            if bad is not None:
                raise UserError(f"{path}: a damaged wheel ({bad} fails its CRC-32 check): fetch it again")
            names = {i.filename for i in infos}
    except zipfile.BadZipFile as e:
        if "not a zip file" in str(e):  # no zip index at its end: another kind of file, or cut short
            raise UserError(f"{path}: not a wheel (not a zip file, or one cut short)") from None
        raise UserError(f"{path}: a damaged wheel ({e}): fetch it again") from None
    except (zlib.error, EOFError, NotImplementedError, RuntimeError, ValueError) as e:
        # a member that does not inflate, is encrypted or compressed in a way zipfile lacks
        raise UserError(f"{path}: a damaged wheel ({type(e).__name__}: {e}): fetch it again") from None
    except OSError as e:
        raise UserError(f"{path}: cannot read it ({e.strerror or e})") from None
    name, version = (meta.get("Name") or "").strip(), (meta.get("Version") or "").strip()
    if name.lower().replace("_", "-") != PACKAGE:
        raise UserError(f"{path}: a wheel of {name or 'an unnamed package'} {version}, not of {PACKAGE}")
    if want is not None and not _same(version, want):
        raise UserError(f"{path}: a wheel of {PACKAGE} {version}, not of {want}")
    # what pip installs is named by the .dist-info directory and holds the package's files: both
    # must be transformers', or the venv would import the transformers it is made over, not this one
    info = metas[0].filename.split("/")[0].removesuffix(".dist-info")
    info_name, _, info_version = info.partition("-")
    if info_name.lower().replace("_", "-").replace(".", "-") != PACKAGE or not _same(info_version, version):
        raise UserError(f"{path}: its metadata says {PACKAGE} {version} but its files are {info}'s: not a "
                        f"{PACKAGE} wheel")
    if f"{PACKAGE}/__init__.py" not in names:
        raise UserError(f"{path}: a wheel that says it is {PACKAGE} {version} and holds no {PACKAGE} package "
                        f"({PACKAGE}/__init__.py): not a {PACKAGE} wheel")
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
    try:  # run() kills pip on the way out: on its time limit, a Ctrl-C or a SIGTERM alike
        return subprocess.run([python or sys.executable, "-m", "pip", *args], capture_output=True, text=True,
                              timeout=PIP_TIMEOUT, env=env)
    except subprocess.TimeoutExpired:
        raise Unreachable(f"pip {args[0]} did not finish within {PIP_TIMEOUT} s (stopped)") from None


def _last_error(p: subprocess.CompletedProcess) -> str:
    lines = [ln.strip() for ln in (p.stderr or "").splitlines() + (p.stdout or "").splitlines() if ln.strip()]
    errors = [ln for ln in lines if ln.startswith("ERROR")]
    return (errors or lines or [f"exit status {p.returncode}"])[0 if errors else -1]


def fetch(version: str, wheels: Optional[Path] = None, root: Optional[Path] = None,
          say: Callable[[str], None] = lambda s: None) -> Wheel:
    """transformers `version`'s wheel, checked (`read_wheel`): from `wheels` (a directory the user
    names: nothing is downloaded then, and a bad wheel there is refused), else from the cache's
    wheels/ (one that fails its check, a torn download, is removed and fetched again), else
    downloaded there by pip. A download that fails raises `Unreachable`, with pip's reason; a cache
    that cannot hold it, a `UserError` naming the cache."""
    if wheels is not None:
        if not Path(wheels).is_dir():
            raise UserError(f"{wheels}: not a directory of wheels")
        found = _named(Path(wheels), version)
        if not found:
            raise UserError(f"{wheels} holds no {PACKAGE} {version} wheel ({PACKAGE}-{version}-py3-none-any.whl)")
        return read_wheel(found[0], version)
    root = root or cache_dir()
    store = root / "wheels"
    for cached in _named(store, version) if store.is_dir() else []:
        try:
            return read_wheel(cached, version)
        except UserError as e:  # the cache is ours: what fails its check there is never used
            say(f"{PACKAGE} {version}: the wheel in the cache is not usable ({e}); removed, fetching it again")
            with _writing(root, f"removing {cached.name}"):
                cached.unlink()
    doing = f"downloading {PACKAGE} {version}'s wheel"
    writable(root, doing)
    with _writing(root, doing):
        store.mkdir(parents=True, exist_ok=True)
        _sweep(store, ".download.*")
        with tempfile.TemporaryDirectory(prefix=".download.", dir=store) as tmp:
            p = pip(["download", "-q", "-d", tmp, f"{PACKAGE}=={version}"], no_deps=True, only_binary=":all:")
            got = _named(Path(tmp), version)
            if p.returncode != 0 or not got:
                said = _pip_words(root, _pip_os_error(p), doing)
                if said is not None:
                    raise UserError(said)
                raise Unreachable(f"pip could not fetch {PACKAGE}=={version}: {_last_error(p)}")
            read_wheel(got[0], version)  # checked before it enters the cache
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


def _ready(final: Path, version: str) -> bool:
    """Whether the venv at `final` was made whole: its READY file (written last, before the rename
    that puts it there) names `version`, and its Python is there."""
    try:
        said = json.loads((final / READY).read_text())
    except (OSError, ValueError):
        return False
    return isinstance(said, dict) and said.get("version") == version and (final / "bin" / "python").exists()


def _remove(path: Path) -> None:
    """A directory under the cache removed: renamed aside first, so that a removal cut short leaves
    nothing at `path` that a later run would look at."""
    aside = Path(tempfile.mkdtemp(prefix=f".{path.name}.", suffix=".torn", dir=path.parent))
    os.rename(path, aside / path.name)
    shutil.rmtree(aside, ignore_errors=True)


def environment(version: str, wheels: Optional[Path] = None, root: Optional[Path] = None,
                say: Callable[[str], None] = lambda s: None) -> Env:
    """The Python of transformers `version`: smearcli's own when its transformers is that release,
    else the release's venv under the cache (`envs/<version>-<base_key>`), made now if it is not
    there whole (`say` tells what is being done). A venv in its place that is not whole (no READY
    naming the release: one a file system lost part of, or copied in) is removed and made anew."""
    if _same(installed_version(PACKAGE) or "", version):
        return Env(version, Path(sys.executable), own=True)
    root = root or cache_dir()
    final = root / "envs" / f"{version}-{base_key()}"
    python = final / "bin" / "python"
    if _ready(final, version):
        return Env(version, python)
    doing = f"making {PACKAGE} {version}'s environment"
    wheel = fetch(version, wheels, root, say)  # a bad wheel is refused before anything is made
    writable(root, doing)
    spec = wheel.requires_python
    if spec:
        from packaging.specifiers import SpecifierSet

        here = ".".join(map(str, sys.version_info[:3]))
        if not SpecifierSet(spec).contains(here, prereleases=True):
            raise UserError(f"{PACKAGE} {version} requires Python {spec}; smearcli's Python is {here}")
    say(f"{PACKAGE} {version}: making its environment in {final}")
    t0 = time.monotonic()
    with _writing(root, doing):
        final.parent.mkdir(parents=True, exist_ok=True)
        _sweep(final.parent, ".*.t*")  # .tmp (being made) and .torn (being removed) of killed runs
        if final.exists() and not _ready(final, version):
            say(f"{PACKAGE} {version}: {final} is a half-made environment (no {READY}): removed, made anew")
            _remove(final)
        tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.", suffix=".tmp", dir=final.parent))
        try:
            try:
                _make(tmp, wheel, wheels)
            except PipFailed as e:  # pip's own words for a full or read-only cache: said as the cache's
                said = _pip_words(root, e.failed, doing)
                if said is None:
                    raise
                raise UserError(said) from None
            (tmp / READY).write_text(json.dumps({"version": version, "wheel": str(wheel.path),
                                                 "base_python": sys.executable, "base_prefix": sys.prefix}) + "\n")
            os.chmod(tmp, 0o755)  # mkdtemp's 0700: the venv is as readable as the cache around it
            try:
                os.rename(tmp, final)
            except OSError:  # made meanwhile by another scan: theirs is as good
                if not _ready(final, version):
                    raise
        finally:
            if tmp.exists():
                shutil.rmtree(tmp, ignore_errors=True)
    return Env(version, python, made_s=round(time.monotonic() - t0, 1))


class PipFailed(UserError):
    """pip, or the new venv's Python, failed while a venv was made; `failed` is the OSError it
    reports, if any (`_pip_os_error`: a full disk is the cache's failure, not the release's)."""

    def __init__(self, message: str, p: Optional[subprocess.CompletedProcess] = None):
        super().__init__(message)
        self.failed = _pip_os_error(p) if p is not None else None


def _run(cmd: list, what: str) -> subprocess.CompletedProcess:
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=PIP_TIMEOUT)
    except subprocess.TimeoutExpired:
        raise UserError(f"{what} did not finish within {PIP_TIMEOUT} s (stopped)") from None
    if p.returncode != 0:
        raise PipFailed(f"{what} failed: {_last_error(p)}", p)
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
        raise PipFailed(f"installing {wheel.path.name} into a new environment failed: {_last_error(p)}", p)
    missing = unsatisfied(pins(wheel))
    if missing:
        wanted = [m.rsplit(" (", 1)[0] for m in missing]
        p = pip(["install", "-q", *wanted], python, **local)
        if p.returncode != 0 and _pip_os_error(p) is not None:
            raise PipFailed(f"installing {', '.join(wanted)} failed: {_last_error(p)}", p)
        if p.returncode != 0:
            raise Unreachable(f"{PACKAGE} {wheel.version} needs {', '.join(missing)}, which smearcli's Python "
                              f"lacks, and pip could not install {'it' if len(wanted) == 1 else 'them'} into its "
                              f"environment: {_last_error(p)}")
    seen = _run([python, "-c", "import importlib.metadata as m; print(m.version('transformers'))"],
                "checking the new environment").stdout.strip()
    if not _same(seen, wheel.version):
        raise UserError(f"the environment made for {PACKAGE} {wheel.version} imports {seen} instead")
    # a wheel that says transformers and holds a `transformers/` package may still not be one: what the
    # census imports first is checked here, before READY, so such a venv is never kept or run
    p = subprocess.run([python, "-c", NEEDS], capture_output=True, text=True, timeout=PIP_TIMEOUT)
    if p.returncode != 0:
        raise UserError(f"{wheel.path}: its {PACKAGE} {wheel.version} does not import what a census needs "
                        f"({_last_error(p)}): not a working {PACKAGE} wheel")


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


def _child(cmd: list, capture: bool = False) -> subprocess.CompletedProcess:
    """`cmd` (smearcli, or a Python, of a release) run to its end. A run stopped here (Ctrl-C,
    SIGTERM, an error) stops it with SIGTERM first, so that it stops its own census workers and
    removes its temporary files as any stopped smearcli does (subprocess.run's SIGKILL would leave
    its workers running), and kills it if it has not ended within STOP_S."""
    pipe = subprocess.PIPE if capture else None
    with subprocess.Popen(cmd, stdout=pipe, stderr=pipe, text=True, env=child_environ()) as proc:
        try:
            out, err = proc.communicate()
        except BaseException:
            with contextlib.suppress(OSError):
                proc.terminate()
            try:
                proc.communicate(timeout=STOP_S)
            except BaseException:  # past its time, or a second Ctrl-C: no more waiting
                proc.kill()
                proc.wait()
            raise
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


def rerun(env: Env, args: Sequence[str]) -> int:
    """smearcli `args` in the release's Python, its output passed through: its exit status."""
    return _child(command(env.python, args)).returncode


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
    from ...census import records

    if not path.is_file():
        return None
    try:
        return next((r for r in records.merge([path]) if r.model_type == model_type), None)
    except UserError:  # a torn file from a stopped probe: probed again
        return None


def on_path(rec, pattern: Optional[str]) -> bool:
    """Whether one of the record's findings (`known.findings`: its headline and every boundary that
    failed beside it) lies on a path matching the glob `pattern` ("rollback*", "generate: static
    cache", "chunks of *"); True without a pattern."""
    import fnmatch

    from ...census.known import findings

    return pattern is None or any(fnmatch.fnmatchcase(p.path, pattern) for p in findings(rec))


def probe(env: Env, model_type: str, args: Callable[[Path, Path], list], failing: Sequence[str],
          root: Optional[Path] = None, path: Optional[str] = None) -> Probe:
    """`model_type` checked on `env`'s release: smearcli `args(record_file, repro_dir)` run there (a
    census of that one architecture into `records/<version>/<model_type>.jsonl` under the cache; a
    record already there is read instead), its verdict a finding when it is one of `failing` and,
    with `path` (a glob), when one of its findings lies on a matching path (`on_path`): a search
    that follows one finding, not whichever the release has. A release whose transformers does not
    register the architecture is a `Probe` with no verdict."""
    root = root or cache_dir()
    out = record_path(env.version, model_type, root)
    rec = _recorded(out, model_type)
    if rec is not None:
        return Probe(env.version, rec.verdict, rec.verdict in failing and on_path(rec, path), out, reused=True)
    doing = f"writing {model_type}'s record on {PACKAGE} {env.version}"
    writable(root, doing)
    with _writing(root, doing):
        out.parent.mkdir(parents=True, exist_ok=True)
        if out.exists():
            out.unlink()
    t0 = time.monotonic()
    p = _child(command(env.python, args(out, out.parent / "repro")), capture=True)
    took = round(time.monotonic() - t0, 1)
    rec = _recorded(out, model_type)
    if rec is not None:
        return Probe(env.version, rec.verdict, rec.verdict in failing and on_path(rec, path), out, took)
    there = _child([str(env.python), "-c", IN_MAPPING, model_type], capture=True)
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
    after it without (None: still there at the last release), `first_with` and `last_with` the
    releases the search spanned when the architecture is missing at an end of the range (None:
    it is there), and the one-line answer."""
    versions: list
    probes: dict
    appeared: Optional[str] = None
    gone: Optional[str] = None
    answer: str = ""
    first_with: Optional[str] = None
    last_with: Optional[str] = None


def _halve(key: Callable[[int], object], lo: int, hi: int) -> int:
    """The first index after `lo`, up to `hi`, whose `key` is `hi`'s, by halving (key(lo) differs
    from key(hi); the search assumes one change between them, as `git bisect` does)."""
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if key(mid) == key(hi):
            hi = mid
        else:
            lo = mid
    return hi


def bisect(versions: Sequence[str], check: Callable[[str], Probe], model_type: str,
           say: Callable[[str], None] = lambda s: None) -> Bisection:
    """The first release of `versions` (oldest first) where `model_type` has a finding and the first
    after it where it is gone, probing (`check(version) -> Probe`) both ends and then halving, as
    `git bisect` does: the search assumes one change between two releases that differ (a finding
    that comes and goes between two probes is not seen). An end of the range whose release does
    not have the architecture (it was added later, or removed) is not a release without the
    finding: the releases that have it are found first, by the same halving, and the search is
    over them, the answer saying so. Both ends without it is refused."""
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

    n = len(versions)
    first, last = at(0), at(n - 1)
    if first.verdict is None and last.verdict is None:
        raise UserError(f"{model_type} is registered neither in {PACKAGE} {versions[0]} nor in {versions[-1]}: "
                        "nothing to search between them")
    out = Bisection(versions, probes)
    lo, hi, notes = 0, n - 1, []

    def there(i: int) -> bool:
        return at(i).verdict is not None

    if not there(0):  # added within the range: a finding it has came with it, not "appeared" there
        say(f"bisect {model_type}: {model_type} is not in {PACKAGE} {versions[0]}; looking for the first "
            "release of the range that has it")
        lo = _halve(there, 0, n - 1)
        out.first_with = versions[lo]
        notes.append(f"{model_type} is not in {PACKAGE} {versions[0]}: the search started at {versions[lo]}, "
                     "the first release of the range that has it")
    if not there(n - 1):  # removed within the range: its finding is not "gone" where the architecture is
        say(f"bisect {model_type}: {model_type} is not in {PACKAGE} {versions[-1]}; looking for the last "
            "release of the range that has it")
        hi = _halve(lambda i: not there(i), 0, n - 1) - 1
        out.last_with = versions[hi]
        notes.append(f"{model_type} is not in {PACKAGE} {versions[-1]}: the search ended at {versions[hi]}, "
                     "the last release of the range that has it")
    tail = "".join(f"; {note}" for note in notes)
    a, b = versions[lo], versions[hi]
    start, end = at(lo), at(hi)
    since = "it came with the architecture" if lo > 0 else "it appeared there or before"
    if lo == hi:
        out.appeared = a if start.finding else None
        out.answer = (f"{model_type}: {word(start)} on {PACKAGE} {a}, the one release of the range that has "
                      f"it{tail}")
        return out
    if start.finding == end.finding:
        if start.finding:
            out.appeared = a
            out.answer = (f"{model_type}: a finding on every release probed from {a} to {b} ({start.verdict} on "
                          f"{a}, {end.verdict} on {b}): "
                          + ("it came with the architecture" if lo > 0 else f"it appeared at {a} or before") + tail)
        else:
            out.answer = (f"{model_type}: no finding at either end from {a} to {b} ({word(start)}, {word(end)}); one "
                          f"that came and went in between would not show: narrow the range{tail}")
        return out
    # key(lo) != key(hi), kept so while halving
    changed = versions[_halve(lambda i: at(i).finding, lo, hi)]
    before = versions[versions.index(changed) - 1]
    if end.finding:
        out.appeared = changed
        out.answer = (f"{model_type}: the finding appears in {PACKAGE} {changed} ({probes[changed].verdict}; "
                      f"{before}: {word(probes[before])}) and is still there in {b}{tail}")
    else:
        out.appeared, out.gone = a, changed
        out.answer = (f"{model_type}: a finding from {a} on ({start.verdict}; {since}), gone in {PACKAGE} "
                      f"{changed} ({word(probes[changed])}; {before}: {probes[before].verdict}){tail}")
    return out


def _steps_left(versions: list, probes: dict) -> int:
    """About how many probes the search still needs: log2 of the releases between each pair of
    nearest probes that differ, in the finding or in having the architecture (0 before both ends
    are known or once they are adjacent)."""
    done = [i for i, v in enumerate(versions) if v in probes]
    if 0 not in done or len(versions) - 1 not in done:
        return 1 if len(done) == 1 else 0

    def key(i: int):
        p = probes[versions[i]]
        return p.verdict is None, p.finding
    return sum((b - a - 1).bit_length() for a, b in zip(done, done[1:]) if key(a) != key(b))


def lines(b: Bisection) -> list[str]:
    """The search as printed: each release probed, oldest first, with its verdict and record, then
    the answer."""
    out = []
    for v in b.versions:
        p = b.probes.get(v)
        if p is not None:
            mark = (" <- appears" if v == b.appeared and v != b.versions[0] else " <- gone" if v == b.gone
                    else " <- the first with it" if v == b.first_with else "")
            mark += " <- the last with it" if v == b.last_with else ""
            out.append(f"{PACKAGE} {v:<8} {word(p)}{mark}" + (f"  ({p.record})" if p.record else ""))
    return out + [b.answer]
