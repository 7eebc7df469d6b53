"""`scan --release` and `--bisect` as a hostile user or a bad day would have them (issue 58): a wheel
that is a zip but not transformers, a release cache that is read-only, full or a file, a venv or a
download that a killed run left half-made, and a search over a range where the architecture is
missing at one end. Each is one line naming the problem (exit 2 through the CLI), nothing
half-made is left or used, and the search says in words where the architecture is.

No real venv is made here: where one would be, `_make` is a stand-in that makes its Python, or the
real one is stopped at its first step (`venv.EnvBuilder.create`) by the condition tested; the search
runs on a fake `check`. tests/census/test_scan_releases.py makes real ones."""

from __future__ import annotations

import errno
import json
import os
import re
import subprocess
import time
import zipfile
from pathlib import Path

import pytest

from smearcli.engines.transformers import releases
from smearcli.util.errors import UserError

import release_standin  # noqa: E402 - tests/ is on sys.path (conftest)
from hardening_util import invoke  # noqa: E402

V = "5.99.0"  # a release that does not exist: nothing here may reach the index for it
WHEEL = f"transformers-{V}-py3-none-any.whl"


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """A scratch release cache ($SMEARCLI_RELEASES), not made yet."""
    root = tmp_path / "cache"
    monkeypatch.setenv(releases.ENV_VAR, str(root))
    return root


@pytest.fixture
def good(tmp_path) -> Path:
    """A whole stand-in transformers 5.99.0 wheel, alone in a wheel directory."""
    d = tmp_path / "good"
    d.mkdir()
    return release_standin.wheel(d, V, "ok")


@pytest.fixture
def fake_make(monkeypatch):
    """`_make` standing in for venv and pip: the venv's Python is there, nothing installed."""
    made = []

    def make(venv: Path, wheel, wheels):
        (venv / "bin").mkdir(parents=True)
        (venv / "bin" / "python").write_text("#!/bin/sh\n")
        made.append(venv)
    monkeypatch.setattr(releases, "_make", make)
    return made


def rezip(src: Path, dst: Path, change) -> Path:
    """`src`'s members copied into `dst`, each (name, data) passed through `change` (None: left out)."""
    dst.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(src) as z, zipfile.ZipFile(dst, "w") as out:
        for name in z.namelist():
            kept = change(name, z.read(name))
            if kept is not None:
                out.writestr(*kept)
    return dst


def entries(d: Path) -> list[str]:
    return sorted(p.name for p in d.iterdir()) if d.is_dir() else []


# -- 1. a wheel that is a zip, and not transformers ------------------------------------------------------
def not_transformers(kind: str, good: Path, w: Path) -> Path:
    """A wheel named transformers-5.99.0 that is not it, as `kind` says."""
    target = w / WHEEL
    if kind == "another package, renamed":
        other = release_standin.wheel(w.parent, V, "ok", name="tokenizers")
        return other.rename(target)
    info = f"transformers-{V}.dist-info/"
    if kind == "metadata over another package's files":  # METADATA edited to say transformers, rest kept
        return rezip(good, target, lambda n, d: (n.replace(info, "tokenizers-0.22.0.dist-info/"), d))
    if kind == "no transformers package in it":
        return rezip(good, target, lambda n, d: None if n.startswith("transformers/") else
                     (n.replace("transformers/", "evil/"), d))
    if kind == "two .dist-info directories":
        return _two_infos(good, target, info)
    if kind == "a METADATA of 2 MiB (a zip bomb's first step)":
        return rezip(good, target, lambda n, d: (n, d + b"X-Padding: " + b"x" * (2 << 20) + b"\n")
                     if n.endswith("METADATA") else (n, d))
    raise AssertionError(kind)


def _two_infos(good: Path, target: Path, info: str) -> Path:
    rezip(good, target, lambda n, d: (n, d))
    with zipfile.ZipFile(good) as z, zipfile.ZipFile(target, "a") as out:
        out.writestr("tokenizers-0.22.0.dist-info/METADATA", z.read(info + "METADATA"))
    return target


