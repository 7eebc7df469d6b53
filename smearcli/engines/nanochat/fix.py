"""A patch for the chunk-boundary smear bug (nanochat issue #756) in a user's nanochat checkout.

The audit (`smearcli compare --impl nanochat`) says whether a checkout has the bug; this module
writes the fix as a unified diff the maintainer can read and apply (`git apply` or `patch -p1`
from the checkout root), or applies it itself with a backup.

Standard library only: the user's code is read and parsed (`ast`), never imported or run. In
order: where the smear is, by structure (`find_smear`), and the statuses and shapes the fix
reports; the rewritten text of each file (`fix_gpt_source`, `fix_engine_source`); the diff, and
applying it with a backup.

What is found, and how
----------------------
In `nanochat/gpt.py`, the `forward` method of class `GPT` (or, failing that, of the one class
whose forward uses `smear_gate`), and in it the smear block: the `if` that tests the forward's
`kv_cache` argument against None and whose code uses `smear_gate`/`smear_lambda` or the cache's `prev_embedding`. Its cached
branch must

  * read the cache's previous embedding into a local (`prev = kv_cache.prev_embedding`, or a
    tuple assignment that also stores the new one),
  * store the chunk's last pre-smear embedding (`kv_cache.prev_embedding = x[:, -1:]`), once,
    before it dispatches, and
  * dispatch on the number of tokens T (bound by `B, T = idx.size()` / `idx.shape`).

The bug, in that branch: the cached previous embedding is used only when one token is fed, so a
chunk of T > 1 tokens on a filled cache is smeared as if it began the sequence. "Already fixed"
is recognised by the same analysis: the previous embedding is used on a path that a multi-token
step can take (any shape: the one this module writes, the one proposed in the issue, a guarded
extra smear of the first token, ...).

Shapes this module rewrites (anything else is reported, never guessed at)
-------------------------------------------------------------------------
The dispatch must be exactly

    if T > 1:                     # also T >= 2, 1 < T, T != 1
        <prefill: shifts within the chunk, never uses prev>
    elif prev is not None:
        [gate = <expression over every position of the chunk>]
        x = x + gate * prev       # also `x + prev * gate`

where the gate the decode step uses covers every token of the chunk: either computed in the
decode branch from the whole chunk (`self.smear_gate(x[:, :, :24])`, `x[..., :24]`, `x[:, :, :C]`;
upstream nanochat at commit 92d63d4, SHAPE_UPSTREAM) or computed once before the dispatch from the
whole chunk, the prefill using `gate[:, 1:]` (smearcli's test stand-in, SHAPE_GATE_BEFORE). Local
names (x, prev, gate, T, kv_cache), whitespace and comments may differ.

The rewrite swaps the two branches and makes the decode branch general:

    if prev is not None:
        [gate = ...]                                   # unchanged
        x = x + gate * torch.cat([prev, x[:, :-1]], dim=1)
    elif T > 1:
        <prefill, unchanged>

With one token, `torch.cat([prev, x[:, :-1]], dim=1)` is `prev`, so decode is unchanged; with an
empty cache the prefill is unchanged; a chunk on a filled cache now gets its first token's
predecessor from the cache. The cache write stays where it is (it already stores the chunk's last
embedding on every step).

`nanochat/engine.py`: `KVCache` must define `prev_embedding` (upstream's and the stand-in's do, in
`__init__`, and copy it in `prefill`). One thing matters more once the fix is in: `reset()` must
clear `prev_embedding`, or the first chunk after a reset would be smeared with the last token of
the previous sequence (before the fix a multi-token first step ignored it). Upstream's reset does
clear it; where a checkout's does not, the same diff adds `self.prev_embedding = None` there.
"""

from __future__ import annotations

import ast
import difflib
import os
import re
import tempfile
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Optional


