"""Audit a nanochat code base: run the schedules on the user's own `GPT` and `KVCache`.

smearcli's own model answers "how big is the bug on this checkpoint"; this module answers "does
*this code* have the bug, and did my fix work". It imports the `nanochat` package of a checkout,
builds the user's model the way upstream does (on the meta device, `to_empty`, `init_weights`,
`load_state_dict(strict=True, assign=True)`), wraps it so `smearcli.schedules` can drive it, and
measures every schedule against the user's own full forward pass:

    from smearcli import audit, models
    code = audit.import_nanochat("~/src/nanochat")
    ours = models.random_model(seed=0).model
    theirs = audit.nanochat_from_model(code, ours)
    a = audit.audit(theirs, tokens, reference=ours)
    print(a.verdict)

Importing the user's code is done in isolation: the checkout is never written to (no bytecode),
sys.path and sys.modules are restored afterwards (the objects stay usable), upstream's attempt
to fetch a flash-attention kernel is blocked and its SDPA path forced, and third-party modules
the code imports but inference never uses (upstream's common.py needs `filelock`, its engine.py
pulls in the tokenizer's `rustbpe` and `tiktoken`) are stood in for when missing, and named.

What is captured: upstream's post-smear embedding is not the output of any module, so the first
capture point here is the input of block 0 (`block0_in`), which equals
(resid_lambdas[0] + x0_lambdas[0]) x the post-smear embedding; then every block's output and the
logits, as for our own model.
"""

from __future__ import annotations

import contextlib
import dataclasses
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
import torch.nn.functional as F
from torch import Tensor

from . import compare as cmp
from .config import ConfigError, GPTConfig
from .errors import UserError
from .metrics import NOISE_MARGIN, AnalyticCheck, RunMetrics
from .names import LOGIC_NAMES
from .schedules import ScheduleOptions

PACKAGE = "nanochat"
USER_LOGIC = "yours"  # the label of the user's runs: their code has its own smear logic
FIRST_CAPTURE = "block0_in"  # the user's first capture point (see the module docstring)
SCHEMA = "smearcli.audit/1"
KVCACHE_ARGS = ("batch_size", "num_heads", "seq_len", "head_dim", "num_layers", "device", "dtype")
SMEAR_CHANNELS = 24
MAX_STAND_INS = 16
# upstream's flash_attention.py imports this on CUDA to download a kernel from the Hugging Face hub
BLOCKED = ("kernels",)


# ---------------------------------------------------------------------------------------------
# Importing the user's code
# ---------------------------------------------------------------------------------------------

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
    if not p.is_dir():
        raise UserError(f"--nanochat-path {path}: directory not found")
    p = p.resolve()
    if not (p / PACKAGE).is_dir() and p.name == PACKAGE and (p / "gpt.py").is_file():
        p = p.parent
    pkg = p / PACKAGE
    missing = [f"{PACKAGE}/{f}" for f in ("gpt.py", "engine.py") if not (pkg / f).is_file()]
    if missing:
        raise UserError(f"--nanochat-path {path}: not a nanochat checkout (no {' and no '.join(missing)} in {p})")
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
    """sys.path, sys.modules, bytecode writing, NANOCHAT_DTYPE, the root logger and stdout, all
    restored on exit; yields the dict of stand-in modules it may add to."""
    saved_modules = {k: sys.modules.pop(k) for k in list(sys.modules) if _is_ours(k)}
    saved_blocked = {k: sys.modules[k] for k in block if k in sys.modules}
    saved_path = list(sys.path)
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
        sys.path_importer_cache.pop(str(root), None)
        sys.dont_write_bytecode = saved_bytecode
        if saved_env is None:
            os.environ.pop("NANOCHAT_DTYPE", None)
        else:
            os.environ["NANOCHAT_DTYPE"] = saved_env
        logging.root.handlers[:] = saved_log[0]
        logging.root.setLevel(saved_log[1])