@pytest.mark.parametrize("kind, said", [
    ("another package, renamed", "a wheel of tokenizers 5.99.0, not of transformers"),
    ("metadata over another package's files", "its files are tokenizers-0.22.0's: not a transformers wheel"),
    ("no transformers package in it", "holds no transformers package (transformers/__init__.py)"),
    ("two .dist-info directories", "not a wheel (2 .dist-info/METADATA in it)"),
    ("a METADATA of 2 MiB (a zip bomb's first step)", "at most 1,048,576 are read"),
])
def test_a_wheel_that_is_not_transformers_is_refused_by_name_before_any_venv(kind, said, good, tmp_path, cache,
                                                                               fake_make):
    """A wheel whose metadata says transformers over another package's files (or holds none) would
    make a venv that imports the transformers it is made over: records of the installed release
    under the name of another."""
    w = tmp_path / "w"
    w.mkdir()
    bad = not_transformers(kind, good, w)
    with pytest.raises(UserError, match="^" + re.escape(f"{bad}: ") + ".*" + re.escape(said)):
        releases.environment(V, w)
    assert not fake_make and not cache.exists()  # refused before anything was made
    assert bad.is_file()  # the user's wheel directory is theirs: left as it was


def test_the_cli_names_the_wheel_and_exits_2(good, tmp_path, cache, monkeypatch):
    w = tmp_path / "w"
    w.mkdir()
    not_transformers("no transformers package in it", good, w)
    monkeypatch.chdir(tmp_path)
    r = invoke(["scan", "--release", V, "--wheels", "w"], allowed=(2,))
    assert f"w/{WHEEL}: a wheel that says it is transformers {V} and holds no transformers package" in r.stderr
    assert not cache.exists()


# -- 2. a release cache that is read-only, full, or a file -------------------------------------------------
def test_a_read_only_cache_is_one_line_naming_it_before_anything_is_made(good, cache, fake_make, monkeypatch):
    """As root a read-only directory is writable; a read-only file system is not, and says so to
    os.access: simulated by os.access (as tests/errors_cases.py does for output directories)."""
    cache.mkdir()
    real = os.access
    monkeypatch.setattr(os, "access", lambda p, mode, *a, **k: False if Path(p) == cache and mode & os.W_OK
                        else real(p, mode, *a, **k))
    with pytest.raises(UserError, match=f"the release cache {cache} is not writable .* point .SMEARCLI_RELEASES "
                                        "at a writable directory"):
        releases.environment(V, good.parent)
    assert not fake_make and entries(cache) == []


def test_a_cache_refusing_a_write_is_named_not_the_temporary_path_it_hit(good, cache, fake_make, monkeypatch):
    """EACCES where the venv's temporary directory is made (a directory of the cache someone else
    owns): the line names the cache and what to do, not `.5.99.0-py311-....tmp`."""
    import tempfile

    real = tempfile.mkdtemp

    def mkdtemp(*a, dir=None, **k):
        if dir is not None and Path(dir).name == "envs":
            raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), str(Path(dir) / ".5.99.0-x.tmp"))
        return real(*a, dir=dir, **k)
    monkeypatch.setattr(tempfile, "mkdtemp", mkdtemp)
    with pytest.raises(UserError) as e:
        releases.environment(V, good.parent)
    assert str(e.value).startswith(f"the release cache {cache} is not writable (Permission denied) while making "
                                   f"transformers {V}'s environment") and ".tmp" not in str(e.value)


def test_a_cache_that_is_a_file_is_said_in_words(good, tmp_path, monkeypatch, fake_make):
    f = tmp_path / "a-file"
    f.write_text("not a directory")
    monkeypatch.setenv(releases.ENV_VAR, str(f))
    with pytest.raises(UserError, match=f"the release cache {f} is not a directory"):
        releases.environment(V, good.parent)
    assert f.read_text() == "not a directory"


def enospc(path="") -> OSError:
    return OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))


