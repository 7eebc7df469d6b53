"""Which frame raised: the one frame finder every surface uses to say where someone else's code failed.

A crash inside transformers, or inside a user's nanochat checkout, is their code's result, not
smearcli's: the report names the deepest frame in their code ("transformers/models/x/
modeling_x.py:12 in forward"). The rules, each once:

- `innermost(frames, name)`: the deepest frame that `name(frame)` names (None when it names none);
- `in_package(package)`: names a frame inside an installed package, from the package on;
- `under(root)`: names a frame inside a directory, relative to it ("nanochat/gpt.py:12");
- `raised_in(exc, package)`: the deepest frame in `package`, only when the exception was raised
  there (or in torch, called from there): an error in smearcli's own frames is never theirs;
- `describe(exc, package)`: "where: Error: first line" with the deepest frame in `package`, or
  the deepest frame of all when none is (the census's reason for a crash);
- `declared_limit(exc, package)`: the message of an error their code raised on purpose to say a
  use is not supported (NotImplementedError, or an assertion or ValueError that says "not
  supported" / "only supported"), which is a limit of their API, not a crash.
- `says_limit(message)`: whether a message words a use that way (a message kept without its
  exception: a reach entry's `why`).

vLLM's worker (`engines.vllm.worker`) runs in vLLM's own environment without smearcli, so it
keeps its own few lines for the same rule.
"""

from __future__ import annotations

import traceback
from pathlib import Path
from typing import Callable, Iterable, Optional

Frame = traceback.FrameSummary
Namer = Callable[[Frame], Optional[str]]


def frames(exc: BaseException) -> list[Frame]:
    """The frames of an exception's traceback, outermost first."""
    return traceback.extract_tb(exc.__traceback__)


def _slashed(filename: str) -> str:
    return filename.replace("\\", "/")


def short_path(filename: str) -> str:
    """A frame's file from its package on: "transformers/models/x/modeling_x.py", "smearcli/..."."""
    path = _slashed(filename)
    for root in ("/site-packages/", "/smearcli/"):
        if root in path:
            rest = path.rsplit(root, 1)[1]
            return rest if root == "/site-packages/" else "smearcli/" + rest
    return path


def where(frame: Frame) -> str:
    """"transformers/models/x/modeling_x.py:12 in forward"."""
    return f"{short_path(frame.filename)}:{frame.lineno} in {frame.name}"


OWN = _slashed(str(Path(__file__).resolve().parents[1])) + "/"  # this smearcli's package folder (util/ is in it)


def ours(path: str) -> bool:
    """A file of smearcli itself: in this package's folder, or in an engine folder of a smearcli
    installed elsewhere (a frame from a release's venv running its own copy)."""
    return path.startswith(OWN) or "/smearcli/engines/" in path


def in_package(package: str) -> Namer:
    """Names a frame whose file lies in `package` (a folder of that name on its path) from the
    package on, wherever it is installed (site-packages, a `pip --target` folder, a checkout);
    never one of ours, whose engine folders are named after the engines (`smearcli/engines/transformers/`)."""
    def name(frame: Frame) -> Optional[str]:
        path = _slashed(frame.filename)
        if ours(path):
            return None
        installed = next((root for root in INSTALLED if root in path), None)
        if installed is not None:  # from the last site-packages on: a venv named after the package
            rest = path.rsplit(installed, 1)[1]  # (~/envs/vllm/...) holds torch's frames too
            return f"{rest}:{frame.lineno} in {frame.name}" if rest.startswith(f"{package}/") else None
        if f"/{package}/" not in path:
            return None
        return f"{package}/{path.rsplit(f'/{package}/', 1)[1]}:{frame.lineno} in {frame.name}"
    return name


INSTALLED = ("/site-packages/", "/dist-packages/")  # where an installed package's files lie


def under(root) -> Namer:
    """Names a frame whose file lies under `root` by its path relative to it and its line."""
    root = Path(root)

    def name(frame: Frame) -> Optional[str]:
        try:
            return f"{Path(frame.filename).resolve().relative_to(root)}:{frame.lineno}"
        except (ValueError, OSError):
            return None
    return name


def innermost(found: Iterable[Frame], name: Namer) -> Optional[str]:
    """What `name` says of the deepest frame it names, or None when it names none."""
    out = None
    for f in found:
        out = name(f) or out
    return out


def raised_in(exc: BaseException, package: str, through: tuple = ("torch",)) -> Optional[str]:
    """The deepest frame in `package` when the exception was raised there, or in one of `through`
    (torch) called from there; None when it was raised anywhere else (smearcli's own code)."""
    tb = frames(exc)
    if not tb:
        return None
    last = tb[-1]
    if not (in_package(package)(last) or any(in_package(p)(last) for p in through)):
        return None
    return innermost(tb, in_package(package))


def describe(exc: BaseException, package: str) -> str:
    """"where: Error: first line of the message", at the deepest frame in `package` (the deepest
    frame of all when none is in it; "?" when there is no traceback)."""
    tb = frames(exc)
    at = innermost(tb, in_package(package)) or (where(tb[-1]) if tb else "?")
    first = str(exc).splitlines()[0][:200] if str(exc) else ""
    return f"{at}: {type(exc).__name__}: {first}"


LIMIT_WORDS = ("not supported", "only supported", "not implemented", "unsupported",
               "cannot `crop`")  # 5.14's sliding-window layer refusing a crop once the window has slid


def declared_limit(exc: BaseException, package: str) -> Optional[str]:
    """The first line of `exc` when `package`'s own code raised it to refuse a use it does not
    support (prophetnet: "`use_cache` is only supported for `decoder_input_ids` of length 1");
    None for anything else, which stays a crash."""
    if raised_in(exc, package, through=()) is None:
        return None
    message = (str(exc).strip().splitlines() or [""])[0]
    if isinstance(exc, NotImplementedError) or (isinstance(exc, (AssertionError, ValueError)) and says_limit(message)):
        return f"{type(exc).__name__}: {message}"
    return None


def says_limit(message: str) -> bool:
    """Whether a message words a use as unsupported (`LIMIT_WORDS`): how their code declares a limit."""
    return any(w in message.lower() for w in LIMIT_WORDS)
