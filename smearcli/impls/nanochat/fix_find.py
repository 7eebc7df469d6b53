"""Where the smear is in a user's `nanochat/gpt.py`, found by the structure of the code (`ast`),
not by line numbers or exact text; and the verdicts and shapes the fix reports
(`smearcli.impls.nanochat.fix` writes the patch; `fix_source` rewrites the text).

Standard library only: the user's code is parsed, never imported or run.

What is found: in `GPT.forward` (or the one class whose forward uses `smear_gate`), the `if` that
tests the forward's `kv_cache` against None and whose code uses the smear. Its cached branch must
read the cache's previous embedding into a local, store the chunk's last embedding
(`kv_cache.prev_embedding = x[:, -1:]`) once before it dispatches, and dispatch on the token count
T (bound by `B, T = idx.size()` / `idx.shape`). The bug: the previous embedding is used only when
one token is fed. "Already fixed": it is used on a path a multi-token step can take (any shape).
See `smearcli.impls.nanochat.fix` for the shapes that are rewritten.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from typing import Optional

# result statuses
FIXABLE = "fixable"  # the bug, in a known shape: `diff` holds the fix
ALREADY_FIXED = "already-fixed"  # nothing to do
NO_SMEAR = "no-smear"  # the code has no smear: nothing to fix
UNRECOGNISED = "unrecognised"  # smear code this module does not know: nothing changed, `message` says why
STATUSES = (FIXABLE, ALREADY_FIXED, NO_SMEAR, UNRECOGNISED)

# the known shapes of the buggy code (see the module docstring)
SHAPE_UPSTREAM = "upstream-92d63d4"  # gate computed inside each branch
SHAPE_GATE_BEFORE = "gate-before-dispatch"  # gate computed once before the dispatch (smearcli's stand-in)
KNOWN_SHAPES = (SHAPE_UPSTREAM, SHAPE_GATE_BEFORE)

MARK = "smearcli fix, nanochat #756"


@dataclass(frozen=True)
class SourceFix:
    """The verdict on one file's text, and the fixed text when there is something to fix."""
    status: str
    message: str
    fixed: Optional[str] = None  # the whole new text, only when status is FIXABLE
    shape: Optional[str] = None  # one of KNOWN_SHAPES, when the smear block was rewritten
    notes: tuple[str, ...] = ()  # things worth knowing that need no change


_LINE = re.compile(r"[^\r\n]*(?:\r\n|\r|\n)|[^\r\n]+\Z")


def source_lines(text: str) -> list[str]:
    """The lines of Python source as the tokenizer counts them (and `ast` numbers them), endings
    kept: only \\n, \\r\\n and \\r end a line. Not `str.splitlines()`, which also breaks at a form
    feed, \\x1c-\\x1e, \\x85, \\u2028 and \\u2029 (legal inside comments and strings)."""
    return _LINE.findall(text)


def line_ending(line: str) -> str:
    """The end of one of `source_lines`: "\\r\\n", "\\r", "\\n" or "" (a last line without one)."""
    return "\r\n" if line.endswith("\r\n") else line[-1:] if line.endswith(("\r", "\n")) else ""


class Unknown(Exception):
    """The code is not a shape this module knows; the message says what differs."""


def _is_none(node) -> bool:
    return isinstance(node, ast.Constant) and node.value is None


def is_name(node, name: Optional[str] = None) -> bool:
    return isinstance(node, ast.Name) and (name is None or node.id == name)


def is_attr(node, obj: str, attr: str) -> bool:
    return isinstance(node, ast.Attribute) and node.attr == attr and is_name(node.value, obj)


def none_test(test, name: str) -> Optional[bool]:
    """True for `name is None`, False for `name is not None`, None for anything else."""
    if (isinstance(test, ast.Compare) and len(test.ops) == 1 and is_name(test.left, name)
            and _is_none(test.comparators[0])):
        if isinstance(test.ops[0], ast.Is):
            return True
        if isinstance(test.ops[0], ast.IsNot):
            return False
    return None


def _int(node) -> Optional[int]:
    if isinstance(node, ast.Constant) and type(node.value) is int:
        return node.value
    return None


