"""Rewriting a user's `nanochat/gpt.py` and `nanochat/engine.py` for the smear fix: the verdict
on each file's text (`fix_gpt_source`, `fix_engine_source`) and the fixed text when the code has
the bug in a known shape. Where the smear is comes from `fix_find`; `fix` diffs and applies.
"""

from __future__ import annotations

import ast

from .fix_find import (
    ALREADY_FIXED, FIXABLE, MARK, NO_SMEAR, SHAPE_GATE_BEFORE, SHAPE_UPSTREAM, UNRECOGNISED, SourceFix,
    Smear, Unknown, find_smear, line_ending, source_lines, gate_covers_chunk, gate_over_every_position, is_attr, is_name, loads, none_test, prev_used_on_multi, read_and_write, smear_add, stores, t_test, torch_imported,
)


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

