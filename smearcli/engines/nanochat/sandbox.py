"""Importing the `nanochat` package of a user's checkout, in isolation.

The checkout is never written to (no bytecode); sys.path, sys.modules, the import hooks
(sys.meta_path, sys.path_hooks), NANOCHAT_DTYPE, the root logger and stdout are restored
afterwards (the imported objects stay usable); upstream's attempt to fetch a flash-attention
kernel is blocked and its SDPA path forced; third-party modules the code imports but inference
never uses (upstream's common.py needs `filelock`, its engine.py pulls in the
tokenizer's `rustbpe` and `tiktoken`) are stood in for when missing, and named.

```python
from smearcli.engines.nanochat import sandbox
code = sandbox.import_nanochat("~/src/nanochat")
```
"""

from __future__ import annotations

import contextlib
import importlib
import inspect
import logging
import os
import sys
import types
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional, Sequence

import torch

from ...util.errors import UserError
from .guard import DEFAULT_TIMEOUT, user_code

PACKAGE = "nanochat"
FIRST_CAPTURE = "block0_in"  # the user's first capture point (see adapter.NanochatModel)
KVCACHE_ARGS = ("batch_size", "num_heads", "seq_len", "head_dim", "num_layers", "device", "dtype")
MAX_STAND_INS = 16
# upstream's flash_attention.py imports this on CUDA to download a kernel from the Hugging Face hub
BLOCKED = ("kernels",)


@dataclass
class NanochatCode:
    """The user's nanochat API, imported from a checkout, usable after the import is undone."""
    root: Path  # the checkout: root / "nanochat" / "gpt.py"
    GPT: type
    GPTConfig: type
    KVCache: type
    compute_dtype: torch.dtype
    dtype_source: str  # where compute_dtype came from
    attention: str  # which attention path the user's code runs
    stand_ins: list[str] = field(default_factory=list)  # missing third-party modules stood in for
    commit: Optional[str] = None  # the checkout's git HEAD, read from .git (git is never run)
    modules: dict = field(default_factory=dict, repr=False)  # name -> module, kept alive
    timeout: float = DEFAULT_TIMEOUT  # seconds each call into the code may take (guard.user_code)

    def info(self) -> dict:
        return {"path": str(self.root), "commit": self.commit, "attention": self.attention,
                "compute_dtype": str(self.compute_dtype).removeprefix("torch."),
                "dtype_source": self.dtype_source, "stand_ins": list(self.stand_ins),
                "first_capture": FIRST_CAPTURE}


class _Missing:
    """Stands in for a name from a module that is not installed; fails clearly if used."""

    def __init__(self, name: str):
        self._name = name

    def __call__(self, *args, **kwargs):
        raise UserError(f"your nanochat code used {self._name}, but {self._name.split('.')[0]!r} is "
                        f"not installed (the audit stood in for it at import time): install it")

    def __getattr__(self, attr):
        if attr.startswith("__"):
            raise AttributeError(attr)
        return _Missing(f"{self._name}.{attr}")


class _MissingModule(types.ModuleType):
    def __getattr__(self, attr):
        if attr.startswith("__"):
            raise AttributeError(attr)
        return _Missing(f"{self.__name__}.{attr}")


def _is_ours(name: str) -> bool:
    return name == PACKAGE or name.startswith(PACKAGE + ".")


def checkout_root(path) -> Path:
    """The directory holding nanochat/gpt.py; `path` may also be the nanochat/ package itself."""
    p = Path(os.path.expanduser(str(path)))
    try:
        if not p.is_dir():
            if p.exists():  # a file (a dangling link is not found)
                raise UserError(f"nanochat checkout {path}: not a directory; give the checkout (the "
                                f"directory holding {PACKAGE}/gpt.py)")
            raise UserError(f"nanochat checkout {path}: directory not found")
        return _checkout_root(p, path)
    except OSError as e:  # a name too long, a symlink loop
        raise UserError(f"nanochat checkout {path}: cannot read ({e.strerror or e})") from e


def _checkout_root(p: Path, path) -> Path:
    p = p.resolve()
    if not (p / PACKAGE).is_dir() and p.name == PACKAGE and (p / "gpt.py").is_file():
        p = p.parent
    pkg = p / PACKAGE
    missing = [f"{PACKAGE}/{f}" for f in ("gpt.py", "engine.py") if not (pkg / f).is_file()]
    if missing:
        raise UserError(f"{path}: not a nanochat checkout (no {' and no '.join(missing)} in {p})")
    return p


