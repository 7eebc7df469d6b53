"""Objects named by a "module:name" string, imported when first needed: a registration (an
implementation's runners, a census engine's session) names its code so that registering it, and
`smearcli --help`, import nothing heavy."""

from __future__ import annotations

import importlib


def load(thing):
    """`thing` itself, or the object a "module:name" string names."""
    if not isinstance(thing, str):
        return thing
    module, _, name = thing.partition(":")
    return getattr(importlib.import_module(module), name)
