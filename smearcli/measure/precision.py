"""Float64 on demand: the precision lift and float64 forms of a model (no smearcli imports).

`lifted()` runs code with every float32 request inside it turned into a float64 one
(`PrecisionLift`) and float64 as the default dtype; `float64_model(model)` is a float64 copy with
MoE experts made eager; `in_float64(modules)` switches modules a callable reaches
(`modules_in(fn)`) to float64 for a while and back to the very tensors they had. `smearcli.judging.evidence`
builds its floor and its confirmation on them; `runner.StepRunner.float64` uses them directly.
"""

from __future__ import annotations

import contextlib
import copy
import threading
import types

import torch
from torch import Tensor
from torch.overrides import TorchFunctionMode

_F32, _F64, _FLOAT = torch.float32, torch.float64, Tensor.float
_LIFT_LOCK = threading.Lock()  # the default dtype is process-wide: one lifted run at a time


class PrecisionLift(TorchFunctionMode):
    """Inside it, a float32 request becomes a float64 one: `dtype=torch.float32` arguments,
    `torch.float32` passed positionally (`x.to(torch.float32)`), and `Tensor.float()`. Models
    compute routers, rotary tables and softmax in float32 whatever their dtype; without the lift
    those islands keep float32 rounding in a float64 run, and rounding would pass for a logic
    error."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        # every torch call of a lifted run passes here (about a million in one census check), so
        # the common case, nothing to lift, copies nothing
        if func is _FLOAT:  # x.float(): the upcast idiom
            return args[0].double()
        if not kwargs:
            kwargs = {}
        elif kwargs.get("dtype") is _F32:
            kwargs = {**kwargs, "dtype": _F64}
        for a in args:
            if a is _F32:
                args = tuple(_F64 if b is _F32 else b for b in args)
                break
        return func(*args, **kwargs)


@contextlib.contextmanager
def lifted():
    """Run the body with float32 requests mapped to float64 (`PrecisionLift`) and float64 as the
    default dtype (tensors made without a dtype: `torch.zeros(n)`, `torch.tensor([0.5])`)."""
    with _LIFT_LOCK:
        before = torch.get_default_dtype()
        torch.set_default_dtype(torch.float64)
        try:
            with PrecisionLift():
                yield
        finally:
            torch.set_default_dtype(before)


def modules_in(fn, depth: int = 2) -> list[torch.nn.Module]:
    """The torch modules a callable reaches: itself, a bound method's object, a partial's
    arguments, its closure's cells and defaults, the globals its code names (and one level inside
    objects found there)."""
    seen: dict[int, torch.nn.Module] = {}

    def visit(obj, d):
        if obj is None or d < 0:
            return
        if isinstance(obj, torch.nn.Module):
            seen.setdefault(id(obj), obj)
            return
        if isinstance(obj, (str, bytes, int, float, bool, Tensor, type, types.ModuleType)):
            return
        if isinstance(obj, (list, tuple)):
            for x in obj:
                visit(x, d - 1)
            return
        if isinstance(obj, dict):
            for x in obj.values():
                visit(x, d - 1)
            return
        for attr in ("__self__", "func"):  # a bound method, a functools.partial
            if hasattr(obj, attr):
                visit(getattr(obj, attr), d)
        visit(getattr(obj, "args", None), d - 1)
        visit(getattr(obj, "keywords", None), d - 1)
        for cell in getattr(obj, "__closure__", None) or ():
            try:
                visit(cell.cell_contents, d)
            except ValueError:  # an empty cell
                pass
        visit(getattr(obj, "__defaults__", None), d - 1)
        code, glob = getattr(obj, "__code__", None), getattr(obj, "__globals__", None)
        if code is not None and glob is not None:  # a module-level model the function names
            visit([glob[n] for n in code.co_names if n in glob], d)
        if not isinstance(obj, (types.FunctionType, types.MethodType)) and hasattr(obj, "__dict__"):
            visit(vars(obj), d - 1)  # an object holding the model (a callable wrapper too)

    visit(fn, depth)
    return list(seen.values())


@contextlib.contextmanager
def in_float64(modules):
    """Every floating-point parameter and buffer of `modules` in float64 for the body, restored
    afterwards to the very tensors they were (so a float32 model comes back bit for bit)."""
    saved = []
    with torch.no_grad():
        for m in modules:
            for t in list(m.parameters()) + list(m.buffers()):
                if t.is_floating_point() and t.dtype != torch.float64 and all(t is not s for s, _ in saved):
                    saved.append((t, t.data))
                    t.data = t.data.double()
    try:
        yield
    finally:
        for t, data in saved:
            t.data = data


def float64_model(model):
    """A float64 deep copy of a torch model, MoE experts switched to their eager form where the
    model has one (grouped matrix multiplication refuses float64); the tables a model names in
    `lookup_tables()` are shared with it, not copied (`_float64_memo`). Made once per model and kept on
    it (not as a submodule: no state_dict entry), so every runner of one model shares the copy; made
    anew once a weight has changed since (a training step between two checks)."""
    stamp = tuple((t.data_ptr(), t._version) for t in list(model.parameters()) + list(model.buffers()))
    kept = model.__dict__.get("_float64_copy")
    if kept is not None and kept[0] == stamp:
        return kept[1]
    shared = shared_tables(model)
    m64 = copy.deepcopy(model, _float64_memo(model, kept, shared))
    with torch.no_grad():  # what the memo left to deepcopy (a tensor with attributes of its own)
        for t in list(m64.parameters()) + list(m64.buffers()):
            if t.is_floating_point() and t.dtype != torch.float64 and id(t) not in shared:
                t.data = t.data.double()
    setter = getattr(m64, "set_experts_implementation", None)
    if setter is not None:
        try:
            setter("eager")
        except Exception:  # no experts, or a release without the switch: the model as it is
            pass
    object.__setattr__(model, "_float64_copy", (stamp, m64))
    return m64


def shared_tables(model) -> set:
    """Ids of the tensors `float64_model` hands its copy as they are: the tables the model names in
    `lookup_tables()` (only indexed, each row converted by the model itself)."""
    return {id(t) for t in getattr(model, "lookup_tables", list)()}


def float64_copy(t: Tensor) -> Tensor:
    """`t`'s values in a float64 tensor of its own (exact from float32, float16 and bfloat16)."""
    with torch.no_grad():
        return t.detach().to(torch.float64, copy=True)


