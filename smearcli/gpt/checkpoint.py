"""A nanochat checkpoint directory on disk, read without trusting it: which steps it holds, its
meta JSON, its torch file (checked before torch sees it: a regular file, an intact zip, CRCs), and
the state dict's tensors (names, shapes, dtypes, finite values).

Format (upstream checkpoint_manager): `model_{step:06d}.pt` (a torch.save'd state dict) beside
`meta_{step:06d}.json` (with `model_config`). Nothing is ever unpickled beyond plain tensors:
`torch.load(..., weights_only=True)` only.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import warnings
import zipfile
from pathlib import Path
from typing import Optional

import torch

from ..util.errors import UserError
from ..util.files import odd_tensor, regular_file, zip_members

_MODEL_RE = re.compile(r"^model_(\d+)\.pt$")


def list_steps(ckpt_dir: Path) -> list[int]:
    """Steps that have both a `model_*.pt` and a `meta_*.json`, ascending."""
    steps = []
    for p in ckpt_dir.iterdir():
        m = _MODEL_RE.match(p.name)
        if m and (ckpt_dir / f"meta_{m.group(1)}.json").is_file():
            steps.append(int(m.group(1)))
    return sorted(steps)


# the parameters of the smear (nanochat added them with backout_lambda; older checkpoints lack all three)
SMEAR_KEYS = ("smear_gate.weight", "smear_lambda")


class NoSmearParameters(UserError):
    """The checkpoint predates the smear: issue #756 cannot affect it."""


def smear_keys_missing(state_dict) -> bool:
    """True when a state dict has none of the smear parameters (a model from before nanochat added
    the smear), so the chunked-prefill smear bug cannot affect it."""
    return not any(k.removeprefix("_orig_mod.") in SMEAR_KEYS for k in state_dict)


META_MAX_BYTES = 64 << 20  # a meta JSON holds a config and some numbers: kilobytes
FLOAT_DTYPES = (torch.float32, torch.bfloat16, torch.float16, torch.float64)


def _describe_missing_pair(ckpt_dir: Path) -> str:
    """Why a directory has no usable model/meta pair, in a way the user can act on."""
    names = sorted(p.name for p in ckpt_dir.iterdir())
    if not names:
        return f"{ckpt_dir}: the checkpoint directory is empty"
    models = [n for n in names if _MODEL_RE.match(n)]
    if models:
        m = _MODEL_RE.match(models[-1])
        return (f"{ckpt_dir}: {models[-1]} has no meta_{m.group(1)}.json beside it; copy the meta file "
                "that was saved with it")
    metas = [n for n in names if n.startswith("meta_") and n.endswith(".json")]
    if metas:
        return f"{ckpt_dir}: {metas[-1]} has no model_{metas[-1][5:-5]}.pt beside it"
    shown = ", ".join(names[:4]) + (", ..." if len(names) > 4 else "")
    return f"{ckpt_dir}: no model_XXXXXX.pt / meta_XXXXXX.json pair (found {shown}); is this a nanochat checkpoint directory?"


def _steps_text(steps: list[int]) -> str:
    if len(steps) <= 8:
        return ", ".join(map(str, steps))
    return ", ".join(map(str, steps[:3])) + ", ..., " + ", ".join(map(str, steps[-3:])) + f" ({len(steps)} steps)"


def read_meta(path: Path) -> dict:
    size = regular_file(path, path.name)
    if size > META_MAX_BYTES:
        raise UserError(f"{path.name}: {size:,} bytes is too large for a meta JSON file")
    try:
        meta = json.loads(path.read_bytes().decode("utf-8"))
    except OSError as e:
        raise UserError(f"{path.name}: cannot read ({e.strerror or e})") from e
    except UnicodeDecodeError as e:
        raise UserError(f"{path.name}: not UTF-8 text (byte {e.start}); the meta file is corrupt") from e
    except json.JSONDecodeError as e:
        raise UserError(f"{path.name}: invalid JSON ({e.msg} at line {e.lineno} column {e.colno})") from e
    except RecursionError as e:
        raise UserError(f"{path.name}: invalid JSON (nested too deeply)") from e
    except ValueError as e:  # an integer beyond Python's digit limit
        raise UserError(f"{path.name}: invalid JSON ({one_line_reason(e)})") from e
    if not isinstance(meta, dict):
        raise UserError(f"{path.name}: expected a JSON object with a model_config, got a {_json_type(meta)}")
    if "model_config" not in meta:
        raise UserError(f"{path.name}: no model_config in the meta JSON")
    return meta


