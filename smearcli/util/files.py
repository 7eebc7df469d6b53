"""Files in and out.

Out: atomic output (write to a temporary file beside the target, then rename over it), so a run
that fails half way never leaves a partial file and an existing file is only ever replaced by a
complete one. In: `regular_file` (a path we may open and read without hanging: a FIFO, a device,
a dangling symlink or a symlink loop is refused before any open) and `zip_members` (a zip archive's
index, uncompressed sizes and member CRCs checked by streaming, so a bit flip on disk is caught
before torch reads the file, which checks no CRC)."""

from __future__ import annotations

import contextlib
import errno
import os
import stat
import tempfile
import zipfile
from pathlib import Path
from typing import Optional


class Terminated(BaseException):
    """A SIGTERM, raised in the main thread (the CLI installs the handler, `on_sigterm`) so that
    `finally` blocks run: atomic_write removes its temporary file. A BaseException, so that no
    `except Exception` mistakes it for a failure, and the user's code under audit is never blamed."""


def on_sigterm(signum, frame):
    """A SIGTERM handler: raise Terminated."""
    raise Terminated()


@contextlib.contextmanager
def atomic_write(path, mode: str = "w", **kwargs):
    """Write `path` through a temporary file `.NAME.XXXXXXXX.tmp` beside it, renamed over it once
    complete; removed on any failure, Ctrl-C, or a SIGTERM turned into Terminated. A directory
    that has gone away meanwhile is a UserError. Text is UTF-8 whatever the locale (LC_ALL=C
    would make it ASCII) unless `encoding` says otherwise."""
    from .errors import UserError

    path = Path(path)
    if "b" not in mode:
        kwargs.setdefault("encoding", "utf-8")
    tmp = None
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
        with os.fdopen(fd, mode, **kwargs) as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, _final_mode(path))  # mkstemp's 0600 would make outputs private
        _refuse_special(path)  # checked again here: a device or FIFO made since is never replaced
        os.replace(tmp, path)
    except BaseException as e:
        if tmp is not None:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
        if isinstance(e, (FileNotFoundError, NotADirectoryError)) and not path.parent.is_dir():
            not_dir = not_a_directory(path.parent)  # replaced by a file after the check
            why = f"{not_dir} (replaced during the run?)" if not_dir else \
                f"directory {path.parent} no longer exists (removed during the run?)"
            raise UserError(f"{path}: {why}; nothing written") from e
        cause = _write_error(e)  # torch's zip writer wraps the OSError (disk full) in a RuntimeError
        if cause is not None and (cause is not e or cause.filename is None):
            raise OSError(cause.errno, cause.strerror or str(cause), cause.filename or str(path)) from None
        raise


def _write_error(e: BaseException):
    """The OSError (disk full, file too large) behind an exception raised while writing, if any."""
    seen = 0
    while e is not None and seen < 8:
        if isinstance(e, OSError):
            return e
        e, seen = e.__cause__ or e.__context__, seen + 1
    return None


def _final_mode(path: Path) -> int:
    """An existing file keeps its permissions; a new one gets the usual 0666 minus the umask."""
    try:
        return path.stat().st_mode & 0o7777
    except OSError:
        mask = os.umask(0)
        os.umask(mask)
        return 0o666 & ~mask


def special_kind(mode: int) -> Optional[str]:
    """What a file that is neither a regular file nor a directory is, in words; None for those."""
    if stat.S_ISREG(mode) or stat.S_ISDIR(mode):
        return None
    return "FIFO (named pipe)" if stat.S_ISFIFO(mode) else "socket" if stat.S_ISSOCK(mode) \
        else "device" if stat.S_ISCHR(mode) or stat.S_ISBLK(mode) else "special file"


def _refuse_special(path: Path) -> None:
    """A UserError when `path` (followed, as a write would) is a device, FIFO or socket: replacing
    /dev/null with a file, as root, would break the machine."""
    from .errors import UserError

    try:
        kind = special_kind(os.stat(path).st_mode)
    except (FileNotFoundError, NotADirectoryError):
        return
    if kind is not None:
        raise UserError(f"{path}: a {kind}, not a regular file; give a file to write")


def check_output_path(path, suffixes: Optional[tuple[str, ...]]) -> None:
    """Refuse, before any work, an output path we could not write: wrong suffix (unless
    `suffixes` is None), missing or read-only directory, a directory, device or FIFO in the way.
    (A relative path stays relative to this working directory: the guard around a user's audited
    code restores it after every call, see engines.nanochat.guard.)"""
    from .errors import UserError

    try:
        _check_output_path(Path(path), suffixes)
    except OSError as e:  # a name too long, a symlink loop in the directory
        raise UserError(f"{path}: cannot write there ({e.strerror or e})") from e
    except ValueError as e:  # an embedded NUL byte
        raise UserError(f"{path}: not a valid path ({e})") from e


