"""The module a finding is born in.

A finding's `born_at` names a capture point ("layer0@8"); a maintainer wants the code.
`born_in(runner, tokens, steps, position)` hooks every submodule of the runner's model and runs
three passes over the same tokens:

1. the full pass in float32, the reference;
2. the same pass on the float64 twin, lifted (`precision.lifted`): each module output's floor is
   its distance from the reference, at least one float32 ulp of its scale, the way the check
   sets each capture point's floor (`evidence.floor`);
3. the failing steps through the model's own cache, recording only the step that holds the first
   bad position (a step's outputs cover its own positions: index `p - start` there is `p` in the
   full pass).

Module calls are matched by qualified name and the n-th call of that module within a pass (a
shared block runs more than once), and compared from the step's start to the first bad position.
The first call to end whose output leaves `tolerance` x its floor is off; calls end children
first, so it is the innermost. When its inputs are off too, the error came from the code that
called it, so the trace climbs to the caller until a call receives inputs that agree: that
module's `forward` is where the error is born. A tensor that cannot be laid on the positions (a
conv's padded length, a 4-D mask, a cache) is not compared.

The result (`born_in` of a record) names the module, its class, the file and lines of its
`forward` (`inspect.getsourcelines`), a digest of that forward's text with model names
normalised, and the suspect lines inside it (`draft.PATTERNS`); `groups` joins findings on them.
"""

from __future__ import annotations

import ast
import hashlib
import inspect
import re
import textwrap
from dataclasses import dataclass, field
from typing import Optional

import torch
from torch import Tensor

from ...census.record import BornIn
from ...util.defaults import NOISE_MARGIN
from ...measure.precision import lifted
from ...util.frames import short_path
from .boundary import SCHEDULES as BOUNDARY_SCHEDULES
from .draft import suspect_kind

EPS32 = torch.finfo(torch.float32).eps
SUFFIX = re.compile(r"(ForCausalLM|TextConfig|Config|TextModel|Model)$")


@dataclass
class Call:
    """One call of one module: its tensors in and out, and the call it ran inside."""
    name: str
    index: int  # the n-th call of this module in the pass (or the step)
    module: torch.nn.Module
    parent: Optional["Call"]
    inputs: dict = field(default_factory=dict)  # "args[0]", "hidden_states", "position_embeddings[1]" -> tensor
    outputs: dict = field(default_factory=dict)


def tensors(obj, key: str = "", depth: int = 3) -> dict:
    """The tensors inside an argument or an output (tuples, lists, dicts, model outputs), by path,
    copied (their code may change them in place once the module has returned)."""
    if isinstance(obj, Tensor):
        return {key: obj.detach().clone()}
    out: dict = {}
    if depth <= 0:
        return out
    if isinstance(obj, (tuple, list)):
        for i, x in enumerate(obj):
            out.update(tensors(x, f"{key}[{i}]", depth - 1))
    elif isinstance(obj, dict):
        for k, x in obj.items():
            out.update(tensors(x, f"{key}.{k}" if key else str(k), depth - 1))
    return out


class Recorder:
    """Pre- and post-forward hooks on every module of `model` while inside `with`: every call,
    in the order calls end (children before their parent)."""

    def __init__(self, model: torch.nn.Module):
        self.model, self.calls, self.stack, self.counts, self.handles = model, [], [], {}, []

    def __enter__(self) -> "Recorder":
        for name, m in self.model.named_modules():
            self.handles.append(m.register_forward_pre_hook(self._pre(name), with_kwargs=True))
            self.handles.append(m.register_forward_hook(self._post(), with_kwargs=True))
        return self

    def __exit__(self, *exc) -> None:
        for h in self.handles:
            h.remove()
        self.handles.clear()

    def _pre(self, name):
        def hook(module, args, kwargs):
            n = self.counts[name] = self.counts.get(name, -1) + 1
            parent = self.stack[-1] if self.stack else None
            self.stack.append(Call(name, n, module, parent, {**tensors(args, "args"), **tensors(kwargs)}))
        return hook

    def _post(self):
        def hook(module, args, kwargs, output):
            call = self.stack.pop()
            call.outputs = tensors(output, "out")
            self.calls.append(call)
        return hook

    def by_key(self) -> dict:
        return {(c.name, c.index): c for c in self.calls}