def git_commit(root: Path) -> Optional[str]:
    """HEAD of a checkout, read from its .git directory without running git (which may write)."""
    git = root / ".git"
    try:
        head = (git / "HEAD").read_text().strip()
        if not head.startswith("ref: "):
            return head or None
        ref = head[5:]
        if (git / ref).is_file():
            return (git / ref).read_text().strip() or None
        for line in (git / "packed-refs").read_text().splitlines():
            if line.endswith(" " + ref):
                return line.split()[0]
    except OSError:
        pass
    return None


@contextlib.contextmanager
def _isolated_import(root: Path, dtype: Optional[torch.dtype], block: Sequence[str]):
    """sys.path, sys.modules, the import hooks (sys.meta_path, sys.path_hooks and the finders
    cached for paths), bytecode writing, NANOCHAT_DTYPE, the root logger and stdout, all restored on
    exit; yields the dict of stand-in modules it may add to."""
    saved_modules = {k: sys.modules.pop(k) for k in list(sys.modules) if _is_ours(k)}
    saved_blocked = {k: sys.modules[k] for k in block if k in sys.modules}
    saved_path = list(sys.path)
    saved_hooks = (list(sys.meta_path), list(sys.path_hooks), dict(sys.path_importer_cache))
    saved_bytecode = sys.dont_write_bytecode
    saved_env = os.environ.get("NANOCHAT_DTYPE")
    saved_log = (list(logging.root.handlers), logging.root.level)
    stand_ins: dict[str, types.ModuleType] = {}
    try:
        sys.dont_write_bytecode = True  # never write __pycache__ into the user's checkout
        sys.path.insert(0, str(root))
        importlib.invalidate_caches()
        for k in block:
            sys.modules[k] = None  # makes `import kernels` fail: nothing is downloaded
        if dtype is not None:
            os.environ["NANOCHAT_DTYPE"] = str(dtype).removeprefix("torch.")
        with contextlib.redirect_stdout(sys.stderr):  # prints at import must not corrupt --json
            yield stand_ins
    finally:
        for k in [k for k in sys.modules if _is_ours(k)] + list(stand_ins) + list(block):
            sys.modules.pop(k, None)
        sys.modules.update(saved_modules)
        sys.modules.update(saved_blocked)
        sys.path[:] = saved_path
        sys.meta_path[:], sys.path_hooks[:] = saved_hooks[0], saved_hooks[1]  # no import hook of theirs stays
        sys.path_importer_cache.clear()
        sys.path_importer_cache.update(saved_hooks[2])
        sys.dont_write_bytecode = saved_bytecode
        if saved_env is None:
            os.environ.pop("NANOCHAT_DTYPE", None)
        else:
            os.environ["NANOCHAT_DTYPE"] = saved_env
        logging.root.handlers[:] = saved_log[0]
        logging.root.setLevel(saved_log[1])


def _import_with_stand_ins(root: Path, stand_ins: dict, timeout: float) -> tuple[types.ModuleType, types.ModuleType]:
    for _ in range(MAX_STAND_INS + 1):
        missing = None
        # their failures (an exception, sys.exit, an endless loop) are theirs: exit status 1
        with user_code(root, f"importing {PACKAGE}", timeout):
            try:
                return importlib.import_module(f"{PACKAGE}.gpt"), importlib.import_module(f"{PACKAGE}.engine")
            except ModuleNotFoundError as e:
                missing = e
        name = missing.name or ""
        if not name or _is_ours(name) or name.split(".")[0] == "torch" or name in stand_ins:
            raise UserError(f"nanochat checkout {root}: importing {PACKAGE} failed: {missing}") from missing
        stand_ins[name] = sys.modules[name] = _MissingModule(name)
    raise UserError(f"nanochat checkout {root}: importing {PACKAGE} needs more than {MAX_STAND_INS} "
                    f"missing modules ({', '.join(stand_ins)})")


def _api_gaps(gpt, engine) -> list[str]:
    """What the audit needs from the user's code and did not find, named."""
    gaps = []
    GPT, Config, Cache = (getattr(gpt, "GPT", None), getattr(gpt, "GPTConfig", None),
                          getattr(engine, "KVCache", None))
    for obj, name in ((GPT, "nanochat.gpt.GPT"), (Config, "nanochat.gpt.GPTConfig"),
                      (Cache, "nanochat.engine.KVCache")):
        if not isinstance(obj, type):
            gaps.append(name)
    if isinstance(GPT, type):
        for meth in ("init_weights", "forward"):
            if not callable(getattr(GPT, meth, None)):
                gaps.append(f"GPT.{meth}()")
        fwd = getattr(GPT, "forward", None)
        if callable(fwd) and "kv_cache" not in inspect.signature(fwd).parameters:
            gaps.append("GPT.forward(..., kv_cache=...)")
    if isinstance(Cache, type):
        for meth in ("prefill", "get_pos"):
            if not callable(getattr(Cache, meth, None)):
                gaps.append(f"KVCache.{meth}()")
        params = inspect.signature(Cache.__init__).parameters
        missing = [a for a in KVCACHE_ARGS if a not in params]
        if missing:
            gaps.append(f"KVCache({', '.join(missing)}=...)")
    return gaps