def _check_output_path(path: Path, suffixes: tuple[str, ...]) -> None:
    from .errors import UserError

    if os.path.islink(path):
        try:
            os.stat(path)
        except OSError as e:  # writing would replace the link with a file: refused, as for inputs
            raise UserError(f"{path}: {_stat_failure(path, e)}") from e
    if suffixes is not None and path.suffix.lower() not in suffixes:
        raise UserError(f"{path}: unknown suffix {path.suffix or '(none)'}; use {', '.join(suffixes)}")
    parent = path.parent if str(path.parent) else Path(".")
    if not parent.is_dir():
        raise UserError(f"{path}: {missing_directory(parent)}")
    if path.is_dir():
        raise UserError(f"{path}: is a directory")
    _refuse_special(path)
    if not os.access(parent, os.W_OK):
        raise UserError(f"{path}: directory {parent} is not writable")
    try:  # the real test (root passes os.access even on a read-only file system)
        fd, probe = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=parent)
    except OSError as e:
        raise UserError(f"{path}: cannot write in directory {parent} ({e.strerror or e})") from e
    os.close(fd)
    os.unlink(probe)


def not_a_directory(directory) -> Optional[str]:
    """When `directory`, or the nearest of its parents that exists, is something other than a
    directory (`--save FILE/runs.pt`): what it is, in words ("FILE is a file, not a directory");
    None when it is missing or a directory."""
    d = Path(directory)
    for p in (d, *d.parents):
        try:
            mode = os.stat(p).st_mode
        except (FileNotFoundError, NotADirectoryError):
            continue
        except OSError:
            return None
        if stat.S_ISDIR(mode):
            return None
        kind = "a file" if stat.S_ISREG(mode) else f"a {special_kind(mode)}"
        return f"{p} is {kind}, not a directory"
    return None


def missing_directory(directory) -> str:
    """Why an output's directory cannot take it, in words: a file in the way (`not_a_directory`),
    or a directory that does not exist."""
    return not_a_directory(directory) or f"directory {directory} does not exist"


def regular_file(path, what: str = "") -> int:
    """The size of `path` when it is a regular file we can read; a UserError naming the problem
    otherwise (missing, a dangling symlink, a symlink loop, a name too long, a directory, a FIFO or
    device that would block a read). Nothing is opened."""
    from .errors import UserError

    name = what or str(path)
    try:
        st = os.stat(path)
    except OSError as e:
        raise UserError(f"{name}: {_stat_failure(path, e)}") from e
    except ValueError as e:  # an embedded NUL byte
        raise UserError(f"{name}: not a valid path ({e})") from e
    if stat.S_ISDIR(st.st_mode):
        raise UserError(f"{name}: is a directory, not a file")
    if not stat.S_ISREG(st.st_mode):
        raise UserError(f"{name}: a {special_kind(st.st_mode)}, not a regular file; give a file")
    if not os.access(path, os.R_OK):
        raise UserError(f"{name}: cannot read (permission denied)")
    return st.st_size


def _stat_failure(path, e: OSError) -> str:
    """Why a path cannot be looked at, in words: a dangling symlink, a symlink loop, too long..."""
    if e.errno == errno.ELOOP:
        return f"a symlink loop ({e.strerror})"
    if isinstance(e, FileNotFoundError) and os.path.islink(path):
        return f"a symlink to {os.readlink(path)!r}, which does not exist"
    if isinstance(e, FileNotFoundError):
        return "not found"
    return f"cannot read ({e.strerror or e})"


def zip_members(path, check_crc: bool = True) -> int:
    """A zip archive's uncompressed size (sum of its index's member sizes), after reading every
    member once in 1 MiB pieces so zipfile checks its CRC-32 (nothing is kept in memory). Raises
    zipfile.BadZipFile, OSError, ValueError or EOFError for a truncated or corrupt archive."""
    with zipfile.ZipFile(path) as z:
        infos = z.infolist()
        total = sum(i.file_size for i in infos)
        if check_crc:
            for info in infos:
                with z.open(info) as member:
                    while member.read(1 << 20):
                        pass
    return total


def odd_tensor(t) -> Optional[str]:
    """What makes a tensor unusable as plain weights or ids (nested, sparse, quantized, meta), or None."""
    if t.is_nested:
        return "a nested tensor"
    if str(t.layout) != "torch.strided":
        return f"a {str(t.layout).removeprefix('torch.')} tensor"
    if t.is_quantized:
        return f"a quantized tensor ({str(t.dtype).removeprefix('torch.')})"
    if t.device.type == "meta":
        return "a meta tensor (a shape without data)"
    return None


def uncompressed_size(path) -> int:
    """The bytes a torch file's tensors take once read: the zip index's uncompressed sizes (a
    compressed member can inflate far beyond the file's size), or the file size otherwise."""
    size = os.path.getsize(path)
    try:
        with zipfile.ZipFile(path) as z:
            return max(size, sum(i.file_size for i in z.infolist()))
    except (zipfile.BadZipFile, OSError, ValueError, EOFError):
        return size