def t_test(test, t: Optional[str]) -> Optional[str]:
    """'multi' for a test true exactly when T > 1 (T > 1, T >= 2, 1 < T, T != 1), 'single' for
    one true exactly when T == 1 (T == 1, T < 2, T <= 1, 1 == T), None otherwise."""
    if t is None or not (isinstance(test, ast.Compare) and len(test.ops) == 1):
        return None
    left, op, right = test.left, test.ops[0], test.comparators[0]
    if is_name(right, t) and _int(left) is not None:  # mirror `1 < T` into `T > 1`
        mirror = {ast.Lt: ast.Gt, ast.Gt: ast.Lt, ast.LtE: ast.GtE, ast.GtE: ast.LtE,
                  ast.Eq: ast.Eq, ast.NotEq: ast.NotEq}
        if type(op) not in mirror:
            return None
        left, op, right = right, mirror[type(op)](), left
    if not is_name(left, t):
        return None
    n = _int(right)
    multi = {(ast.Gt, 1), (ast.GtE, 2), (ast.NotEq, 1)}
    single = {(ast.Eq, 1), (ast.Lt, 2), (ast.LtE, 1)}
    if (type(op), n) in multi:
        return "multi"
    if (type(op), n) in single:
        return "single"
    return None


def _uses(node, attr: str) -> bool:
    return any(isinstance(n, ast.Attribute) and n.attr == attr for n in ast.walk(node))


def loads(node, name: str) -> list:
    return [n for n in ast.walk(node) if isinstance(n, ast.Name) and n.id == name
            and isinstance(n.ctx, ast.Load)]


def stores(node, name: str) -> bool:
    return any(isinstance(n, ast.Name) and n.id == name and isinstance(n.ctx, ast.Store)
               for n in ast.walk(node))


def _slice_parts(sub) -> list:
    s = sub.slice
    return list(s.elts) if isinstance(s, ast.Tuple) else [s]


def _full(s) -> bool:
    return isinstance(s, ast.Slice) and s.lower is None and s.upper is None and s.step is None


def _is_last_position(node, x: str) -> bool:
    """`x[:, -1:]` or `x[:, -1:, :]`: the last position of the chunk, kept as a length-1 axis."""
    if not (isinstance(node, ast.Subscript) and is_name(node.value, x)):
        return False
    parts = _slice_parts(node)
    if len(parts) < 2 or not _full(parts[0]) or not all(_full(p) for p in parts[2:]):
        return False
    s = parts[1]
    return (isinstance(s, ast.Slice) and s.upper is None and s.step is None
            and isinstance(s.lower, ast.UnaryOp) and isinstance(s.lower.op, ast.USub)
            and _int(s.lower.operand) == 1)


def _covers_every_position(node, x: str) -> bool:
    """`x[:, :, :C]`, `x[..., :C]`: every position of the chunk, the first C channels."""
    if not (isinstance(node, ast.Subscript) and is_name(node.value, x)):
        return False
    parts = _slice_parts(node)
    if len(parts) == 2 and isinstance(parts[0], ast.Constant) and parts[0].value is Ellipsis:
        return True
    return len(parts) == 3 and _full(parts[0]) and _full(parts[1])


def gate_over_every_position(value, x: str) -> bool:
    """A gate expression whose smear_gate call reads every position of `x`."""
    calls = [n for n in ast.walk(value) if isinstance(n, ast.Call)
             and isinstance(n.func, ast.Attribute) and n.func.attr == "smear_gate"]
    return len(calls) == 1 and len(calls[0].args) == 1 and _covers_every_position(calls[0].args[0], x)


# ---------------------------------------------------------------------------------------------
# gpt.py
# ---------------------------------------------------------------------------------------------

def _forward(tree: ast.Module):
    classes = [n for n in tree.body if isinstance(n, ast.ClassDef)]

    def fwd(c):
        return next((f for f in c.body if isinstance(f, ast.FunctionDef) and f.name == "forward"), None)

    gpt = next((c for c in classes if c.name == "GPT"), None)
    if gpt is not None and fwd(gpt) is not None:
        return gpt, fwd(gpt)
    smearing = [c for c in classes if fwd(c) is not None and _uses(fwd(c), "smear_gate")]
    if len(smearing) == 1:
        return smearing[0], fwd(smearing[0])
    return None, None