@pytest.mark.parametrize("where", ["venv", "ready"])
def test_a_full_disk_while_the_venv_is_made_leaves_nothing_half_made(where, good, cache, monkeypatch):
    """ENOSPC while the venv is made (its first files written) or while its READY is written (the
    venv whole but for it): one line naming the cache, and nothing under envs/ a later run could take."""
    import venv

    if where == "venv":
        def create(self, env_dir):
            Path(env_dir, "bin").mkdir(parents=True)
            Path(env_dir, "pyvenv.cfg").write_text("home = /usr/bin\n")
            raise enospc(Path(env_dir, "lib"))
        monkeypatch.setattr(venv.EnvBuilder, "create", create)
    else:
        monkeypatch.setattr(releases, "_make", lambda venv, wheel, wheels: (venv / "bin").mkdir() or
                            (venv / "bin" / "python").write_text(""))
        real = Path.write_text

        def write_text(self, *a, **k):
            if self.name == releases.READY:
                real(self, "{\"vers")  # cut short, as a full disk cuts it
                raise enospc(self)
            return real(self, *a, **k)
        monkeypatch.setattr(Path, "write_text", write_text)
    with pytest.raises(UserError) as e:
        releases.environment(V, good.parent)
    assert str(e.value).startswith(f"the release cache {cache} is full (No space left on device) while making "
                                   f"transformers {V}'s environment: free space there or point $SMEARCLI_RELEASES")
    assert entries(cache / "envs") == []  # neither the temporary venv nor one in place


def fake_pip(monkeypatch, download=None, install=None):
    """`releases.pip` answering each call: `download` (a wheel put in -d, or pip's stderr and exit 1),
    `install` (pip's stderr and exit 1; None: it succeeds). The calls are kept."""
    calls = []

    def pip(args, python=None, **options):
        calls.append(list(args))
        if args[0] == "download":
            d = Path(args[args.index("-d") + 1])
            if isinstance(download, Path):
                (d / download.name).write_bytes(download.read_bytes())
                return subprocess.CompletedProcess(args, 0, "", "")
            return subprocess.CompletedProcess(args, 1, "", (download or "ERROR: no index").format(path=d / WHEEL))
        if install is not None:
            return subprocess.CompletedProcess(args, 1, "", install.format(path=Path(python).parent.parent / "lib"))
        return subprocess.CompletedProcess(args, 0, "", "")
    monkeypatch.setattr(releases, "pip", pip)
    return calls


PIP_FULL = "ERROR: Could not install packages due to an OSError: [Errno 28] No space left on device: '{path}'\n"


def test_a_full_disk_while_the_wheel_downloads_is_not_called_offline(cache, monkeypatch):
    """pip's download ends in ENOSPC: the cache is full, not the network missing (no `offline?`)."""
    fake_pip(monkeypatch, download=PIP_FULL)
    with pytest.raises(UserError) as e:
        releases.fetch(V)
    assert not isinstance(e.value, releases.Unreachable)
    assert str(e.value).startswith(f"the release cache {cache} is full (No space left on device) while downloading")
    assert entries(cache / "wheels") == []  # no partial download left


def test_a_full_temporary_directory_is_named_as_itself_not_as_the_cache(cache, monkeypatch):
    """pip's ENOSPC on a path outside the cache ($TMPDIR, where it builds): that path is named."""
    fake_pip(monkeypatch, download=PIP_FULL.replace("{path}", "/tmp/pip-unpack-x/t.whl"))
    with pytest.raises(UserError) as e:
        releases.fetch(V)
    assert not isinstance(e.value, releases.Unreachable) and str(e.value) == (
        f"pip failed while downloading transformers {V}'s wheel: /tmp/pip-unpack-x/t.whl: No space left on device")