def seq_dim(step: Tensor, full: Tensor, n: int, T: int) -> Optional[int]:
    """The dimension that holds positions: T long in the full pass, n in the step, every other
    dimension equal (dim 1 first: (batch, positions, ...)); None when there is none."""
    if step.dim() != full.dim() or step.dim() == 0:
        return None
    dims = [d for d in range(full.dim()) if full.size(d) == T and step.size(d) == n
            and all(step.size(e) == full.size(e) for e in range(full.dim()) if e != d)]
    return None if not dims else (1 if 1 in dims else dims[0])


def gap(step: Tensor, full: Tensor, f64: Optional[Tensor], span: tuple[int, int, int], T: int):
    """(max |step - full| over the positions start..p, its floor), or None when the tensors
    cannot be laid on the positions. `span`: (the step's start, its length, p)."""
    start, n, p = span
    d = seq_dim(step, full, n, T)
    if d is None:
        return None
    a = step.narrow(d, 0, p - start + 1).double()
    b = full.narrow(d, start, p - start + 1).double()
    fa, fb = torch.isfinite(a), torch.isfinite(b)
    if not torch.equal(fa, fb):
        return float("inf"), 0.0  # a value became inf or nan: off, whatever its floor
    err = float((a - b)[fa].abs().max()) if bool(fa.any()) else 0.0
    whole = full.double()
    finite = torch.isfinite(whole)
    scale = float(whole[finite].abs().max()) if bool(finite.any()) else 0.0
    floor = EPS32 * scale
    if f64 is not None and f64.shape == full.shape:
        both = finite & torch.isfinite(f64.double())
        if bool(both.any()):
            floor = max(floor, float((f64.double() - whole)[both].abs().max()))
    return err, floor


def worst(step: dict, full: dict, f64: dict, span, T: int, tolerance: float):
    """(any tensor off, how many comparable, the largest err / floor) of matching tensors."""
    off, compared, multiple = False, 0, 0.0
    for key, t in step.items():
        if key not in full:
            continue
        g = gap(t, full[key], f64.get(key), span, T)
        if g is None:
            continue
        compared += 1
        err, floor = g
        m = err / floor if floor > 0 else (float("inf") if err > 0 else 0.0)
        multiple = max(multiple, m)
        off = off or m > tolerance
    return off, compared, multiple


def steps_span(steps, position: int) -> tuple[int, int, int]:
    """(the index of the step that holds `position`, its start, its length)."""
    start = 0
    for i, n in enumerate(steps):
        if start <= position < start + n:
            return i, start, n
        start += n
    raise ValueError(f"position {position} is past the steps {list(steps)}")


def full_calls(runner, tokens) -> dict:
    with torch.inference_mode(), Recorder(runner.model) as rec:
        runner.forward(tokens, False)
    return rec.by_key()


def float64_calls(runner, tokens) -> dict:
    """The float64 twin's full pass, lifted where it runs lifted; empty where there is none."""
    try:
        twin = runner.float64()
    except Exception:
        return {}
    for ctx in (lifted, None):
        try:
            with torch.inference_mode(), Recorder(twin.model) as rec:
                if ctx is None:
                    twin.forward(tokens, False)
                else:
                    with ctx():
                        twin.forward(tokens, False)
            return rec.by_key()
        except Exception:
            continue
    return {}