def _import_with_stand_ins(root: Path, stand_ins: dict) -> tuple[types.ModuleType, types.ModuleType]:
    for _ in range(MAX_STAND_INS + 1):
        try:
            return importlib.import_module(f"{PACKAGE}.gpt"), importlib.import_module(f"{PACKAGE}.engine")
        except ModuleNotFoundError as e:
            name = e.name or ""
            if not name or _is_ours(name) or name.split(".")[0] == "torch" or name in stand_ins:
                raise UserError(f"--nanochat-path {root}: importing {PACKAGE} failed: {e}") from e
            stand_ins[name] = sys.modules[name] = _MissingModule(name)
        except UserError:
            raise
        except Exception as e:  # noqa: BLE001 - any failure inside the user's code is theirs
            raise UserError(f"--nanochat-path {root}: importing {PACKAGE} failed: "
                            f"{type(e).__name__}: {e}") from e
    raise UserError(f"--nanochat-path {root}: importing {PACKAGE} needs more than {MAX_STAND_INS} "
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


def import_nanochat(path, dtype: Optional[torch.dtype] = None, attention: str = "sdpa") -> NanochatCode:
    """Import `nanochat.gpt` and `nanochat.engine` from the checkout at `path`, in isolation.

    `dtype` is asked of the code through NANOCHAT_DTYPE (upstream's override); if the code ends
    up computing in another dtype, that is a UserError. `attention="sdpa"` (the default) blocks
    upstream's flash-attention kernel download and forces its SDPA path; "auto" leaves the
    choice to the user's code (on CUDA upstream may then fetch a kernel over the network)."""
    if attention not in ("sdpa", "auto"):
        raise ValueError(f"attention must be 'sdpa' or 'auto', got {attention!r}")
    root = checkout_root(path)
    block = BLOCKED if attention == "sdpa" else ()
    with _isolated_import(root, dtype, block) as stand_ins:
        gpt, engine = _import_with_stand_ins(root, stand_ins)
        modules = {k: m for k, m in sys.modules.items() if _is_ours(k) and m is not None}
        for name, mod in (("gpt", gpt), ("engine", engine)):
            where = Path(getattr(mod, "__file__", "") or "").resolve()
            if root not in where.parents:
                raise UserError(f"--nanochat-path {root}: nanochat.{name} was imported from {where}, "
                                f"not from the checkout")
        gaps = _api_gaps(gpt, engine)
        if gaps:
            raise UserError(f"--nanochat-path {root}: its nanochat API differs from upstream's: "
                            f"missing {', '.join(gaps)}")
        compute_dtype, source = _compute_dtype(modules, dtype)
        attn = _attention_path(modules, attention)
    if dtype is not None and compute_dtype != dtype:
        name = str(compute_dtype).removeprefix("torch.")
        raise UserError(f"--nanochat-path {root}: the code computes in {name} ({source}), not in "
                        f"{str(dtype).removeprefix('torch.')} as asked: pass --dtype {name}")
    return NanochatCode(root, gpt.GPT, gpt.GPTConfig, engine.KVCache, compute_dtype, source, attn,
                        sorted(stand_ins), git_commit(root), modules)


# ---------------------------------------------------------------------------------------------
# The user's model, driven by smearcli's schedules
# ---------------------------------------------------------------------------------------------

class NanochatCache:
    """smearcli's cache interface over the user's KVCache."""

    def __init__(self, inner):
        self.inner = inner

    def get_pos(self) -> int:
        return int(self.inner.get_pos())

    @property
    def prev_embedding(self):
        return self.inner.prev_embedding

    def expand_from(self, other: "NanochatCache") -> None:
        self.inner.prefill(other.inner)  # the user's own engine-style expansion


def _first_tensor(x):
    if isinstance(x, Tensor):
        return x
    if isinstance(x, (tuple, list)) and x and isinstance(x[0], Tensor):
        return x[0]
    raise UserError(f"a block of your model returned {type(x).__name__}, not a tensor")


class NanochatModel:
    """The user's GPT behind the interface `smearcli.schedules` drives: `model(idx, cache=,
    smear=, capture=)`, `new_cache`, `config`, `dtype`, `device`.

    `smear` is ignored: the user's code has its own logic. `capture` receives fp32 copies of
    block 0's input and of every block's output, from forward hooks (nothing is patched)."""

    def __init__(self, code: NanochatCode, net: torch.nn.Module):
        self.code = code
        self.net = net
        self.dtype = code.compute_dtype
        blocks = getattr(getattr(net, "transformer", None), "h", None)
        if not isinstance(blocks, torch.nn.ModuleList) or len(blocks) == 0:
            raise UserError(f"--nanochat-path {code.root}: its GPT has no transformer.h (the list of blocks)")
        self.blocks = list(blocks)
        self.config = _our_config(net.config, code.root)
        if len(self.blocks) != self.config.n_layer:
            raise UserError(f"--nanochat-path {code.root}: transformer.h has {len(self.blocks)} blocks, "
                            f"config.n_layer is {self.config.n_layer}")

    @property
    def device(self) -> torch.device:
        return next(self.net.parameters()).device

    @property
    def smear_lambda(self) -> Tensor:
        lam = getattr(self.net, "smear_lambda", None)
        return lam if isinstance(lam, Tensor) else torch.full((1,), float("nan"))

    def new_cache(self, batch_size: int, max_len: int) -> NanochatCache:
        c = self.config
        inner = self.code.KVCache(batch_size=batch_size, num_heads=c.n_kv_head, seq_len=max_len,
                                  head_dim=c.head_dim, num_layers=c.n_layer, device=self.device,
                                  dtype=self.dtype)
        if not hasattr(inner, "prev_embedding"):
            raise UserError(f"--nanochat-path {self.code.root}: its KVCache has no prev_embedding "
                            f"(where upstream keeps the smear state)")
        return NanochatCache(inner)

    def __call__(self, idx: Tensor, cache: Optional[NanochatCache] = None, smear=None,
                 capture: Optional[list] = None) -> Tensor:
        hooks = []
        if capture is not None:
            def grab_input(module, args, kwargs):
                capture.append(_first_tensor(args if args else list(kwargs.values())).float().clone())

            def grab_output(module, args, out):
                capture.append(_first_tensor(out).float().clone())

            hooks.append(self.blocks[0].register_forward_pre_hook(grab_input, with_kwargs=True))
            hooks += [b.register_forward_hook(grab_output) for b in self.blocks]
        try:
            return self.net(idx, kv_cache=None if cache is None else cache.inner)
        finally:
            for h in hooks:
                h.remove()


def _our_config(cfg, root: Path) -> GPTConfig:
    """Our GPTConfig (shapes, rotary length) from the user's config object."""
    d = dataclasses.asdict(cfg) if dataclasses.is_dataclass(cfg) else dict(vars(cfg))
    known = {f.name for f in dataclasses.fields(GPTConfig)}
    try:
        return GPTConfig.from_dict({k: v for k, v in d.items() if k in known})
    except ConfigError as e:
        raise UserError(f"--nanochat-path {root}: its model config: {e}") from e


def build_nanochat_model(code: NanochatCode, model_config: dict, state_dict: dict,
                         device) -> NanochatModel:
    """Build the user's GPT the way upstream does and load `state_dict` with strict=True."""
    device = torch.device(device)
    try:
        config = code.GPTConfig(**model_config)
    except TypeError as e:
        raise UserError(f"--nanochat-path {code.root}: GPTConfig does not take this model_config: {e}") from e
    devices = [device] if device.type == "cuda" else []
    try:
        # init_weights draws from the global RNG: leave the rest of the run's RNG untouched
        with contextlib.redirect_stdout(sys.stderr), torch.random.fork_rng(devices=devices):
            with torch.device("meta"):
                net = code.GPT(config)
            net.to_empty(device=device)
            net.init_weights()
            net.load_state_dict(state_dict, strict=True, assign=True)
    except UserError:
        raise
    except Exception as e:  # noqa: BLE001 - any failure here is the user's code meeting these weights
        msg = " ".join(str(e).split())
        raise UserError(f"--nanochat-path {code.root}: building its GPT failed: {type(e).__name__}: "
                        f"{msg[:400]}") from e
    net.eval().requires_grad_(False)
    return NanochatModel(code, net)


def nanochat_from_model(code: NanochatCode, model) -> NanochatModel:
    """The user's GPT with exactly the weights of our `model` (same config, strict=True)."""
    sd = {k: v.detach().clone() for k, v in model.state_dict().items()}
    return build_nanochat_model(code, model.config.to_dict(), sd, model.device)


def nanochat_from_checkpoint(code: NanochatCode, ckpt_dir, step: Optional[int] = None,
                             device="cpu"):
    """Load a nanochat checkpoint into the user's GPT as upstream's checkpoint_manager does (but
    with torch.load(weights_only=True)); returns (model, step, meta)."""
    from .models import _read_meta, _read_state_dict, list_steps

    ckpt_dir = Path(os.path.expanduser(str(ckpt_dir)))
    if not ckpt_dir.is_dir():
        raise UserError(f"{ckpt_dir}: checkpoint directory not found")
    steps = list_steps(ckpt_dir)
    if not steps:
        raise UserError(f"{ckpt_dir}: no model_XXXXXX.pt / meta_XXXXXX.json pair found")
    if step is None:
        step = steps[-1]
    elif step not in steps:
        raise UserError(f"{ckpt_dir}: no step {step}; present: {', '.join(map(str, steps))}")
    meta = _read_meta(ckpt_dir / f"meta_{step:06d}.json")
    config = dict(meta["model_config"])
    config.setdefault("window_pattern", "L")  # checkpoints older than sliding windows
    sd = _read_state_dict(ckpt_dir / f"model_{step:06d}.pt")
    n_layer = int(config.get("n_layer", 0))
    sd.setdefault("resid_lambdas", torch.ones(n_layer))
    sd.setdefault("x0_lambdas", torch.zeros(n_layer))
    dev = torch.device(device)
    if dev.type in ("cpu", "mps"):
        sd = {k: v.float() if v.dtype == torch.bfloat16 else v for k, v in sd.items()}
    sd = {k: v.to(dev) for k, v in sd.items()}
    return build_nanochat_model(code, config, sd, dev), step, meta


def attach(spec, loaded, device, dtype):
    """setup.build_setup's step for --impl nanochat|both: import the user's code and build their
    model, from our model's weights (random, tiny) or from --checkpoint the way upstream loads it.

    Returns (loaded, audited, logics): with --impl nanochat, `loaded` wraps the user's model and
    the one logic is theirs; with --impl both, `loaded` stays ours and runs old and fixed."""
    from .models import LoadedModel

    impl = getattr(spec.impl, "value", spec.impl)
    code = import_nanochat(spec.nanochat_path, dtype=dtype)
    if spec.checkpoint is not None:
        theirs, step, meta = nanochat_from_checkpoint(code, spec.checkpoint, spec.step, device)
        source = str(Path(os.path.expanduser(str(spec.checkpoint))))
    else:
        theirs = nanochat_from_model(code, loaded.model)
        source, step, meta = loaded.source, loaded.step, loaded.meta
    if impl == "nanochat":
        return LoadedModel(theirs, source, step, meta), theirs, [USER_LOGIC]
    return loaded, theirs, ["old", "fixed"]


# ---------------------------------------------------------------------------------------------
# The audit
# ---------------------------------------------------------------------------------------------

@torch.inference_mode()
def analytic_check(model: NanochatModel, tokens: Tensor, ref, run) -> list[AnalyticCheck]:
    """At each chunk start t, a code with the old smear misses (r0 + l0) * gate_t * x_{t-1} at
    block 0's input (r0, l0: resid_lambdas[0], x0_lambdas[0]). Empty when the model lacks the
    upstream parameter names or the run has no chunk starts."""
    net = model.net
    names = ("transformer", "smear_gate", "smear_lambda", "resid_lambdas", "x0_lambdas")
    if (ref.hiddens is None or run.hiddens is None or run.row_map != ref.row_map
            or not all(hasattr(net, n) for n in names)):
        return []
    tokens = tokens.to(model.device)
    x = net.transformer.wte(tokens).to(model.dtype)
    x = F.rms_norm(x, (x.size(-1),))  # the pre-smear embedding (B, T, C)
    gate = net.smear_lambda.to(x.dtype) * torch.sigmoid(net.smear_gate(x[..., :SMEAR_CHANNELS]))
    scale = (net.resid_lambdas[0] + net.x0_lambdas[0]).float()
    out = []
    for t in run.chunk_starts:
        term = scale * (gate[:, t] * x[:, t - 1]).float()
        diff = ref.hiddens[0][:, t] - run.hiddens[0][:, t]
        out.append(AnalyticCheck(t, float(term.abs().max()), float(diff.abs().max()),
                                 float((diff - term).abs().max())))
    return out


@dataclass
class Finding:
    kind: str  # "chunk-smear", "engine-expansion" or "divergence"
    runs: list[str]  # schedules
    text: str


@dataclass
class ScheduleLikeness:
    schedule: str
    separation: float  # ours/old vs ours/fixed per-position logits error, max, x noise
    to_old: float  # the user's per-position logits error vs ours/old, max, x noise
    to_fixed: float
    like: str  # "old", "fixed", "both" (the logics agree here and so does the code), "neither"

    @property
    def informative(self) -> bool:
        return self.separation > 2 * NOISE_MARGIN


@dataclass
class Likeness:
    """Which of our logics the user's code behaves like, from per-position error patterns."""
    behaves_like: str  # "old", "fixed", "neither" or "undetermined"
    schedules: list[ScheduleLikeness]
    noise: float  # the larger of the two logits noise floors: the unit of every distance
    full_forward_diff: float  # max |user full - ours full| logits: do the two models agree at all
    summary: str


def _g(x: float) -> str:
    """Compact scientific notation: 0.91 -> 9.1e-1, 42000 -> 4.2e4."""
    if x == 0:
        return "0"
    if x != x:
        return "nan"
    m, e = f"{x:.1e}".split("e")
    return f"{m}e{int(e)}"


def likeness(user: cmp.Comparison, ours: cmp.Comparison, margin: float = NOISE_MARGIN) -> Likeness:
    noise = max(user.noise.per_layer[-1], ours.noise.per_layer[-1])
    rows = []
    for m in user.metrics:
        try:
            old, fixed = ours.get(m.schedule, "old"), ours.get(m.schedule, "fixed")
        except KeyError:
            continue
        e = m.abs_err[-1]
        sep = float((old.abs_err[-1] - fixed.abs_err[-1]).abs().max()) / noise
        d_old = float((e - old.abs_err[-1]).abs().max()) / noise
        d_fixed = float((e - fixed.abs_err[-1]).abs().max()) / noise
        if sep > 2 * margin:
            like = "old" if d_old <= margin else "fixed" if d_fixed <= margin else "neither"
        else:
            like = "both" if min(d_old, d_fixed) <= margin else "neither"
        rows.append(ScheduleLikeness(m.schedule, sep, d_old, d_fixed, like))
    full_diff = float((user.reference.logits - ours.reference.logits.to(user.reference.logits.device)).abs().max())
    informative = [r for r in rows if r.informative]
    labels = {r.like for r in informative}
    if not informative:
        behaves = "neither" if any(r.like == "neither" for r in rows) else "undetermined"
    elif len(labels) == 1 and labels <= {"old", "fixed"}:
        behaves = labels.pop()
    else:
        behaves = "neither"
    names = ", ".join(r.schedule for r in informative)
    if behaves in ("old", "fixed"):
        near = max(getattr(r, f"to_{behaves}") for r in informative)
        other = "fixed" if behaves == "old" else "old"
        far = min(getattr(r, f"to_{other}") for r in informative)
        close = "identical to" if near == 0 else f"within {_g(near)}x noise of"
        summary = (f"your code behaves like the {behaves}{' (buggy)' if behaves == 'old' else ''} logic: "
                   f"on {names} its per-position error is {close} ours/{behaves} "
                   f"and at least {_g(far)}x noise from ours/{other}")
    elif behaves == "undetermined":
        summary = ("no schedule in this run tells the old logic from the fixed one "
                   "(add chunked or speculative to --schedules)")
    else:
        odd = [r for r in rows if r.like == "neither"] or informative
        summary = ("your code behaves like neither logic: on " + ", ".join(
            f"{r.schedule} its per-position error is {_g(r.to_old)}x noise from ours/old and "
            f"{_g(r.to_fixed)}x from ours/fixed" for r in odd))
    deviant = [r.schedule for r in rows if not r.informative and r.like == "neither"]
    if behaves in ("old", "fixed") and deviant:
        summary += f"; it also departs from both on {', '.join(deviant)}"
    return Likeness(behaves, rows, noise, full_diff, summary)


@dataclass
class Audit:
    model: NanochatModel
    comparison: cmp.Comparison  # the user's code: every schedule against its own full forward
    ours: Optional[cmp.Comparison] = None  # our model on the same weights and tokens (--impl both)
    likeness: Optional[Likeness] = None

    @property
    def failed(self) -> bool:
        return bool(self.comparison.failures)

    @property
    def findings(self) -> list[Finding]:
        return findings(self.comparison)

    @property
    def verdict(self) -> str:
        return audit_verdict(self.comparison)


def audit(model: NanochatModel, tokens: Tensor, schedules: Sequence[str] = cmp.DEFAULT_SCHEDULES,
          options: ScheduleOptions = ScheduleOptions(), tolerance: float = NOISE_MARGIN,
          reference=None, progress=None) -> Audit:
    """Run every schedule on the user's code; with `reference` (our GPT with the same weights),
    also run ours under both logics and say which one the user's code behaves like."""
    c = cmp.compare(model, tokens, schedules, [USER_LOGIC], options, tolerance, progress)
    c.layers[0] = FIRST_CAPTURE
    checks = {m.schedule: analytic_check(model, c.tokens, c.reference, r)
              for m, r in zip(c.metrics, c.runs) if not m.passed and r.chunk_starts}
    c.analytic = {k: v for k, v in checks.items() if v}
    ours = like = None
    if reference is not None:
        ours = cmp.compare(reference, tokens, schedules, LOGIC_NAMES, options, tolerance, progress)
        like = likeness(c, ours, tolerance)
    return Audit(model, c, ours, like)


def merged(a: Audit) -> cmp.Comparison:
    """One Comparison holding ours (old, fixed) and the user's runs (logic "yours"), for figures.
    Reference, noise floor and model are ours; each run keeps its own metrics. The first capture
    point is our post-smear embedding and the user's block-0 input, so it is named for both."""
    if a.ours is None:
        return a.comparison
    o = a.ours
    layers = [f"emb | {FIRST_CAPTURE}"] + list(o.layers[1:])
    return cmp.Comparison(o.model, o.tokens, o.options, layers, o.noise, o.reference,
                          o.runs + a.comparison.runs, o.metrics + a.comparison.metrics,
                          dict(o.analytic), o.tolerance)


def for_plot(setup, schedule: str, tolerance: float = NOISE_MARGIN, progress=None):
    """`smearcli plot` with --impl nanochat|both: (the Comparison to draw, the audit verdict)."""
    reference = setup.model if setup.impl == "both" else None
    a = audit(setup.audited, setup.tokens, [schedule], setup.options, tolerance, reference, progress)
    return merged(a), a.verdict


def _at_starts(m: RunMetrics) -> float:
    return float(m.abs_err[-1][m.chunk_starts].max()) if m.chunk_starts else 0.0


def findings(c: cmp.Comparison) -> list[Finding]:
    """What is wrong with the user's code, one finding per kind of failure."""
    noise = c.noise.per_layer[-1]
    chunk, engine, other = [], [], []
    for m, r in zip(c.metrics, c.runs):
        if m.passed:
            continue
        fd = m.first_departure
        if fd is not None and fd[0] == 0 and fd[1] in m.chunk_starts:
            chunk.append(m)
        elif fd is not None and m.schedule == "engine" and r.expand_at is not None and fd[1] == r.expand_at:
            engine.append((m, r))
        else:
            other.append(m)
    out = []
    if chunk:
        worst = max(chunk, key=_at_starts)
        err = _at_starts(worst)
        text = (f"your code has the chunk-boundary smear bug: error {_g(err)} at chunk starts, "
                f"{_g(err / noise)} x noise floor ({', '.join(m.schedule for m in chunk)})")
        checks = [a for m in chunk for a in c.analytic.get(m.schedule, [])]
        if checks and max(a.residual for a in checks) <= 1e-3 * max(a.predicted for a in checks):
            text += "; at every chunk start the error is exactly the dropped smear term gate*x_prev"
        out.append(Finding("chunk-smear", [m.schedule for m in chunk], text))
    if engine:
        m, r = engine[0]
        err = float(m.abs_err[-1][r.expand_at])
        out.append(Finding("engine-expansion", ["engine"],
                           f"your code loses the smear state when the engine copies its cache: error "
                           f"{_g(err)} at position {r.expand_at} (the first token after the copy), "
                           f"{_g(err / noise)} x noise floor"))
    if other:
        worst = max(other, key=lambda m: m.max_abs_logits)
        fd = worst.first_departure
        born = f", born at {c.layers[fd[0]]}@{fd[1]}" if fd else ""
        out.append(Finding("divergence", [m.schedule for m in other],
                           f"your code diverges from its own full forward pass on "
                           f"{', '.join(m.schedule for m in other)}: max |dlogit| {_g(worst.max_abs_logits)}, "
                           f"{_g(worst.logits_multiple)} x noise floor{born}"))
    return out


def audit_verdict(c: cmp.Comparison) -> str:
    found = findings(c)
    if found:
        return "; ".join(f.text for f in found)
    names = ", ".join(m.schedule for m in c.metrics)
    worst = max((m.max_abs_logits for m in c.metrics), default=0.0)
    msg = (f"your code is consistent across all schedules ({names}): max |dlogit| {_g(worst)}, "
           f"within {c.tolerance:g}x the noise floor")
    if not any(m.chunk_starts for m in c.metrics):
        msg += " (no schedule here feeds several tokens to a non-empty cache: add chunked to test for the bug)"
    lam = c.model.smear_lambda.detach()
    if bool((lam == 0).all()):
        msg += " (smear_lambda is 0: this model cannot show the bug)"
    return msg


# ---------------------------------------------------------------------------------------------
# Output: JSON, --save payload, console
# ---------------------------------------------------------------------------------------------

def to_json(a: Audit, model_info: Optional[dict] = None) -> dict:
    """The `--json` document of an audit (schema "smearcli.audit/1"): the user's code and, with
    --impl both, ours, each as a full "smearcli.compare/1" document."""
    info = {**(model_info or {}), "impl": "nanochat"}
    doc = {
        "schema": SCHEMA,
        "impl": "both" if a.ours is not None else "nanochat",
        "code": a.model.code.info(),
        "nanochat": cmp.to_json(a.comparison, info),
        "ours": None if a.ours is None else cmp.to_json(a.ours, {**(model_info or {}), "impl": "ours"}),
        "likeness": None,
        "findings": [{"kind": f.kind, "schedules": f.runs, "text": f.text} for f in a.findings],
        "passed": not a.failed,
        "verdict": a.verdict,
    }
    if a.likeness is not None:
        lk = a.likeness
        doc["likeness"] = {
            "behaves_like": lk.behaves_like,
            "noise": float(f"{lk.noise:.6g}"),
            "full_forward_max_abs": float(f"{lk.full_forward_diff:.6g}"),
            "schedules": [{"schedule": r.schedule, "informative": r.informative, "like": r.like,
                           "separation": float(f"{r.separation:.6g}"), "to_old": float(f"{r.to_old:.6g}"),
                           "to_fixed": float(f"{r.to_fixed:.6g}")} for r in lk.schedules],
            "summary": lk.summary,
        }
    return doc


def save_payload(a: Audit, model_info: Optional[dict] = None) -> dict:
    """What `--save` writes: the JSON document, the tokens and every run's logits."""
    payload = {"meta": to_json(a, model_info), "tokens": a.comparison.tokens.cpu(),
               "logits_full": a.comparison.reference.logits.cpu()}
    for r in a.comparison.runs:
        payload[f"logits_{r.schedule}_{r.logic}"] = r.logits.cpu()
    if a.ours is not None:
        payload["logits_ours_full"] = a.ours.reference.logits.cpu()
        for r in a.ours.runs:
            payload[f"logits_ours_{r.schedule}_{r.logic}"] = r.logits.cpu()
    return payload


def print_audit(a: Audit, console, title: str = "") -> None:
    from .report import _sci, comparison_table, print_analytic

    code = a.model.code
    c = a.comparison
    where = f"{code.root}" + (f" @ {code.commit[:12]}" if code.commit else "")
    console.print(comparison_table(c, f"your code ({where}): {title}"))
    if a.ours is not None:
        console.print(comparison_table(a.ours, "smearcli's reference implementation, same weights and tokens"))
    console.print(f"noise floor (logits): {_sci(c.noise.per_layer[-1])} (your code, decode vs full); a run "
                  f"passes within {c.tolerance:g}x.")
    console.print(f"your code ran with attention {code.attention}, compute dtype "
                  f"{str(code.compute_dtype).removeprefix('torch.')} ({code.dtype_source}).")
    console.print(f"{FIRST_CAPTURE}: block 0's input = (resid_lambdas[0] + x0_lambdas[0]) x the post-smear "
                  f"embedding, which no hook can see.")
    if code.stand_ins:
        console.print(f"stood in at import for modules that are not installed and that inference does not "
                      f"use: {', '.join(code.stand_ins)}")
    print_analytic(c.analytic, console, FIRST_CAPTURE, "vs (r0 + l0)*gate*x_prev: residual at most")
    if a.likeness is not None:
        lk = a.likeness
        console.print(f"full forward pass, your code vs ours: max |Δlogit| {_sci(lk.full_forward_diff)} "
                      f"({_g(lk.full_forward_diff / lk.noise)}x noise)")
        console.print(f"[bold]{lk.summary}[/]")
    style = "bold red" if a.failed else "bold green"
    console.print(f"[{style}]{a.verdict}[/]")