def provide_float64(model, copies) -> None:
    """Float64 copies of some of `model`'s tensors, made before it is asked for its float64 form
    (`weights.init_random` makes them on a second core while it draws): `float64_model` takes each
    whose tensor has not changed since (same storage, same version), and converts the rest itself.
    `copies`: (tensor, its float64 copy) pairs."""
    object.__setattr__(model, "_float64_provided",
                       {id(t): (t, t.data_ptr(), t._version, d) for t, d in copies})


def _float64_memo(model, stale, shared: set) -> dict:
    """A deepcopy memo that hands the copy each floating-point parameter and buffer already in
    float64 (converted straight from the original: no float32 copy made first and converted after,
    which doubled the copy's cost) and drops a stale float64 copy kept on the model rather than
    copying it too. float32, float16 and bfloat16 all convert to float64 exactly: the same values
    as `deepcopy(model).double()`. A tensor carrying attributes of its own is left to deepcopy.

    The tensors in `shared` (ids of the model's `lookup_tables()`: tables it only indexes and whose
    rows it converts to its compute dtype itself) are handed over as they are, not copied: a row
    read in float32 and converted is the row a float64 table holds, bit for bit, and at d12 these
    tables are 352 of the 488 million weights, whose float64 copy was most of the floor's time."""
    memo: dict = {} if stale is None else {id(stale): None}
    provided = model.__dict__.pop("_float64_provided", None) or {}  # taken once: a later copy converts anew
    with torch.no_grad():
        for t in list(model.parameters()) + list(model.buffers()):
            if id(t) in shared:
                memo[id(t)] = t
                continue
            if id(t) in memo or not t.is_floating_point() or vars(t) or type(t) not in (Tensor, torch.nn.Parameter):
                continue
            given = provided.get(id(t))
            if given is not None and given[0] is t and given[1:3] == (t.data_ptr(), t._version):
                d = given[3]
            else:
                d = float64_copy(t)
            memo[id(t)] = torch.nn.Parameter(d, t.requires_grad) if type(t) is torch.nn.Parameter else d
    return memo