def _json_type(v) -> str:
    return {dict: "object", list: "list", str: "string", bool: "boolean", int: "number",
            float: "number", type(None): "null"}.get(type(v), type(v).__name__)


def one_line_reason(e: Exception) -> str:
    """The first sentence of an exception's message (Python's digit-limit error runs on)."""
    return (str(e).strip().splitlines() or [type(e).__name__])[0].split(";")[0].rstrip(".: ")


def check_torch_file(path: Path, name: str = "") -> None:
    """Refuse, without unpickling anything, a file torch.load could only fail on (or would block
    on: a FIFO), and a zip archive whose member CRCs do not match (torch checks none)."""
    name = name or path.name
    size = regular_file(path, name)
    try:
        with open(path, "rb") as f:
            head = f.read(4)
    except OSError as e:
        raise UserError(f"{name}: cannot read ({e.strerror or e})") from e
    if size == 0:
        raise UserError(f"{name}: empty file (0 bytes); the file was not written completely, "
                        "copy or save it again")
    if head.startswith(b"PK"):
        try:
            zip_members(path)
        except (zipfile.BadZipFile, OSError, ValueError, EOFError, NotImplementedError) as e:
            what = "corrupt (a CRC-32 check failed: the bytes on disk changed)" if "CRC" in str(e) \
                else f"truncated or corrupt ({e})"
            raise UserError(f"{name}: {what}; copy or save the file again") from e
    elif not head.startswith(b"\x80"):
        raise UserError(f"{name}: not a torch checkpoint (neither the zip archive torch.save writes "
                        "nor a legacy torch pickle)")


def describe_load_failure(e: Exception, what: str = "torch checkpoint") -> str:
    """Why `torch.load(..., weights_only=True)` refused a file, in one line of our own words."""
    text = str(e)
    glob = re.search(r"Unsupported global: GLOBAL ([\w.]+)", text)
    if glob:
        return (f"refused: loading it would call {glob.group(1)}, code that smearcli never runs from a file "
                "(it loads plain tensors only, torch.load weights_only=True); if you trust the file, "
                "re-save it as plain tensors")
    m = re.search(r"WeightsUnpickler error:\s*(.+)", text)
    detail = m.group(1).strip() if m else (text.strip().splitlines() or [type(e).__name__])[0]
    detail = detail.split(". ")[0].rstrip(".") or type(e).__name__
    return f"not a readable {what} ({detail})"


def _load_error(path: Path, e: Exception) -> UserError:
    msg = describe_load_failure(e)
    tail = "" if msg.startswith("refused") else "; copy or save it again"
    return UserError(f"{path.name}: {msg}{tail}")


def can_mmap(path: Path) -> bool:
    """Whether torch.load can memory-map the file: the zip format torch.save has written since
    torch 1.6, every member stored uncompressed (a legacy pickle, or a compressed member, is read
    into memory, and the preflight counts it inflated), and a name torch's C++ code can open (see
    `torch_name`). Never opens what is not a regular file (a FIFO would block the read)."""
    if not os.path.isfile(path) or not (_name_passes(path) or _fd_dir() is not None):
        return False
    try:
        with zipfile.ZipFile(path) as z:
            return all(i.compress_type == zipfile.ZIP_STORED for i in z.infolist())
    except (zipfile.BadZipFile, OSError, ValueError, EOFError):
        return False


def _name_passes(path) -> bool:
    """Whether torch's C++ code opens the same file as Python for this name: it encodes the name
    as UTF-8, Python with the file system's encoding (under LC_ALL=C, ASCII with the other bytes
    escaped as lone surrogates, which UTF-8 cannot encode; so are bytes that are not UTF-8)."""
    name = os.fspath(path)
    try:
        return name.encode("utf-8") == os.fsencode(name)
    except UnicodeError:
        return False


def _fd_dir():
    """Where this process's open files have names of their own (Linux /proc, the BSDs' /dev/fd)."""
    return next((d for d in ("/proc/self/fd", "/dev/fd") if os.path.isdir(d)), None)


@contextlib.contextmanager
def torch_name(path: Path, mmap: bool = True):
    """A name of `path` for torch.load(mmap=True), whose memory map is opened by C++ code: the
    path itself, or, when C++ would read its name as other bytes (see `_name_passes`), the name of
    a descriptor open on it (/proc/self/fd/N: ASCII, the same file). Without mmap, Python opens
    the file: the path itself."""
    if not mmap or _name_passes(path) or _fd_dir() is None:
        yield os.fspath(path)
        return
    fd = os.open(path, os.O_RDONLY)
    try:
        yield f"{_fd_dir()}/{fd}"
    finally:
        os.close(fd)