def step_calls(runner, tokens, steps, k: int) -> list[Call]:
    """The calls of step `k` of the failing steps, the steps before it run through the same cache."""
    cache = runner.new_cache(tokens.size(0), tokens.size(1))
    pos = 0
    with torch.inference_mode():
        for i, n in enumerate(steps[:k + 1]):
            if i < k:
                runner.step(tokens[:, pos:pos + n], cache, False)
            else:
                with Recorder(runner.model) as rec:
                    runner.step(tokens[:, pos:pos + n], cache, False)
            pos += n
    return rec.calls


def trace(runner, tokens, steps, position: int, tolerance: float = NOISE_MARGIN):
    """(the call the error is born in, the first call whose output is off, that call's multiple),
    or None when no module output is off."""
    k, start, n = steps_span(steps, position)
    T = tokens.size(1)
    span = (start, n, position)
    full, f64 = full_calls(runner, tokens), float64_calls(runner, tokens)
    empty: dict = {}

    def judged(call, side):
        ref = full.get((call.name, call.index))
        if ref is None:
            return False, 0, 0.0
        other = f64.get((call.name, call.index))
        return worst(getattr(call, side), getattr(ref, side), getattr(other, side) if other else empty, span, T,
                     tolerance)

    for call in step_calls(runner, tokens, steps, k):
        off, _, multiple = judged(call, "outputs")
        if not off:
            continue
        first, born = call, call
        while born.parent is not None:  # inputs off (or none comparable): the caller made them
            ins_off, compared, _ = judged(born, "inputs")
            if not ins_off and (compared or not born.inputs):
                break
            born = born.parent
        return born, first, multiple
    return None


def leak_in(runner, tokens, changed, cut: int, tolerance: float = NOISE_MARGIN) -> BornIn:
    """The `born_in` of a full pass that leaks future tokens (`causal`): the full pass on `tokens`
    and on `changed` (the same up to `cut`, then changed or cut off), compared over the positions before `cut`; the first call
    whose output moves there while the inputs it receives do not is where the leak starts."""
    T = tokens.size(1)
    span = (0, changed.size(1), cut - 1)
    try:
        a = full_calls(runner, tokens)
        with torch.inference_mode(), Recorder(runner.model) as rec:
            runner.forward(changed, False)
    except Exception as e:
        return BornIn(None, why=f"{type(e).__name__}: {(str(e).splitlines() or [''])[0][:160]}")
    for call in rec.calls:
        ref = a.get((call.name, call.index))
        if ref is None:
            continue
        off, _, multiple = worst(call.outputs, ref.outputs, {}, span, T, tolerance)
        if not off:
            continue
        first, at = call, call
        while at.parent is not None:
            mine = a.get((at.name, at.index))
            ins_off, compared, _ = worst(at.inputs, mine.inputs, {}, span, T, tolerance) if mine else (True, 0, 0.0)
            if not ins_off and (compared or not at.inputs):
                break
            at = at.parent
        out = describe(at, runner.model)
        out.position, out.first_off = cut - 1, first.name
        out.multiple = multiple if multiple != float("inf") else None
        return out
    return BornIn(None, why=f"no module output moves {tolerance:g}x its floor before position {cut}")


# the words a suspect line names each kind of carried state by (`state.state_kinds`)
STATE_WORDS = {"conv": ("conv",), "recurrent": ("recurrent", "ssm_state", "ssm", "scan", "initial_state")}


def narrow(born_in: Optional[BornIn], kinds) -> Optional[BornIn]:
    """A `born_in` whose suspects are cut to the lines that handle the state the dropped-state
    replay zeroed (`kinds`: "recurrent", "conv"): zeroing that state reproduces the error, so
    carrying it is the change that removes it, and a line on the other state is not the cause
    (Mamba's conv branch carries its state; the scan starts from zero). `cause` names the state;
    nothing changes when no suspect line names it."""
    if born_in is None or not born_in.suspects or not kinds:
        return born_in
    mine = [w for k in kinds for w in STATE_WORDS.get(k, (k,))]
    others = [w for k, ws in STATE_WORDS.items() if k not in kinds for w in ws]
    keep = [s for s in born_in.suspects if any(w in s[1] for w in mine) and not any(w in s[1] for w in others)]
    if keep:
        born_in.suspects = keep
        born_in.cause = (f"the {' and '.join(kinds)} state: zeroing it at each multi-token cached step's start "
                         "reproduces the error, so carrying it there removes it")
    return born_in


