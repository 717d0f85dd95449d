"""Run a registration right after a torch module is imported.

Note [Registering with lazily imported torch modules]
~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
Some of torch's registries live in modules that ``import torch`` does not
load: dynamo's device interfaces (``torch._dynamo.device_interface``) and
Inductor's device backends (``torch._inductor.codegen.common``). Importing
them from ``import torch_openreg`` would cost every user of the device
seconds (``torch._dynamo`` pulls in much of Inductor), even those who never
compile. Instead, ``after_import(name, register)`` calls ``register(module)``
the moment ``name`` has finished executing, before the import statement
that loaded it returns, so the registration is in place before any other
code can read the registry (in particular before ``torch._inductor.utils``
takes its one snapshot of the registered device interfaces). If the module
is loaded already, ``register`` runs at once.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
from types import ModuleType
from typing import Callable


class _RegisterOnLoad(importlib.abc.Loader):
    """Wraps a module's own loader; runs the registration after its code."""

    def __init__(self, loader: importlib.abc.Loader, register: Callable[[ModuleType], None]):
        self._loader = loader
        self._register = register

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        self._loader.exec_module(module)
        self._register(module)


class _Finder(importlib.abc.MetaPathFinder):
    """Finds ``name`` the way Python would, and wraps its loader."""

    def __init__(self, name: str, register: Callable[[ModuleType], None]):
        self._name = name
        self._register = register

    def find_spec(self, fullname, path, target=None):
        if fullname != self._name:
            return None
        # One module, once. NB: the import system is iterating over the list
        # sys.meta_path names now; removing this finder from that list would
        # make it skip the next finder for this lookup, so sys.meta_path is
        # bound to a new list instead.
        sys.meta_path = [finder for finder in sys.meta_path if finder is not self]
        spec = importlib.machinery.PathFinder.find_spec(fullname, path, target)
        if spec is None or spec.loader is None:
            return spec
        spec.loader = _RegisterOnLoad(spec.loader, self._register)
        return spec


def after_import(name: str, register: Callable[[ModuleType], None]) -> None:
    """Call ``register(module)`` once ``name`` is imported (now, if it already is)."""
    module = sys.modules.get(name)
    if module is not None:
        register(module)
    else:
        sys.meta_path.insert(0, _Finder(name, register))