def _token_count_name(func) -> Optional[str]:
    """The local bound to the number of tokens: `B, T = idx.size()` or `B, T = idx.shape`."""
    args = [a.arg for a in func.args.args]
    if len(args) < 2:
        return None
    idx = args[1]
    for n in ast.walk(func):
        if (isinstance(n, ast.Assign) and len(n.targets) == 1 and isinstance(n.targets[0], ast.Tuple)
                and len(n.targets[0].elts) == 2 and is_name(n.targets[0].elts[1])):
            v = n.value
            if ((isinstance(v, ast.Call) and not v.args and is_attr(v.func, idx, "size"))
                    or is_attr(v, idx, "shape")):
                return n.targets[0].elts[1].id
    return None


def torch_imported(tree: ast.Module) -> bool:
    return any(isinstance(n, ast.Import) and any(a.name == "torch" and a.asname is None for a in n.names)
               for n in tree.body)


@dataclass
class Smear:
    """The parts of a smear block's cached branch."""
    kv: str  # the forward's cache argument
    t: Optional[str]  # the token-count local
    branch: list  # the cached branch's statements
    prev: Optional[str] = None  # the local holding the cache's previous embedding
    read_at: int = -1  # index in branch of the statement that reads it
    write_at: int = -1  # index in branch of the statement that stores the new one
    x: Optional[str] = None  # the embedding local stored into the cache


def find_smear(tree):
    """(class, forward, the smear `if`, Smear) or raise Unknown / return None for no smear."""
    cls, func = _forward(tree)
    if func is None:
        return None
    args = [a.arg for a in func.args.args] + [a.arg for a in func.args.kwonlyargs]
    kv = "kv_cache" if "kv_cache" in args else None
    if kv is None:
        if _uses(func, "smear_gate") or _uses(func, "prev_embedding"):
            raise Unknown(f"{cls.name}.forward uses the smear but has no `kv_cache` argument")
        return None
    ifs = [n for n in ast.walk(func) if isinstance(n, ast.If) and none_test(n.test, kv) is not None
           and (_uses(n, "smear_gate") or _uses(n, "smear_lambda") or _uses(n, "prev_embedding"))]
    if not ifs:
        if _uses(func, "smear_gate") or _uses(func, "smear_lambda") or _uses(func, "prev_embedding"):
            raise Unknown(f"{cls.name}.forward uses the smear, but not in an `if {kv} is None: ... "
                           f"else: ...` block that tells training from cached inference")
        return None
    if len(ifs) > 1:
        lines = ", ".join(str(n.lineno) for n in ifs)
        raise Unknown(f"{cls.name}.forward has {len(ifs)} smear blocks that test {kv} (lines {lines}); "
                       f"expected one")
    node = ifs[0]
    branch = node.orelse if none_test(node.test, kv) else node.body
    if not branch:
        raise Unknown(f"the smear block at line {node.lineno} has no branch for a cached step")
    return cls, func, node, Smear(kv, _token_count_name(func), branch)


def read_and_write(s: Smear) -> None:
    """Find the read of kv.prev_embedding into a local and the store of the new one."""
    for i, st in enumerate(s.branch):
        if not isinstance(st, ast.Assign) or len(st.targets) != 1:
            continue
        tgt, val = st.targets[0], st.value
        pairs = (list(zip(tgt.elts, val.elts)) if isinstance(tgt, ast.Tuple) and isinstance(val, ast.Tuple)
                 and len(tgt.elts) == len(val.elts) else [(tgt, val)])
        for target, value in pairs:
            if is_name(target) and is_attr(value, s.kv, "prev_embedding") and s.prev is None:
                s.prev, s.read_at = target.id, i
            elif is_attr(target, s.kv, "prev_embedding") and s.write_at < 0:
                s.write_at = i
                s.x = value.value.id if isinstance(value, ast.Subscript) and is_name(value.value) else None
                if not _is_last_position(value, s.x or ""):
                    raise Unknown(f"line {st.lineno} stores `{ast.unparse(value)}` in {s.kv}.prev_embedding; "
                                   f"expected the chunk's last embedding, x[:, -1:]")


