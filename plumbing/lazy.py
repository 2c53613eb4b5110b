"""A stage package's public names, imported from their modules on first use (PEP 562).

    from l7_fast import LLM          # imports l7_fast.stage (torch, triton, the kernels) now
    from l7_fast.options import ENGINE_OPTIONS   # imports no torch: the package itself is light

So a script can build its flags from the options stages declare and refuse a bad one before
torch and Triton load. (Each module that defines a Triton kernel imports ``plumbing.runtime``
before ``triton``: tests/test_structure.py checks it, so the interpreter is set up first however a
kernel module is reached.)
"""
from __future__ import annotations

import importlib
import sys


def exports(package: str, table: dict[str, tuple[str, ...]]):
    """``table``: relative module -> the names it exports. Returns the package's ``__getattr__``,
    ``__dir__`` and ``__all__``."""
    where = {name: module for module, names in table.items() for name in names}

    def __getattr__(name: str):
        if name not in where:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(where[name], package), name)
        setattr(sys.modules[package], name, value)      # the next lookup is a plain attribute
        return value

    def __dir__():
        return sorted(where)

    return __getattr__, __dir__, sorted(where)