# -- where the smear is (the code's structure) ----------------------------------------------------
# result statuses
FIXABLE = "fixable"  # the bug, in a known shape: `diff` holds the fix
ALREADY_FIXED = "already-fixed"  # nothing to do
NO_SMEAR = "no-smear"  # the code has no smear: nothing to fix
UNRECOGNISED = "unrecognised"  # smear code this module does not know: nothing changed, `message` says why

# the known shapes of the buggy code (see the module docstring)
SHAPE_UPSTREAM = "upstream-92d63d4"  # gate computed inside each branch
SHAPE_GATE_BEFORE = "gate-before-dispatch"  # gate computed once before the dispatch (smearcli's stand-in)

MARK = "smearcli fix, nanochat #756"


@dataclass(frozen=True)
class SourceFix:
    """The verdict on one file's text, and the fixed text when there is something to fix."""
    status: str
    message: str
    fixed: Optional[str] = None  # the whole new text, only when status is FIXABLE
    shape: Optional[str] = None  # SHAPE_UPSTREAM or SHAPE_GATE_BEFORE, when the smear block was rewritten
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


# -- the rewritten text ---------------------------------------------------------------------------
def _line_start(lines: list[str], node) -> str:
    """The text before `node` on its first line (must be indentation only)."""
    return lines[node.lineno - 1].encode()[:node.col_offset].decode()


def _own_lines(lines: list[str], stmts: list, what: str) -> None:
    first, last = stmts[0], stmts[-1]
    if _line_start(lines, first).strip():
        raise Unknown(f"the {what} starts on the line of its `if`/`elif`; put it on its own lines")
    tail = lines[last.end_lineno - 1].encode()[last.end_col_offset:].decode()
    if tail.strip() and not tail.strip().startswith("#"):
        raise Unknown(f"the {what} ends on a line shared with other code (line {last.end_lineno})")


def fix_gpt_source(text: str) -> SourceFix:
    """The verdict on the text of a `nanochat/gpt.py`, and the fixed text if it has the bug in a
    known shape (see the module docstring). Never raises on odd code: that is UNRECOGNISED."""
    try:
        tree = ast.parse(text)
    except SyntaxError as e:
        return SourceFix(UNRECOGNISED, f"gpt.py does not parse as Python (line {e.lineno}: {e.msg}); "
                                       f"nothing changed")
    try:
        found = find_smear(tree)
    except Unknown as e:
        return SourceFix(UNRECOGNISED, f"{e}; nothing changed")
    if found is None:
        return SourceFix(NO_SMEAR, "gpt.py has no smear (no forward that mixes the previous token's "
                                   "embedding in through smear_gate): there is no chunk-boundary smear "
                                   "bug to fix")
    cls, func, smear_if, s = found
    where = f"{cls.name}.forward, smear block at line {smear_if.lineno}"
    try:
        read_and_write(s)
    except Unknown as e:
        return SourceFix(UNRECOGNISED, f"{where}: {e}; nothing changed")
    if s.prev is None:
        return SourceFix(UNRECOGNISED, f"{where}: the cached branch never reads {s.kv}.prev_embedding "
                                       f"into a local, so it has no previous embedding to smear with; "
                                       f"not a shape this tool knows, nothing changed")
    if s.write_at < 0:
        return SourceFix(UNRECOGNISED, f"{where}: the cached branch never stores the chunk's last "
                                       f"embedding in {s.kv}.prev_embedding (as a statement of its own, "
                                       f"before it dispatches); nothing changed")
    if s.read_at > s.write_at:
        return SourceFix(UNRECOGNISED, f"{where}: {s.kv}.prev_embedding is read after it is overwritten "
                                       f"with the current chunk's last embedding; nothing changed")
    rest = s.branch[s.write_at + 1:]
    if prev_used_on_multi(rest, s.prev, s.t):
        return SourceFix(ALREADY_FIXED, f"{where}: already fixed: the cached previous embedding "
                                        f"(`{s.prev}`) is used on steps of more than one token too, and "
                                        f"the chunk's last embedding is stored for the next step; "
                                        f"nothing to do")
    if s.t is None:
        return SourceFix(UNRECOGNISED, f"{where}: the number of tokens is not bound as `B, T = idx.size()` "
                                       f"or `idx.shape`, so the step kinds cannot be told apart; nothing "
                                       f"changed")
    # the bug: prev is used only when one token is fed. Is it a shape we rewrite?
    lines = source_lines(text)
    try:
        fixed, shape = _rewrite(text, lines, func, smear_if, s)
    except Unknown as e:
        return SourceFix(UNRECOGNISED, f"{where}: this looks like the chunk-boundary smear bug (the cached "
                                       f"previous embedding `{s.prev}` is used only when one token is fed), "
                                       f"but not in a shape this tool rewrites: {e}. Nothing changed; fix it "
                                       f"by hand: a chunk's first token must be smeared with `{s.prev}` "
                                       f"whenever it is not None")
    return SourceFix(FIXABLE, f"{where}: the chunk-boundary smear bug (nanochat #756): the cached previous "
                              f"embedding `{s.prev}` is used only when one token is fed, so the first token "
                              f"of every later chunk misses its predecessor", fixed, shape)


