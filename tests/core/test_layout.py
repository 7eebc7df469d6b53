"""The package's layering, checked from the source so the layout cannot silently decay.

Layers, lowest first: core (`util`, `gpt`, `measure`, `judging` and `testing`), render,
features (`impls`, `bench`, `census`, `engines`), cli (with each engine's `prepare` module: its command-line
preparation lives in its folder). A module may import from its own layer's package or from any lower
layer, never from a higher one (the census may also import `impls`; an engine the census, `impls` and
the tiny models, `tiny`); the census core imports no engine, ours or a library one; there is no import
cycle; no module outside `cli/` names a command-line flag; no module imports another module's private
(`_name`) names; every module says in a docstring what it owns (modules are cut by concept: no line cap).
"""

from __future__ import annotations

import ast
import json
import re
from pathlib import Path

import pytest
from conftest import ROOT  # noqa: E402 - the clone's root

PKG = ROOT / "smearcli"
LAYERS = {"core": 0, "render": 1, "features": 2, "cli": 3}
FEATURES = ("impls", "bench", "census", "engines", "tiny")
# same-layer imports allowed: (importer, imported)
BUILT_ON = {("census", "impls"), ("engines", "census"), ("engines", "impls"), ("engines", "tiny")}
# The census core's arrows into the transformers engine the mechanical move left (issue 56): each is
# cut by moving what it reaches into the core or behind the engine's registration. The list only
# shrinks: a new arrow fails `test_imports_only_go_down`, one cut fails `test_no_arrow_left_to_cut_is_gone`.
TO_CUT = {
    # the other engines' census sessions into transformers: their reference is transformers' full
    # pass of the same tiny model (its `reference`, the one seam); their CLI preparation loads
    # `--hf-model` through `cli.hf_model`, which every implementation reading it shares
    ("smearcli.engines.vllm.session", "smearcli.engines.transformers.reference"),
    ("smearcli.engines.llamacpp.session", "smearcli.engines.transformers.reference"),
}


def engine_of(mod: str):
    """The engine folder a module lives in (`smearcli.engines.NAME...`), or None (`engines.registry`,
    where every engine registers, is no engine's)."""
    parts = mod.split(".")
    return parts[2] if len(parts) > 2 and parts[1] == "engines" and (PKG / "engines" / parts[2]).is_dir() else None
FLAG = re.compile(r"(?<![\w-])--[a-z][a-z0-9]*(?:-[a-z0-9]+)*")


