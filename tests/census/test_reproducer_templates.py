"""The reproducers vLLM's and llama.cpp's censuses write run in those engines' own environments,
which CI does not have: the stand-ins stop them at `import vllm` (exit 2), before their bodies run. So
their templates are held here to what any Python file must be: formatted, each compiles, and every
name it reads is one it defines, imports or Python has built in (a template that lost an import
would exit 1 on its NameError, and read as "the bug is there")."""

from __future__ import annotations

import builtins
import collections
import symtable

import pytest

from smearcli.engines.llamacpp import session as llamacpp
from smearcli.engines.vllm import session as vllm


def undefined(source: str) -> set[str]:
    """The names `source` reads at any level that nothing in it defines, and Python does not build in."""
    top = symtable.symtable(source, "reproducer", "exec")
    defined = {s.get_name() for s in top.get_symbols() if s.is_assigned() or s.is_imported() or s.is_namespace()}
    defined |= set(dir(builtins)) | {"__file__", "__name__", "__doc__"}  # what a script run as a file has
    out = set()

    def walk(table) -> None:
        for s in table.get_symbols():
            free = table is top or s.is_global() and not s.is_declared_global()
            if free and s.is_referenced() and s.get_name() not in defined:
                out.add(s.get_name())
        for child in table.get_children():
            walk(child)
    walk(top)
    return out


@pytest.mark.parametrize("template", [vllm.TEMPLATE, llamacpp.TEMPLATE], ids=["vllm", "llamacpp"])
def test_a_reproducer_template_defines_every_name_it_reads(template):
    source = template.format_map(collections.defaultdict(int))  # every value a number: any literal will do
    compile(source, "reproducer", "exec")
    assert undefined(source) == set()


def test_the_check_finds_a_lost_import():
    assert undefined("import os\ndef f():\n    return os.sep, tempfile.mkdtemp()\n") == {"tempfile"}
    assert undefined("def f(x):\n    y = x\n    return y, len(x)\n") == set()