def _rewrite(text: str, lines: list[str], func, smear_if, s: Smear) -> tuple[str, str]:
    rest = s.branch[s.write_at + 1:]
    dispatch = [st for st in rest if isinstance(st, ast.If) and t_test(st.test, s.t)]
    if len(dispatch) != 1:
        raise Unknown(f"expected one `if {s.t} > 1:` dispatch after the cache store, found {len(dispatch)}")
    d = dispatch[0]
    if any(stores(st, s.x) or loads(st, s.prev) for st in rest if st is not d):
        raise Unknown("the cached branch has other code that changes the embedding beside the dispatch")
    if t_test(d.test, s.t) != "multi":
        raise Unknown(f"the dispatch tests `{ast.unparse(d.test)}`; the known shapes test `{s.t} > 1` first")
    if not (len(d.orelse) == 1 and isinstance(d.orelse[0], ast.If) and none_test(d.orelse[0].test, s.prev) is False
            and not d.orelse[0].orelse):
        raise Unknown(f"expected `elif {s.prev} is not None:` after `if {ast.unparse(d.test)}:`, and nothing else")
    dec = d.orelse[0]
    if dec.col_offset != d.col_offset or not lines[dec.lineno - 1].lstrip().startswith("elif"):
        raise Unknown(f"the decode branch is written as `else: if ...`, not `elif {s.prev} is not None:`")
    prefill, decode = d.body, dec.body
    if any(loads(st, s.prev) for st in prefill):
        raise Unknown("the prefill branch uses the previous embedding already")
    _own_lines(lines, prefill, "prefill branch")
    _own_lines(lines, decode, "decode branch")
    # the decode branch: [gate = <every position>]*, then x = x + gate * prev
    found = smear_add(decode[-1], s.x, s.prev)
    if found is None:
        raise Unknown(f"the decode branch does not end with `{s.x} = {s.x} + gate * {s.prev}`")
    prev_node, gate = found
    for st in decode[:-1]:
        if not (isinstance(st, ast.Assign) and len(st.targets) == 1 and is_name(st.targets[0])
                and st.targets[0].id not in (s.x, s.prev) and not loads(st, s.prev)):
            raise Unknown(f"the decode branch has a statement other than the gate (line {st.lineno})")
    gate_here = [st for st in decode[:-1] if st.targets[0].id == gate]
    if gate_here:
        if not gate_over_every_position(gate_here[-1].value, s.x):
            raise Unknown(f"the decode gate `{ast.unparse(gate_here[-1].value)}` does not read every "
                           f"position of the chunk")
        shape = SHAPE_UPSTREAM
    elif gate_covers_chunk(func, smear_if, s.branch, next(i for i, st in enumerate(s.branch) if st is d),
                            gate, s.x):
        shape = SHAPE_GATE_BEFORE
    else:
        raise Unknown(f"the gate `{gate}` of the decode branch is not computed from every position of "
                       f"the chunk")
    if not torch_imported(ast.parse(text)):
        raise Unknown("gpt.py does not `import torch` at module level")

    nl = line_ending(lines[d.lineno - 1]) or "\n"  # the file's own: LF, CRLF or CR
    indent = _line_start(lines, d)
    if indent.strip():
        raise Unknown("the dispatch `if` does not start its own line")

    def block(stmts) -> list[str]:
        return lines[stmts[0].lineno - 1:stmts[-1].end_lineno]

    # the decode body, with prev replaced by [prev, x shifted] in its last statement
    body = block(decode)
    k = prev_node.lineno - decode[0].lineno
    raw = body[k].encode()
    body[k] = (raw[:prev_node.col_offset].decode() + f"torch.cat([{s.prev}, {s.x}[:, :-1]], dim=1)"
               + raw[prev_node.end_col_offset:].decode())
    inner = _line_start(lines, decode[0])
    new = [f"{indent}if {s.prev} is not None:{nl}",
           f"{inner}# decode, or a chunk after earlier ones: the first token's predecessor is the{nl}",
           f"{inner}# cached last embedding of the previous step ({MARK}){nl}",
           *body,
           f"{indent}elif {ast.get_source_segment(text, d.test)}:{nl}",
           f"{inner}# the start of the sequence: no predecessor for the first token{nl}",
           *block(prefill)]
    if not new[-1].endswith(("\n", "\r")):
        new[-1] += nl
    end = dec.end_lineno
    fixed = "".join(lines[:d.lineno - 1] + new + lines[end:])
    ast.parse(fixed)  # must still be Python
    return fixed, shape