def torch_load(path: Path, mmap: bool = False):
    """`torch.load(weights_only=True)` on the CPU, its warnings kept off stderr (an error's one
    line is all the user sees: torch warns about the storages and dtypes it is refusing)."""
    with torch_name(path, mmap) as name, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return torch.load(name, map_location="cpu", weights_only=True, mmap=mmap)


def read_state_dict(path: Path) -> dict:
    """The file's tensors. A zip-format file is memory-mapped (torch.load mmap=True): its tensors
    stay in the page cache, read as they are used, instead of being copied into memory first."""
    check_torch_file(path)
    try:
        sd = torch_load(path, mmap=can_mmap(path))
    except MemoryError:
        raise
    except Exception as e:  # noqa: BLE001 - every failure here means the same to the user
        raise _load_error(path, e) from e
    if not isinstance(sd, dict):
        raise UserError(f"{path.name}: expected a state dict (parameter name -> tensor), found a {type(sd).__name__}")
    out = {}
    for k, v in sd.items():
        if not isinstance(k, str):
            raise UserError(f"{path.name}: state dict key {k!r} is not a parameter name (a string)")
        if not isinstance(v, torch.Tensor):
            hint = "; the weights may be nested under it (a training checkpoint)" if isinstance(v, dict) else ""
            raise UserError(f"{path.name}: key {k!r} holds a {type(v).__name__}, not a tensor{hint}")
        kind = odd_tensor(v)
        if kind is not None:
            raise UserError(f"{path.name}: {k} is {kind}, expected a dense float tensor")
        out[k.removeprefix("_orig_mod.")] = v
    return out


def check_tensors(name: str, sd: dict, expected: dict) -> None:
    """Every tensor of `sd` that `expected` (name -> shape) names: that shape, a float dtype, and
    finite values (a NaN would pass for a bug or for agreement)."""
    for k, v in sd.items():
        if k not in expected:
            continue
        if tuple(v.shape) != expected[k]:
            raise UserError(f"{name}: {k} has shape {tuple(v.shape)}, "
                            f"model_config expects {expected[k]}")
        if v.dtype not in FLOAT_DTYPES:
            raise UserError(f"{name}: {k} is {str(v.dtype).removeprefix('torch.')}, expected a dense float "
                            "tensor (float32, bfloat16, float16 or float64)")
        bad = int((~torch.isfinite(v)).sum())
        if bad:
            raise UserError(f"{name}: {k} contains NaN or Inf ({bad:,} of {v.numel():,} values); "
                            "refusing to run on it")


class NoSuchStep(UserError):
    """The step asked for is not in the checkpoint directory (the message lists those that are)."""


def find_step(ckpt_dir, step: Optional[int] = None) -> tuple[Path, int]:
    """The checkpoint directory (user's ~ expanded) and the step to load: `step`, or the newest."""
    ckpt_dir = Path(os.path.expanduser(str(ckpt_dir)))
    try:
        return _find_step(ckpt_dir, step)
    except OSError as e:  # a name too long, a symlink loop: the path cannot be looked at
        raise UserError(f"{ckpt_dir}: cannot read ({e.strerror or e})") from e


def _find_step(ckpt_dir: Path, step: Optional[int]) -> tuple[Path, int]:
    if ckpt_dir.is_symlink() and not ckpt_dir.exists():  # dangling, or a loop
        regular_file(ckpt_dir)  # raises, saying which
    if ckpt_dir.is_file():
        raise UserError(f"{ckpt_dir}: a file, not a directory; pass the directory that holds the "
                        "model_XXXXXX.pt / meta_XXXXXX.json pair")
    if not ckpt_dir.is_dir():
        raise UserError(f"{ckpt_dir}: checkpoint directory not found")
    try:
        steps = list_steps(ckpt_dir)
    except OSError as e:
        raise UserError(f"{ckpt_dir}: cannot list the checkpoint directory ({e.strerror or e})") from e
    if not steps:
        raise UserError(_describe_missing_pair(ckpt_dir))
    if step is None:
        return ckpt_dir, steps[-1]
    if step not in steps:
        raise NoSuchStep(f"{ckpt_dir}: no step {step}; present: {_steps_text(steps)}")
    return ckpt_dir, step