def source(cls) -> tuple[Optional[str], int, list[str]]:
    """(the file, the first line, the lines) of a module class's forward, decorators included."""
    fn = inspect.unwrap(cls.forward)
    try:
        lines, first = inspect.getsourcelines(fn)
        return inspect.getsourcefile(fn), first, lines
    except (OSError, TypeError):
        return None, 0, []


def prefixes(model) -> list[str]:
    """The model's own name prefixes ("FalconMamba"), from its class and its config's, longest first."""
    names = {SUFFIX.sub("", type(model).__name__), SUFFIX.sub("", type(getattr(model, "config", None)).__name__)}
    return sorted((p for p in names if len(p) > 2), key=len, reverse=True)


def canonical(lines: list[str]) -> str:
    """A function's source as `ast.unparse` writes it: no decorators, no docstring, no comments,
    one layout (a copy that differs only in those reads the same); the text itself where it does
    not parse."""
    text = textwrap.dedent("".join(lines))
    try:
        fn = ast.parse(text).body[0]
    except (SyntaxError, IndexError):
        return text
    if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
        fn.decorator_list = []
        first = fn.body[0] if fn.body else None
        if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(first.value.value, str):
            fn.body = fn.body[1:] or [ast.Pass()]
    return ast.unparse(fn)


def normalised(text: str, names=()) -> str:
    """Code as a copy of it reads in another model: each line stripped, blank and comment-only
    lines out, the model's prefix on class names made "Model", every *Config class "Config"."""
    out = []
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        for p in names:
            line = re.sub(rf"\b{re.escape(p)}(?=[A-Z_]\w*)", "Model", line)
        out.append(re.sub(r"\b\w*Config\b", "Config", line))
    return "\n".join(out)


def describe(call: Call, model, names=None) -> BornIn:
    """The `born_in` entry of a call: module, class, file, the forward's lines, its digest and the
    suspect lines inside it (line, the line, what the pattern means)."""
    cls = type(call.module)
    path, first, lines = source(cls)
    names = prefixes(model) if names is None else names
    suspects = []
    for i, text in enumerate(lines, first):
        what = suspect_kind(text)
        if what:
            suspects.append([i, text.strip(), what])
    return BornIn(call.name or "(the model)", cls.__name__, file=short_path(path) if path else None,
                  lines=[first, first + len(lines) - 1] if lines else None,
                  code=hashlib.sha256(normalised(canonical(lines), names).encode()).hexdigest()[:16] if lines else None,
                  suspects=[[n, normalised(t, names), what] for n, t, what in suspects])


def born_in(runner, tokens, steps, departure, tolerance: float = NOISE_MARGIN,
            schedule: Optional[str] = None) -> Optional[BornIn]:
    """The `born_in` field of a finding on a step plan: `departure` is the run's first departure
    (capture point, position); None for a boundary schedule (its batch is not the row's steps),
    or when no module output is off. The trace never fails the check: an exception in it is
    kept as `why`."""
    if departure is None or schedule in BOUNDARY_SCHEDULES or not steps:
        return None
    position = departure[1]
    try:
        got = trace(runner, tokens, list(steps), position, tolerance)
    except Exception as e:  # a model the hooks cannot follow: say so, the finding stands
        return BornIn(None, why=f"{type(e).__name__}: {(str(e).splitlines() or [''])[0][:160]}")
    if got is None:
        return BornIn(None, why=f"no module output leaves {tolerance:g}x its floor at position {position}")
    born, first, multiple = got
    out = describe(born, runner.model)
    out.position, out.first_off = position, first.name
    out.multiple = multiple if multiple != float("inf") else None
    return out