def _compute_dtype(modules: dict, requested: Optional[torch.dtype]) -> tuple[torch.dtype, str]:
    """Upstream fixes its compute dtype at import, as COMPUTE_DTYPE in nanochat.common (and
    imported into nanochat.gpt); a code base without one is taken to compute in `requested`."""
    for name in (f"{PACKAGE}.gpt", f"{PACKAGE}.common"):
        value = getattr(modules.get(name), "COMPUTE_DTYPE", None)
        if isinstance(value, torch.dtype):
            return value, f"{name}.COMPUTE_DTYPE"
    return (requested or torch.float32), "assumed: the code defines no COMPUTE_DTYPE"


@contextlib.contextmanager
def computing_in(code: NanochatCode, dtype: torch.dtype):
    """The body runs with the code's COMPUTE_DTYPE set to `dtype` in every module of it that holds
    one, and the values they had put back afterwards. Upstream reads that module constant at call
    time: it casts activations and the rotary table to it and asserts that the table is in it
    (nanochat/gpt.py, `GPT.forward`), so a float64 copy of their GPT runs only with it set to
    float64. Process-wide, like `precision.lifted()`, under which the float64 copy runs."""
    saved = [(m, m.COMPUTE_DTYPE) for m in code.modules.values()
             if isinstance(getattr(m, "COMPUTE_DTYPE", None), torch.dtype)]
    for m, _ in saved:
        m.COMPUTE_DTYPE = dtype
    try:
        yield
    finally:
        for m, value in saved:
            m.COMPUTE_DTYPE = value


def _attention_path(modules: dict, attention: str) -> str:
    fa = modules.get(f"{PACKAGE}.flash_attention")
    if fa is None or not hasattr(fa, "USE_FA3"):
        return "the code's own (no nanochat.flash_attention.USE_FA3)"
    if attention == "sdpa":
        if hasattr(fa, "_override_impl"):
            fa._override_impl = "sdpa"
        fa.USE_FA3 = False
        return "sdpa (forced; FA3 not loaded)"
    return "fa3" if fa.USE_FA3 else "sdpa"


def import_nanochat(path, dtype: Optional[torch.dtype] = None, attention: str = "sdpa",
                    timeout: float = DEFAULT_TIMEOUT) -> NanochatCode:
    """Import `nanochat.gpt` and `nanochat.engine` from the checkout at `path`, in isolation.

    `dtype` is asked of the code through NANOCHAT_DTYPE (upstream's override); if the code ends
    up computing in another dtype, that is a UserError. `attention="sdpa"` (the default) blocks
    upstream's flash-attention kernel download and forces its SDPA path; "auto" leaves the
    choice to the user's code (on CUDA upstream may then fetch a kernel over the network).
    `timeout`: seconds the import, and later each call into the code, may take (guard.user_code)."""
    if attention not in ("sdpa", "auto"):
        raise ValueError(f"attention must be 'sdpa' or 'auto', got {attention!r}")
    root = checkout_root(path)
    block = BLOCKED if attention == "sdpa" else ()
    with _isolated_import(root, dtype, block) as stand_ins:
        gpt, engine = _import_with_stand_ins(root, stand_ins, timeout)
        modules = {k: m for k, m in sys.modules.items() if _is_ours(k) and m is not None}
        for name, mod in (("gpt", gpt), ("engine", engine)):
            where = Path(getattr(mod, "__file__", "") or "").resolve()
            if root not in where.parents:
                raise UserError(f"nanochat checkout {root}: nanochat.{name} was imported from {where}, "
                                f"not from the checkout")
        gaps = _api_gaps(gpt, engine)
        if gaps:
            raise UserError(f"nanochat checkout {root}: its nanochat API differs from upstream's: "
                            f"missing {', '.join(gaps)}")
        compute_dtype, source = _compute_dtype(modules, dtype)
        attn = _attention_path(modules, attention)
    if dtype is not None and compute_dtype != dtype:
        name = str(compute_dtype).removeprefix("torch.")
        raise UserError(f"nanochat checkout {root}: the code computes in {name} ({source}), not in "
                        f"{str(dtype).removeprefix('torch.')} as asked: compute in {name} instead")
    return NanochatCode(root, gpt.GPT, gpt.GPTConfig, engine.KVCache, compute_dtype, source, attn,
                        sorted(stand_ins), git_commit(root), modules, timeout)