def test_a_full_disk_while_pip_installs_into_the_venv_is_the_caches(good, cache, monkeypatch, tmp_path):
    """pip install into the new venv ends in ENOSPC: the line names the cache, not the venv's
    temporary directory (gone by the time the user reads it), and no venv is left."""
    import venv

    monkeypatch.setattr(venv.EnvBuilder, "create", lambda self, d: Path(d, "bin").mkdir(parents=True))
    # the new venv's site-packages is a real directory: where smearcli itself runs in a venv,
    # the environment writes a .pth there before pip runs
    purelib = tmp_path / "purelib"
    purelib.mkdir()
    monkeypatch.setattr(releases, "_run", lambda cmd, what: subprocess.CompletedProcess(cmd, 0, f"{purelib}\n", ""))
    fake_pip(monkeypatch, install=PIP_FULL)
    with pytest.raises(UserError, match=f"^the release cache {cache} is full"):
        releases.environment(V, good.parent)
    assert entries(cache / "envs") == []


def test_pip_that_hangs_past_its_limit_is_stopped_and_said(monkeypatch, tmp_path):
    """subprocess.run kills pip at its limit; the line says so (not an internal TimeoutExpired)."""
    def run(*a, **k):
        raise subprocess.TimeoutExpired(a[0], k.get("timeout"))
    monkeypatch.setattr(subprocess, "run", run)
    with pytest.raises(releases.Unreachable, match=f"pip download did not finish within {releases.PIP_TIMEOUT} s"):
        releases.pip(["download", "x"])


# -- a venv left half-made in its place, or its temporary directory left by a killed run ----------------
@pytest.mark.parametrize("ready", [None, "{\"vers", json.dumps({"version": "5.98.0"}), json.dumps({"version": V})])
def test_a_torn_venv_in_place_is_never_used_and_is_made_anew(ready, good, cache, fake_make):
    """A venv in its place without a READY that names its release (none, one cut short, another
    release's), or with one but no Python (a file system that lost part of it), is removed and made
    anew; never run, never an error."""
    final = cache / "envs" / f"{V}-{releases.base_key()}"
    (final / "lib").mkdir(parents=True)
    (final / "lib" / "half-installed.py").write_text("")
    if ready is not None:
        (final / releases.READY).write_text(ready)
    said = []
    env = releases.environment(V, good.parent, say=said.append)
    assert env.made_s is not None and len(fake_make) == 1  # made now, not taken as ready
    assert json.loads((final / releases.READY).read_text())["version"] == V and (final / "bin" / "python").exists()
    assert not (final / "lib" / "half-installed.py").exists()
    assert any("a half-made environment" in s and str(final) in s for s in said)
    assert entries(cache / "envs") == [final.name]  # nothing set aside left
    again = releases.environment(V, good.parent)
    assert again.made_s is None and len(fake_make) == 1  # whole now: used as it is


def test_temporaries_a_killed_run_left_are_removed_once_stale_and_never_used(good, cache, fake_make, monkeypatch):
    """SIGKILL while a venv is made or a wheel downloads leaves `.X.tmp` under envs/ and
    `.download.X/` under wheels/ (with a wheel cut short in it): never used, and removed by the next
    run that writes there once older than any run could still be making them."""
    envs, store = cache / "envs", cache / "wheels"
    old_tmp = envs / f".{V}-{releases.base_key()}.abc.tmp"
    young_tmp = envs / f".{V}-{releases.base_key()}.def.tmp"  # perhaps another scan making it now: kept
    old_dl = store / ".download.abc"
    for d in (old_tmp, young_tmp, old_dl):
        (d / "bin").mkdir(parents=True)
    (old_dl / WHEEL).write_bytes(good.read_bytes()[:100])
    past = time.time() - releases.STALE_S - 60
    for d in (old_tmp, old_dl):
        os.utime(d, (past, past))
    with pytest.raises(releases.Unreachable):  # the download's partial wheel is not taken: pip is asked
        fake_pip(monkeypatch)
        releases.fetch(V)
    assert not old_dl.exists()
    releases.environment(V, good.parent)
    assert not old_tmp.exists() and young_tmp.exists()