# ---------------------------------------------------------------------------------------------
# engine.py
# ---------------------------------------------------------------------------------------------

def fix_engine_source(text: str) -> SourceFix:
    """What the KVCache in a `nanochat/engine.py` needs for the fix: `prev_embedding` defined,
    and cleared by `reset()` if there is one. FIXABLE adds the clearing to reset(); UNRECOGNISED if
    there is no KVCache or it never defines prev_embedding; ALREADY_FIXED when nothing is needed."""
    try:
        tree = ast.parse(text)
    except SyntaxError as e:
        return SourceFix(UNRECOGNISED, f"engine.py does not parse as Python (line {e.lineno}: {e.msg})")
    cls = next((n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "KVCache"), None)
    if cls is None:
        return SourceFix(UNRECOGNISED, "engine.py has no class KVCache")

    def sets_prev(node) -> bool:
        return any(isinstance(n, (ast.Assign, ast.AnnAssign)) and any(
            is_attr(t, "self", "prev_embedding") for t in (n.targets if isinstance(n, ast.Assign) else [n.target]))
            for n in ast.walk(node))

    declared = any(isinstance(n, ast.AnnAssign) and is_name(n.target, "prev_embedding") or isinstance(n, ast.Assign)
                   and any(is_name(t, "prev_embedding") for t in n.targets) for n in cls.body)
    if not sets_prev(cls) and not declared:
        return SourceFix(UNRECOGNISED, "engine.py's KVCache never defines prev_embedding, which the smear "
                                       "reads and writes")
    notes = []
    prefill = next((f for f in cls.body if isinstance(f, ast.FunctionDef) and f.name == "prefill"), None)
    if prefill is not None and not sets_prev(prefill):
        notes.append("engine.py: KVCache.prefill does not copy prev_embedding, so the first decoded token "
                     "after an engine-style cache copy misses its smear (a separate bug the audit reports as "
                     "engine-expansion; not changed here)")
    reset = next((f for f in cls.body if isinstance(f, ast.FunctionDef) and f.name == "reset"), None)
    if reset is None or sets_prev(reset):
        return SourceFix(ALREADY_FIXED, "engine.py: KVCache needs no change", notes=tuple(notes))
    last = reset.body[-1]
    lines = source_lines(text)
    if isinstance(last, (ast.Return, ast.Raise)) or any(isinstance(n, (ast.Return, ast.Yield)) for n in ast.walk(reset)):
        return SourceFix(UNRECOGNISED, "engine.py: KVCache.reset does not clear prev_embedding, and its body "
                                       "returns early; add `self.prev_embedding = None` to it by hand",
                         notes=tuple(notes))
    indent = _line_start(lines, last)
    if indent.strip():
        return SourceFix(UNRECOGNISED, "engine.py: KVCache.reset is written on one line; add "
                                           "`self.prev_embedding = None` to it by hand", notes=tuple(notes))
    nl = line_ending(lines[last.end_lineno - 1]) or line_ending(lines[0]) or "\n"
    end = last.end_lineno
    if not lines[end - 1].endswith(("\n", "\r")):
        lines[end - 1] += nl
    new = (f"{indent}self.prev_embedding = None  # a reset cache has no previous token to smear with "
           f"({MARK}){nl}")
    fixed = "".join(lines[:end] + [new] + lines[end:])
    ast.parse(fixed)
    return SourceFix(FIXABLE, "engine.py: KVCache.reset keeps prev_embedding; with the fix the first chunk "
                              "after a reset would be smeared with the previous sequence's last token, so "
                              "reset now clears it", fixed, notes=tuple(notes))


