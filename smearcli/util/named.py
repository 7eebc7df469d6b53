"""Objects named by a "module:name" string, imported when first needed: a registration (an
implementation's runners, a census engine's session) names its code so that registering it, and
`smearcli --help`, import nothing heavy; and a package that lends a module's names on first use
(`lend`), so that its light modules (an engine's registration) import without its heavy one."""

from __future__ import annotations

import importlib
import importlib.util
import sys


def load(thing):
    """`thing` itself, or the object a "module:name" string names."""
    if not isinstance(thing, str):
        return thing
    module, _, name = thing.partition(":")
    return getattr(importlib.import_module(module), name)


def lend(package: dict, module: str = "implementation"):
    """`(__getattr__, __dir__)` for the package whose globals are `package`: a name that is a
    module of the package is that module; any other is `module`'s public name of that name, and on
    the first such use every public name of `module` becomes the package's own (looked up here no
    more). Until then the package imports nothing but itself."""
    name_of = package["__name__"]

    def lent():
        return importlib.import_module(f"{name_of}.{module}")

    def __getattr__(name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        sub = f"{name_of}.{name}"
        if sub in sys.modules or importlib.util.find_spec(sub) is not None:  # a module of the folder: itself
            return sys.modules.get(sub) or importlib.import_module(sub)
        names = vars(lent())
        package.update({k: v for k, v in names.items() if not k.startswith("_")})
        try:
            return names[name]
        except KeyError:
            raise AttributeError(f"module {name_of!r} has no attribute {name!r}") from None

    def __dir__() -> list[str]:
        return sorted(set(package) | {k for k in vars(lent()) if not k.startswith("_")})

    return __getattr__, __dir__