# -- 4. a wheel in the cache cut short or damaged ----------------------------------------------------------
def cut_short(src: Path, dst: Path) -> Path:
    dst.parent.mkdir(parents=True, exist_ok=True)
    dst.write_bytes(src.read_bytes()[: src.stat().st_size // 2])
    return dst


def damaged(src: Path, dst: Path) -> Path:
    """`src` with a byte of a member's data changed: its size and its zip index whole, its CRC-32 not."""
    data = src.read_bytes()
    assert data.count(b"__version__ = ") == 1
    dst.parent.mkdir(parents=True, exist_ok=True)
    dst.write_bytes(data.replace(b"__version__ = ", b"__VERSION__ = "))
    return dst


@pytest.mark.parametrize("tear", [cut_short, damaged])
def test_a_torn_wheel_in_the_cache_is_removed_and_fetched_again(tear, good, cache, monkeypatch):
    torn = tear(good, cache / "wheels" / WHEEL)
    calls = fake_pip(monkeypatch, download=good)
    said = []
    wheel = releases.fetch(V, say=said.append)
    assert [c[0] for c in calls] == ["download"]  # fetched again
    assert wheel.path == torn and torn.read_bytes() == good.read_bytes()
    assert len(said) == 1 and "the wheel in the cache is not usable" in said[0] and "fetching it again" in said[0]
    assert entries(cache / "wheels") == [WHEEL]


def test_a_torn_wheel_in_the_cache_is_not_left_there_when_it_cannot_be_fetched_again(good, cache, monkeypatch):
    cut_short(good, cache / "wheels" / WHEEL)
    fake_pip(monkeypatch)  # offline
    with pytest.raises(releases.Unreachable, match=f"pip could not fetch transformers=={V}"):
        releases.fetch(V)
    assert entries(cache / "wheels") == []


@pytest.mark.parametrize("tear, said", [(cut_short, "not a wheel (not a zip file, or one cut short"),
                                        (damaged, "a damaged wheel (transformers/__init__.py fails its CRC-32 check)")])
def test_a_torn_wheel_in_the_users_directory_is_refused_by_name_and_left(tear, said, good, tmp_path, cache,
                                                                         fake_make):
    torn = tear(good, tmp_path / "w" / WHEEL)
    before = torn.read_bytes()
    with pytest.raises(UserError, match=re.escape(f"{torn}: {said}")):
        releases.environment(V, torn.parent)
    assert torn.read_bytes() == before and not fake_make and not cache.exists()


# -- 3. --bisect over a range where the architecture is missing at one end ------------------------------------
def search(verdicts: dict, model_type="llama4", failing=("bug",)):
    asked, said = [], []

    def check(v):
        asked.append(v)
        verdict = verdicts[v]
        return releases.Probe(v, verdict, verdict in failing)
    return releases.bisect(list(verdicts), check, model_type, said.append), asked, said


def test_an_architecture_added_within_the_range_is_searched_from_its_first_release():
    """llama4 first in 5.6.0, a finding there that is gone in 5.8.0: before, both ends 'without the
    finding' gave 'no finding at either end'; the search starts where it exists, and says so."""
    vs = {"5.4.0": None, "5.5.0": None, "5.6.0": "bug", "5.7.0": "bug", "5.8.0": "ok", "5.9.0": "ok"}
    found, asked, said = search(vs)
    assert (found.first_with, found.appeared, found.gone) == ("5.6.0", "5.6.0", "5.8.0")
    assert found.answer == ("llama4: a finding from 5.6.0 on (bug; it came with the architecture), gone in "
                            "transformers 5.8.0 (ok; 5.7.0: bug); llama4 is not in transformers 5.4.0: the search "
                            "started at 5.6.0, the first release of the range that has it")
    assert any(s == "bisect llama4: llama4 is not in transformers 5.4.0; looking for the first release of the "
               "range that has it" for s in said)
    printed = releases.lines(found)
    assert "transformers 5.4.0    not in this release" in printed[0]
    assert any(p.startswith("transformers 5.6.0") and "<- appears" in p for p in printed)


def test_a_finding_since_the_architecture_was_added_is_not_said_to_appear_there():
    """Before, 'the finding appears in transformers 5.5.0 (bug; 5.4.0: not in this release)': the
    architecture appeared there, with its finding."""
    found, _, _ = search({"5.4.0": None, "5.5.0": "bug", "5.6.0": "bug"})
    assert found.appeared == "5.5.0" and found.gone is None
    assert found.answer.startswith("llama4: a finding on every release probed from 5.5.0 to 5.6.0 (bug on 5.5.0, "
                                   "bug on 5.6.0): it came with the architecture; llama4 is not in transformers 5.4.0")
    found, _, _ = search({"5.4.0": None, "5.5.0": "ok", "5.6.0": "bug"})  # there, without it, then with it
    assert found.appeared == "5.6.0" and found.answer.startswith(
        "llama4: the finding appears in transformers 5.6.0 (bug; 5.5.0: ok) and is still there in 5.6.0")


def test_an_architecture_removed_within_the_range_is_not_a_finding_gone():
    """Before, 'gone in transformers 5.3.0 (not in this release; ...)': the architecture went, not the bug."""
    found, _, said = search({"5.1.0": "bug", "5.2.0": "bug", "5.3.0": None})
    assert (found.last_with, found.gone) == ("5.2.0", None)
    assert found.answer.endswith("llama4 is not in transformers 5.3.0: the search ended at 5.2.0, the last release "
                                 "of the range that has it")
    assert "gone in" not in found.answer
    assert any(p.startswith("transformers 5.2.0") and "<- the last with it" in p for p in releases.lines(found))


def test_an_architecture_in_the_last_release_of_the_range_alone():
    found, _, _ = search({"5.1.0": None, "5.2.0": None, "5.3.0": "bug"})
    assert found.appeared == "5.3.0" and found.answer == (
        "llama4: bug (a finding) on transformers 5.3.0, the one release of the range that has it; llama4 is not in "
        "transformers 5.1.0: the search started at 5.3.0, the first release of the range that has it")


def test_the_search_for_where_the_architecture_starts_halves_too():
    """32 releases, llama4 from the 21st, its finding gone at the 28th: about log2 probes for each."""
    vs = {f"5.{i}.0": None if i < 20 else "bug" if i < 27 else "ok" for i in range(32)}
    found, asked, said = search(vs)
    assert (found.first_with, found.appeared, found.gone) == ("5.20.0", "5.20.0", "5.27.0")
    assert len(asked) <= 2 + 5 + 4 and len(set(asked)) == len(asked)  # 5: 30 releases between; 4: 7 with it
    assert sum("looking for the first release" in s for s in said) == 1


def test_a_range_without_the_architecture_at_both_ends_is_still_refused():
    with pytest.raises(UserError, match="registered neither in transformers 5.1.0 nor in 5.3.0"):
        search({"5.1.0": None, "5.2.0": "bug", "5.3.0": None})


# -- nothing left running ------------------------------------------------------------------------------------
def test_a_stopped_run_stops_the_releases_smearcli_with_sigterm_not_sigkill(tmp_path, monkeypatch):
    """SIGTERM to smearcli while the release's smearcli runs (`--release`, or a `--bisect` probe):
    that smearcli is told with SIGTERM, so it stops its own census workers and removes its files as
    any stopped smearcli does; subprocess.run's SIGKILL left its workers running. A stand-in that
    says it was told."""
    import signal

    from smearcli.util.files import Terminated

    told, started = tmp_path / "told", tmp_path / "started"
    script = tmp_path / "python"
    script.write_text(f"#!/bin/sh\ntrap 'echo TERM > {told}; exit 143' TERM\ntouch {started}\n"
                      "while :; do sleep 0.05; done\n")
    script.chmod(0o755)
    monkeypatch.setattr(releases, "PROGRAM", ())

    def stop(signum, frame):
        raise Terminated()
    before = signal.signal(signal.SIGALRM, stop)
    signal.setitimer(signal.ITIMER_REAL, 1.0)  # as the CLI's SIGTERM handler raises it
    try:
        with pytest.raises(Terminated):
            releases.rerun(releases.Env(V, script), ["scan"])
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, before)
    assert started.exists() and told.read_text().strip() == "TERM"