def module_name(path: Path) -> str:
    rel = path.relative_to(PKG.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


MODULES = {module_name(p): p for p in sorted(PKG.rglob("*.py"))}


def layer(mod: str) -> str:
    parts = mod.split(".")
    if len(parts) == 1:  # the package itself: __version__ and nothing else
        return "core"
    if parts[1] in ("cli", "__main__") or is_engine_cli(mod):
        return "cli"
    if parts[1] in FEATURES:
        return "features"
    if parts[1] == "render":
        return "render"
    return "core"


def is_engine_cli(mod: str) -> bool:
    """An engine's command-line preparation (`smearcli.engines.NAME.prepare`): CLI code in the engine's folder."""
    parts = mod.split(".")
    return len(parts) == 4 and parts[1] == "engines" and parts[3] == "prepare"


def group(mod: str) -> str:
    """The package a module belongs to, for same-layer imports: impls, bench, render, cli, core."""
    parts = mod.split(".")
    if parts[1] == "__main__" or is_engine_cli(mod):
        return "cli"
    return parts[1] if len(parts) > 2 or parts[1] in FEATURES + ("render", "cli") else "core"


def resolve(mod: str, node: ast.ImportFrom) -> list[str]:
    """The smearcli modules an import statement reaches (a package's submodules by name)."""
    is_pkg = MODULES[mod].name == "__init__.py"
    if node.level:
        base = mod.split(".")
        base = base[:len(base) - node.level + (1 if is_pkg else 0)]
        target = ".".join(base + ([node.module] if node.module else []))
    else:
        target = node.module or ""
    if not (target == "smearcli" or target.startswith("smearcli.")):
        return []
    out = []
    for alias in node.names:
        sub = f"{target}.{alias.name}"
        out.append(sub if sub in MODULES else target)
    return out


def imports(mod: str) -> list[tuple[str, ast.ImportFrom | ast.Import, list[str]]]:
    tree = ast.parse(MODULES[mod].read_text())
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            targets = [t for t in resolve(mod, node) if t in MODULES]
            if targets:
                found.append((mod, node, targets))
        elif isinstance(node, ast.Import):
            targets = [a.name for a in node.names if a.name in MODULES]
            if targets:
                found.append((mod, node, targets))
    return found


def edges() -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {m: set() for m in MODULES}
    for mod in MODULES:
        for _, _, targets in imports(mod):
            graph[mod] |= {t for t in targets if t != mod}
    return graph


def test_the_layers_are_known():
    assert {layer(m) for m in MODULES} == set(LAYERS)
    for name in ("smearcli.gpt.model", "smearcli.measure.compare", "smearcli.util.defaults"):
        assert layer(name) == "core"
    assert layer("smearcli.cli.commands.compare") == "cli"
    assert layer("smearcli.engines.nanochat.audit") == "features"
    assert layer("smearcli.engines.vllm.session") == "features" and layer("smearcli.engines.vllm.prepare") == "cli"


def test_imports_only_go_down():
    bad = []
    for mod, targets in edges().items():
        for t in targets:
            if t == "smearcli":  # `from .. import __version__`
                continue
            lo, hi = LAYERS[layer(mod)], LAYERS[layer(t)]
            if (mod, t) in TO_CUT:
                continue
            if engine_of(mod) and engine_of(t) and engine_of(mod) != engine_of(t):
                bad.append(f"{mod} imports another engine's {t}")
                continue
            if hi > lo or (hi == lo and hi > 0 and group(t) != group(mod) and (group(mod), group(t)) not in BUILT_ON):
                bad.append(f"{mod} ({layer(mod)}) imports {t} ({layer(t)})")
    assert not bad, "\n".join(bad)


# the libraries an engine runs: the census core reaches them only through an engine's session
ENGINE_LIBRARIES = ("transformers", "vllm", "llama_cpp")


def library_imports(mod: str) -> list[str]:
    """The engine libraries `mod` imports, at its top or inside a function."""
    found = []
    for node in ast.walk(ast.parse(MODULES[mod].read_text())):
        names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
            [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else []
        found += [n for n in names if n.split(".")[0] in ENGINE_LIBRARIES]
    return found


def test_the_census_core_imports_no_engine():
    """Not ours (`smearcli.engines`), nor the library an engine runs (transformers, whose registry
    of architectures and tiny configs are `smearcli.tiny`'s): what the census core knows of an
    engine comes through its session and registration."""
    core = [m for m in MODULES if m.startswith("smearcli.census")]
    graph = edges()
    assert core
    bad = [f"{m} imports {t}" for m in core for t in sorted(graph[m]) if engine_of(t)]
    bad += [f"{m} imports {lib}" for m in core for lib in library_imports(m)]
    assert not bad, "\n".join(bad)
    assert library_imports("smearcli.tiny.derive")  # the detector sees a function's own import


def test_the_census_core_names_no_engine_module():
    """Nor through a "module:name" string (`named.load`): each engine registers itself from its folder."""
    found = []
    for m in (m for m in MODULES if m.startswith("smearcli.census")):
        tree = ast.parse(MODULES[m].read_text())
        docs = {id(n.body[0].value) for n in ast.walk(tree)
                if isinstance(n, (ast.Module, ast.FunctionDef, ast.ClassDef)) and n.body
                and isinstance(n.body[0], ast.Expr) and isinstance(n.body[0].value, ast.Constant)}
        found += [f"{m}: {n.value!r}" for n in ast.walk(tree) if isinstance(n, ast.Constant) and id(n) not in docs
                  and isinstance(n.value, str) and "smearcli.engines." in n.value]
    assert not found, "\n".join(found)


def test_the_census_record_declares_no_engines_field():
    """An engine's own fields at a record's top level (its release, its data) are held fields its
    registration adds (`Engine.data`), never fields the core declares: only the unnamed engine's
    reference release (`transformers_version`, which every engine's reference stamps) is declared."""
    import smearcli.engines  # noqa: F401
    from smearcli.census import engines, record

    named = [e for e in engines.ENGINES.values() if not e.unnamed]
    assert {e.name for e in named} >= {"vllm", "llamacpp"}
    bad = [f"{f} names {e.name}" for e in named for f in record.DECLARED if e.name in f]
    bad += [f"{e.name}'s {f} is not held" for e in named for f in e.data if f not in record.HELD]
    assert not bad, "\n".join(bad)


def test_no_arrow_left_to_cut_is_gone():
    graph = edges()
    assert not {(m, t) for m, t in TO_CUT if t not in graph.get(m, ())}, "cut: take it out of TO_CUT"


def test_no_import_cycles():
    graph = edges()
    state: dict[str, int] = {}
    stack: list[str] = []
    cycles = []

    def visit(m: str) -> None:
        state[m] = 1
        stack.append(m)
        for t in sorted(graph[m]):
            if state.get(t) == 1:
                cycles.append(" -> ".join(stack[stack.index(t):] + [t]))
            elif t not in state:
                visit(t)
        stack.pop()
        state[m] = 2

    for m in sorted(graph):
        if m not in state:
            visit(m)
    assert not cycles, "\n".join(cycles)


def test_no_private_name_crosses_a_module():
    bad = []
    for mod in MODULES:
        for _, node, targets in imports(mod):
            if isinstance(node, ast.ImportFrom):
                for alias in node.names:
                    private = alias.name.startswith("_") and not alias.name.startswith("__")
                    if private and any(t != mod for t in targets):
                        bad.append(f"{mod} imports {alias.name} from {targets[0]}")
        tree = ast.parse(MODULES[mod].read_text())
        aliases = {}
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                for alias in node.names:
                    aliases[alias.asname or alias.name] = alias.name
        for node in ast.walk(tree):
            if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
                    and node.value.id in aliases and node.attr.startswith("_")
                    and not node.attr.startswith("__")):
                bad.append(f"{mod} uses {node.value.id}.{node.attr}")
    assert not bad, "\n".join(bad)


def _docstrings(tree: ast.AST) -> set[int]:
    ids = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                ids.add(id(body[0].value))
    return ids


def flags_named(source: str) -> list[str]:
    """Flag-like words in a module's string constants (docstrings and comments excepted)."""
    tree = ast.parse(source)
    skip = _docstrings(tree)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in skip:
            found += FLAG.findall(node.value)
    return found


def test_flag_detector_finds_flags():
    assert flags_named('raise ValueError(f"--text-file {p}: missing")') == ["--text-file"]
    assert flags_named('x = "a -- b, 1--2"') == []
    assert flags_named('def f():\n    """Use --chunks."""\n') == []


def test_no_flag_names_outside_the_cli():
    bad = {}
    for mod, path in MODULES.items():
        if layer(mod) == "cli":
            continue
        found = flags_named(path.read_text())
        if found:
            bad[mod] = sorted(set(found))
    assert not bad, bad


@pytest.mark.parametrize("mod", sorted(MODULES))
def test_module_says_what_it_owns(mod):
    """Every module's docstring names the one concept it holds (modules are cut by concept, not
    by length: no line cap)."""
    tree = ast.parse(MODULES[mod].read_text())
    if mod != "smearcli" and not mod.endswith("__main__"):
        assert ast.get_docstring(tree), f"{mod} has no docstring saying what it owns"


def test_the_vllm_worker_needs_no_sys_path_edit():
    """The worker runs as a script, so its directory comes first on sys.path: a module beside it
    named like one vLLM imports would shadow it. Nothing in its package may have such a name, and
    no module edits sys.path but the nanochat sandbox, which restores it."""
    import importlib.util
    here = PKG / "engines" / "vllm"
    for f in here.glob("*.py"):
        if f.stem not in ("__init__", "worker"):
            assert f.stem != "vllm" and importlib.util.find_spec(f.stem) is None, f
    edits = [m for m, p in MODULES.items() if "sys.path[" in p.read_text() or "sys.path.insert" in p.read_text()]
    assert edits == ["smearcli.engines.nanochat.sandbox"], edits


def test_verdict_words_are_written_once_in_the_verdict_module():
    """Every table, document and census line takes its words from smearcli.judging.verdicts: the literal
    words appear nowhere else in the package (the vLLM worker, which cannot import smearcli, speaks
    its own protocol word, "raised")."""
    found = {}
    for mod, path in MODULES.items():
        text = path.read_text()
        for word in ("crashed", "inconclusive", "unconfirmed", "not built"):
            for quote in ('"', "'"):
                if f"{quote}{word}{quote}" in text:
                    found.setdefault(word, []).append(mod)
    assert found == {w: ["smearcli.judging.verdicts"] for w in found}, found
    assert set(found) >= {"crashed", "inconclusive"}


# the names a verdict word goes by (`smearcli.judging.verdicts`)
VERDICT_NAMES = {"OK", "BUG", "UNCONFIRMED", "INCONCLUSIVE", "CRASHED", "TIMED_OUT", "NOT_RUN", "NOT_BUILT",
                 "UNSUPPORTED", "LATENT", "TIE_ARTIFACT", "BY_DESIGN", "LEFT_UNSUPPORTED"}


def chosen_words(tree: ast.AST) -> list[str]:
    """Where a verdict word is picked by a condition: one side of an `x if c else y`, or what a
    branch of an `if` returns or assigns."""
    def word(n) -> bool:
        if isinstance(n, ast.Call) and getattr(n.func, "id", None) == "str" and n.args:
            n = n.args[0]
        return isinstance(n, ast.Name) and n.id in VERDICT_NAMES or isinstance(n, ast.Attribute) and n.attr in VERDICT_NAMES

    def picks(value) -> bool:
        return word(value) or isinstance(value, ast.Tuple) and any(word(e) for e in value.elts)
    out = []
    for n in ast.walk(tree):
        if isinstance(n, ast.IfExp) and (word(n.body) or word(n.orelse)):
            out.append(ast.unparse(n))
        if isinstance(n, ast.If):
            for b in n.body + n.orelse:
                if isinstance(b, (ast.Return, ast.Assign)) and b.value is not None and picks(b.value):
                    out.append(ast.unparse(b))
    return out


def test_no_verdict_word_is_chosen_by_a_condition_outside_the_judge():
    """A word picked by a condition is a verdict rule, and every rule is the judge's: an engine says
    what it saw (a reason, a stop, a rerun's size) and the judge answers (issue 56, item 3)."""
    found = {(mod, said) for mod, path in MODULES.items() if mod not in ("smearcli.judging.judge", "smearcli.judging.verdicts")
             for said in chosen_words(ast.parse(path.read_text()))}
    assert not found, sorted(found)


def test_the_check_for_a_chosen_word_finds_one():
    said = chosen_words(ast.parse("def f(r):\n    if r:\n        return str(OK)\n    x = UNSUPPORTED if r else y\n"))
    assert sorted(said) == ["UNSUPPORTED if r else y", "return str(OK)"]


def untyped_reads(tree: ast.AST, one: set, by_name: set) -> list[str]:
    """Where record data is read as a dict: `.get(...)` or a quoted key on a field that holds one
    part (`rec.born_in.get("class")`, `(rec.vllm or {}).get("stuck")`, `rec.power["why"]`) or on an
    entry of a field that holds parts by name (`rec.schedules["prefill"]["status"]`,
    `rec.reach.get(p).get("result")`), and `isinstance(..., dict)` on either, which skips a typed
    part in silence. A lookup by name in a field of parts by name (`rec.schedules.get("prefill")`)
    is a mapping's, and allowed."""
    def holds_one(n) -> bool:  # an expression whose value is one part of a record (or None)
        if isinstance(n, ast.BoolOp) and isinstance(n.op, ast.Or):
            return holds_one(n.values[0])
        if isinstance(n, ast.Attribute):
            return n.attr in one
        if isinstance(n, ast.Call) and getattr(n.func, "id", None) == "getattr" and len(n.args) >= 2:
            return isinstance(n.args[1], ast.Constant) and n.args[1].value in one
        if isinstance(n, ast.Subscript):
            return isinstance(n.value, ast.Attribute) and n.value.attr in by_name
        if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr == "get":
            return isinstance(n.func.value, ast.Attribute) and n.func.value.attr in by_name
        if isinstance(n, ast.Call) and getattr(n.func, "id", None) == "born_module":  # its born_in, or None
            return True
        return False

    out = []
    for n in ast.walk(tree):
        if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr == "get" and holds_one(n.func.value):
            out.append(ast.unparse(n))
        elif isinstance(n, ast.Subscript) and isinstance(n.slice, ast.Constant) and isinstance(n.slice.value, str) \
                and holds_one(n.value):
            out.append(ast.unparse(n))
        elif isinstance(n, ast.Call) and getattr(n.func, "id", None) == "isinstance" and len(n.args) == 2 \
                and getattr(n.args[1], "id", None) == "dict" and holds_one(n.args[0]):
            out.append(ast.unparse(n))
    return out


def record_part_fields() -> tuple[set, set]:
    import smearcli.engines  # noqa: F401 - the engines' own data parts (`Engine.data`)
    from smearcli.census import record

    holds = dict(record.PARTS)  # the record's fields, and the fields of its parts, that hold parts
    todo, seen = [kind for kind, _ in record.PARTS.values()], set()
    while todo:
        part = todo.pop()
        if part in seen:
            continue
        seen.add(part)
        for name, (kind, how) in part.NESTED.items():
            holds[name] = (record.part_kind(kind), how)
            todo.append(record.part_kind(kind))
    one = {name for name, (_, how) in holds.items() if how == record.ONE}
    return one, {name for name, (_, how) in holds.items() if how != record.ONE}


def test_record_data_is_read_as_its_parts_outside_the_record_module():
    """A record is typed end to end (issue 56, item 4): every part of it (a schedule's result, where
    a finding is born, its confirmation, an engine's own data, ...) is read by its attributes. Only
    the record's own reading of a file (`census.record`, `census.records`) sees the JSON objects."""
    one, by_name = record_part_fields()
    own = {"smearcli.census.record", "smearcli.census.records"}
    files = {mod: path.read_text() for mod, path in MODULES.items() if mod not in own}
    files.update({f"scripts/{p.name}": p.read_text() for p in sorted((ROOT / "scripts").glob("*.py"))})
    for nb in sorted((ROOT / "notebooks").glob("*.ipynb")):  # their code cells, which read records too
        cells = json.loads(nb.read_text())["cells"]
        code = ["".join(c["source"]) for c in cells if c["cell_type"] == "code"]
        files[nb.name] = "\n".join(re.sub(r"(?m)^\s*[%!].*$", "pass", c) for c in code)  # IPython's magics
    assert len(files) > len(MODULES)
    found = {(mod, said) for mod, text in files.items() for said in untyped_reads(ast.parse(text), one, by_name)}
    assert not found, sorted(found)


def test_the_check_for_an_untyped_read_finds_each_kind():
    one, by_name = record_part_fields()
    code = ("a = (r.vllm or {}).get('stuck')\nb = r.born_in['class']\nc = r.schedules['x']['status']\n"
            "d = isinstance(r.confirmation, dict)\ne = r.reach.get(p).get('result')\nf = born_module(r).get('copies')\n"
            "g = isinstance(getattr(crop, 'api_finding', None), dict)\nh = e.their_crop.api_finding.get('at')\n"
            "ok = r.schedules.get('prefill'); ok2 = r.born_in.class_name; ok3 = r.schedules['x'].status\n")
    assert sorted(untyped_reads(ast.parse(code), one, by_name)) == sorted([
        "(r.vllm or {}).get('stuck')", "r.born_in['class']", "r.schedules['x']['status']",
        "isinstance(r.confirmation, dict)", "r.reach.get(p).get('result')", "born_module(r).get('copies')",
        "isinstance(getattr(crop, 'api_finding', None), dict)", "e.their_crop.api_finding.get('at')"])