# ---------------------------------------------------------------------------------------------
# The diff, and the whole fix for a checkout
# ---------------------------------------------------------------------------------------------


# -- the patch: its diff, and applying it with a backup --------------------------------------------
PACKAGE = "nanochat"
GPT_FILE = "gpt.py"
ENGINE_FILE = "engine.py"
BACKUP_SUFFIX = ".orig"
MAX_SOURCE_BYTES = 1 << 20  # per file: ast.parse of a 4 MiB file takes over a GiB and seconds


class FixError(ValueError):
    """The fix could not be read or written (not a checkout, a backup in the way, ...)."""


@dataclass(frozen=True)
class FixResult:
    """What `make_fix` / `apply_fix` found and did.

    status: FIXABLE, ALREADY_FIXED, NO_SMEAR or UNRECOGNISED; message: one paragraph for a person;
    diff: the unified diff (paths a/nanochat/... b/nanochat/..., for `git apply` / `patch -p1` from
    the checkout root), empty unless status is FIXABLE; files: the relative paths the diff
    changes; shape: the known shape of the smear block that was rewritten (None if gpt.py needs no
    change); notes: remarks that need no change; root: the checkout; written: the files written
    (apply_fix with write=True); backups: the backups made of them."""
    status: str
    message: str
    diff: str = ""
    files: tuple[str, ...] = ()
    shape: Optional[str] = None
    notes: tuple[str, ...] = ()
    fixed: dict = field(default_factory=dict, repr=False)  # relative path -> new text
    root: Optional[Path] = None
    written: tuple[Path, ...] = ()
    backups: tuple[Path, ...] = ()

    @property
    def changed(self) -> bool:
        return bool(self.diff)


# ---------------------------------------------------------------------------------------------
# Small AST helpers


def patch_lines(text: str) -> list[str]:
    """The lines of a file as `patch` and `git apply` see them: ended by \\n alone (a \\r before
    it, a form feed or a \\u2028 is part of the line). A file with CR-only line endings is one line
    to them, so its diff replaces that one line."""
    return re.findall(r"[^\n]*\n|[^\n]+\Z", text)


def unified_diff(old: str, new: str, path: str) -> str:
    """A unified diff of one file, `a/<path>` -> `b/<path>`, that `git apply` and `patch -p1`
    accept (a last line without a newline is marked as such)."""
    out = []
    for line in difflib.unified_diff(patch_lines(old), patch_lines(new), f"a/{path}", f"b/{path}"):
        if not line.endswith("\n"):
            line += "\n\\ No newline at end of file\n"
        out.append(line)
    return "".join(out)


