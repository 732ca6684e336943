"""The lazy package face: a package names its public names and the submodule each lives in,
and a name loads its module on first use, so importing the package imports none of them.

In the package's ``__init__.py``::

    __all__, __getattr__ = lazy_face(__name__, {"Engine": "generate", ...})
"""
from __future__ import annotations

import importlib
from typing import Any, Callable


def lazy_face(package: str, where: dict[str, str]) -> tuple[list[str], Callable[[str], Any]]:
    """``__all__`` (the names, sorted) and the module ``__getattr__`` that imports
    ``package.where[name]`` when ``name`` is first asked for."""

    def __getattr__(name: str) -> Any:
        module = where.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        return getattr(importlib.import_module(f"{package}.{module}"), name)

    return sorted(where), __getattr__
