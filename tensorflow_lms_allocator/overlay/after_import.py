"""Running a function right after a module's first import, without importing it.

``after_import("tensorflow", then)`` puts a finder in front of
``sys.meta_path``; when something imports ``tensorflow``, the finder lets the
normal finders find it, and its loader runs the module as they would, then
calls ``then(module)``. The finder removes itself at that first import (a
mere ``importlib.util.find_spec`` does not count), and the module keeps its
own loader (``__loader__``, ``__spec__.loader``), so nothing else can tell. Used by the package to finish activating LMS when
TensorFlow loads (Note [Activation] in ``overlay/activation.py``).

Example:
    >>> after_import("tensorflow", lambda tf: print(tf.__version__))  # doctest: +SKIP
    >>> import tensorflow  # doctest: +SKIP
    2.21.0
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
from types import ModuleType
from typing import Callable


class _Loader(importlib.abc.Loader):
    """Runs the module with its own loader, then the callback."""

    def __init__(self, loader: importlib.abc.Loader, then: Callable[[ModuleType], None]) -> None:
        self._loader = loader
        self._then = then

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return self._loader.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        cancel(module.__name__)  # once
        module.__spec__.loader = module.__loader__ = self._loader  # its own from here on
        self._loader.exec_module(module)
        self._then(module)


class _Finder(importlib.abc.MetaPathFinder):
    def __init__(self, name: str, then: Callable[[ModuleType], None]) -> None:
        self.name = name
        self._then = then

    def find_spec(self, fullname: str, path: object = None,
                  target: object = None) -> importlib.machinery.ModuleSpec | None:
        if fullname != self.name:
            return None
        # The finders after it find the module. Only an import runs the
        # loader: importlib.util.find_spec alone (which asks this finder too)
        # leaves the callback waiting.
        for finder in list(sys.meta_path):
            find = getattr(finder, "find_spec", None)
            if finder is self or find is None:
                continue
            spec = find(fullname, path, target)
            if spec is not None:
                if spec.loader is not None:
                    spec.loader = _Loader(spec.loader, self._then)
                return spec
        return None


def after_import(name: str, then: Callable[[ModuleType], None]) -> None:
    """Calls then(module) when top-level module `name` is first imported (not imported yet)."""
    cancel(name)
    sys.meta_path.insert(0, _Finder(name, then))


def cancel(name: str) -> None:
    """Forgets the callback for `name`, if one waits."""
    sys.meta_path[:] = [f for f in sys.meta_path
                        if not (isinstance(f, _Finder) and f.name == name)]


def waiting(name: str) -> bool:
    """Whether a callback waits for `name`'s import."""
    return any(isinstance(f, _Finder) and f.name == name for f in sys.meta_path)