def make_fix(gpt_text: str, engine_text: Optional[str] = None) -> FixResult:
    """The fix for a checkout given the texts of its nanochat/gpt.py and (optionally)
    nanochat/engine.py: FIXABLE with a diff over both files, or a status that changes nothing. A
    UTF-8 byte order mark (which Python accepts at the start of a file) is kept, and left out of
    what is parsed."""
    g = _keeping_bom(fix_gpt_source, gpt_text)
    notes = list(g.notes)
    if "\r" in gpt_text and "\n" not in gpt_text:
        notes.append("gpt.py ends its lines with CR alone, so patch and git apply see it as one line: the "
                     "diff replaces that line whole")
    if g.status in (NO_SMEAR, UNRECOGNISED):
        return FixResult(g.status, g.message, notes=tuple(notes))
    fixed = {}
    messages = [g.message]
    if g.status == FIXABLE:
        fixed[f"{PACKAGE}/{GPT_FILE}"] = (gpt_text, g.fixed)
    if engine_text is None:
        notes.append("engine.py was not given, so KVCache was not checked")
    else:
        e = _keeping_bom(fix_engine_source, engine_text)
        notes += e.notes
        if e.status == UNRECOGNISED:
            return FixResult(UNRECOGNISED, f"{g.message}. But {e.message}; nothing changed", notes=tuple(notes))
        if e.status == FIXABLE:
            fixed[f"{PACKAGE}/{ENGINE_FILE}"] = (engine_text, e.fixed)
            messages.append(e.message)
    if not fixed:
        return FixResult(ALREADY_FIXED, g.message, notes=tuple(notes))
    diff = "".join(unified_diff(old, new, path) for path, (old, new) in fixed.items())
    return FixResult(FIXABLE, ". ".join(m.rstrip(".") for m in messages) + ".", diff, tuple(fixed), g.shape,
                     tuple(notes), {path: new for path, (_, new) in fixed.items()})


BOM = "\ufeff"


def _keeping_bom(fix_source, text: str) -> SourceFix:
    """fix_source's verdict on `text` without its byte order mark, the mark put back in the fix."""
    if not text.startswith(BOM):
        return fix_source(text)
    r = fix_source(text[len(BOM):])
    return replace(r, fixed=BOM + r.fixed) if r.fixed is not None else r


def checkout_root(path) -> Path:
    """The directory holding nanochat/gpt.py (`path` may also be the nanochat/ package itself)."""
    p = Path(os.path.expanduser(str(path)))
    if not p.is_dir():
        if p.exists():  # a file (a dangling link is not found)
            raise FixError(f"{path}: not a directory; give the checkout (the directory holding "
                           f"{PACKAGE}/{GPT_FILE})")
        raise FixError(f"{path}: directory not found")
    p = p.resolve()
    if not (p / PACKAGE / GPT_FILE).is_file() and p.name == PACKAGE and (p / GPT_FILE).is_file():
        p = p.parent
    if not (p / PACKAGE / GPT_FILE).is_file():
        raise FixError(f"{path}: not a nanochat checkout (no {PACKAGE}/{GPT_FILE} in {p})")
    return p


def _read(path: Path, shown: str) -> tuple[bytes, str]:
    """The bytes and text of a source file, at most MAX_SOURCE_BYTES (parsing a file of tens of
    megabytes takes gigabytes of memory); `shown` names it in messages."""
    size = path.stat().st_size
    if size <= MAX_SOURCE_BYTES:
        with open(path, "rb") as f:
            raw = f.read(MAX_SOURCE_BYTES + 1)
        size = len(raw)
    if size > MAX_SOURCE_BYTES:
        raise FixError(f"{shown}: {size / 2**20:.1f} MiB, larger than the {MAX_SOURCE_BYTES // 2**20} MiB "
                       f"fix reads (upstream's gpt.py is about 20 KB); nothing changed")
    try:
        return raw, raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise FixError(f"{shown}: not UTF-8 text ({e})") from None