def _test_kinds(test, t: Optional[str]) -> tuple[Optional[str], Optional[str]]:
    """What an `if` test implies about T for its body and for its else branch: 'single' (T == 1),
    'multi' (T > 1) or None. `a and b` implies for the body what either conjunct implies."""
    kind = t_test(test, t)
    if kind is not None:
        return kind, "single" if kind == "multi" else "multi"
    if isinstance(test, ast.BoolOp) and isinstance(test.op, ast.And):
        kinds = {t_test(v, t) for v in test.values} - {None}
        if len(kinds) == 1:
            return kinds.pop(), None
    return None, None


def _value_loads(node, prev: str) -> list:
    """Loads of `prev` in node, leaving out `prev is None` / `prev is not None` comparisons."""
    skip = {id(n.left) for n in ast.walk(node) if isinstance(n, ast.Compare) and none_test(n, prev) is not None}
    return [n for n in loads(node, prev) if id(n) not in skip]


def prev_used_on_multi(stmts, prev: str, t: Optional[str], single: bool = False) -> bool:
    """Whether `prev` is read by a statement that a step of T > 1 tokens can run (comparisons of
    prev with None do not count)."""
    for st in stmts:
        if isinstance(st, ast.If):
            if not single and _value_loads(st.test, prev):
                return True
            body_kind, else_kind = _test_kinds(st.test, t)
            if (prev_used_on_multi(st.body, prev, t, single or body_kind == "single")
                    or prev_used_on_multi(st.orelse, prev, t, single or else_kind == "single")):
                return True
        elif isinstance(st, (ast.For, ast.While, ast.With, ast.Try)):
            inner = [c for c in ast.iter_child_nodes(st) if isinstance(c, ast.stmt)]
            heads = [c for c in ast.iter_child_nodes(st) if not isinstance(c, ast.stmt)]
            if (not single and any(_value_loads(h, prev) for h in heads)) or prev_used_on_multi(inner, prev, t, single):
                return True
        elif not single and _value_loads(st, prev):
            return True
    return False

def smear_add(st, x: str, prev: str):
    """For `x = x + gate * prev` (also `prev * gate`): (the Name node of prev, the gate's name).
    Not `x += ...`: in place, it would also change the cached embedding, a view of x."""
    if not (isinstance(st, ast.Assign) and len(st.targets) == 1 and is_name(st.targets[0], x)):
        return None
    v = st.value
    if not (isinstance(v, ast.BinOp) and isinstance(v.op, ast.Add) and is_name(v.left, x)):
        return None
    prod = v.right
    if not (isinstance(prod, ast.BinOp) and isinstance(prod.op, ast.Mult)):
        return None
    sides = [prod.left, prod.right]
    named = [s for s in sides if is_name(s, prev)]
    gate = [s for s in sides if not is_name(s, prev)]
    if len(named) != 1 or len(gate) != 1 or not is_name(gate[0]):
        return None
    return named[0], gate[0].id


def _gate_before(stmts, upto: int, gate: str, x: str) -> Optional[bool]:
    """Whether `gate`, as last assigned in stmts[:upto], is computed from every position of `x`
    with `x` not reassigned after it: True, False, or None when stmts[:upto] never assign it."""
    for st in reversed(stmts[:upto]):
        if stores(st, gate):
            return (isinstance(st, ast.Assign) and len(st.targets) == 1 and is_name(st.targets[0], gate)
                    and gate_over_every_position(st.value, x))
        if stores(st, x):  # x reassigned after the gate was computed: the gate belongs to another x
            return False
    return None


def gate_covers_chunk(func, smear_if, branch: list, upto: int, gate: str, x: str) -> bool:
    """`gate` computed from every position of `x` before the dispatch: in the cached branch, or
    else just before the smear block at its own level (the stand-in computes it once there)."""
    here = _gate_before(branch, upto, gate, x)
    if here is not None:
        return here
    for parent in ast.walk(func):
        for fld in ("body", "orelse"):
            stmts = getattr(parent, fld, None)
            if isinstance(stmts, list) and any(st is smear_if for st in stmts):
                i = next(i for i, st in enumerate(stmts) if st is smear_if)
                return bool(_gate_before(stmts, i, gate, x))
    return False