def apply_fix(checkout_dir, write: bool = False) -> FixResult:
    """Read `<checkout_dir>/nanochat/gpt.py` (and engine.py beside it, if present) and return
    `make_fix`'s result. With write=True and a FIXABLE result, write the fixed files: each
    original is first copied to `<file>.orig` (refused, with nothing written, if such a backup
    exists or the file is a symbolic link), and each new text goes to a temporary file in the same
    directory that then replaces the original (os.replace), so no file is ever half-written. Files
    over MAX_SOURCE_BYTES are refused. Raises FixError."""
    root = checkout_root(checkout_dir)
    pkg = root / PACKAGE
    raw = {}

    def shown(rel: str) -> str:  # as the user named the checkout, not resolved
        return f"{checkout_dir}: {rel}"
    gpt_raw, gpt_text = _read(pkg / GPT_FILE, shown(f"{PACKAGE}/{GPT_FILE}"))
    raw[f"{PACKAGE}/{GPT_FILE}"] = gpt_raw
    engine_text = None
    if (pkg / ENGINE_FILE).is_file():
        raw[f"{PACKAGE}/{ENGINE_FILE}"], engine_text = _read(pkg / ENGINE_FILE, shown(f"{PACKAGE}/{ENGINE_FILE}"))
    r = make_fix(gpt_text, engine_text)
    r = replace(r, root=root)
    if not write or r.status != FIXABLE:
        return r
    targets = [root / rel for rel in r.files]
    for t, rel in zip(targets, r.files):  # os.replace would turn the link into a file, its target unfixed
        if t.is_symlink():
            raise FixError(f"{shown(rel)} is a symbolic link to {os.readlink(t)}; fix does not write through "
                           f"links: nothing written; without writing, fix prints the diff to apply to the file "
                           f"it points to")
    backups = [t.with_name(t.name + BACKUP_SUFFIX) for t in targets]
    there = [str(b) for b in backups if os.path.lexists(b)]
    if there:
        raise FixError(f"backup {', '.join(there)} already exists; move it away first (nothing written)")
    made_backups, temps, replaced = [], [], []
    try:
        for t, b, rel in zip(targets, backups, r.files):
            if t.read_bytes() != raw[rel]:
                raise FixError(f"{t} changed while the fix was being made; nothing written")
            with open(b, "xb") as f:  # exclusive: never overwrite a backup
                made_backups.append(b)
                f.write(raw[rel])
                f.flush()
                os.fsync(f.fileno())
            _copy_mode(t, b)
        for t, rel in zip(targets, r.files):
            fd, tmp = tempfile.mkstemp(prefix=f".{t.name}.", suffix=".smearcli-tmp", dir=t.parent)
            temps.append(Path(tmp))
            with os.fdopen(fd, "wb") as f:
                f.write(r.fixed[rel].encode("utf-8"))
                f.flush()
                os.fsync(f.fileno())
            _copy_mode(t, Path(tmp))
        for t, tmp in zip(targets, temps):
            os.replace(tmp, t)
            replaced.append(t)
    except BaseException:
        for t, b in zip(targets, backups):  # put back what was replaced
            if t in replaced:
                os.replace(b, t)
                made_backups.remove(b)
        for p in temps + made_backups:
            with _quiet():
                p.unlink()
        raise
    return replace(r, written=tuple(targets), backups=tuple(backups))


def _copy_mode(src: Path, dst: Path) -> None:
    with _quiet():
        os.chmod(dst, os.stat(src).st_mode & 0o7777)


class _quiet:
    def __enter__(self):
        return self

    def __exit__(self, kind, value, tb):
        return kind is not None and issubclass(kind, OSError)
