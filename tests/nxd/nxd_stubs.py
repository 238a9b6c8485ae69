"""Import-time stand-ins for the Neuron compiler packages, so neuronx-distributed's own Python runs here.

neuronx-distributed's ``parallel_layers`` and ``trace.trace`` import ``torch_neuronx`` and
``neuronxcc`` at module level (NKI kernels, the platform target, compiler collectives configs),
and its package ``__init__`` files import ModelBuilder, the trainer and the kernels. Neither
compiler package exists off an Inferentia host. :func:`install` therefore

* answers every ``import torch_neuronx...`` / ``import neuronxcc...`` with a module whose
  attributes are inert placeholders (a decorator returns the function it decorates; calling,
  indexing or reading an attribute returns another placeholder), with one real value:
  ``torch_neuronx.utils.get_platform_target()`` returns ``"inf2"``, which NxD maps to its
  NeuronCore-v2 hardware type;
* registers ``neuronx_distributed`` and ``neuronx_distributed.trace`` as bare packages over the
  vendored source (``third_party/neuronx-distributed``), so their ``__init__`` files (which
  pull in ModelBuilder) are not executed; every other module runs as released.

Nothing from the stand-ins runs in the code under test: the parallel layers' forward, the
collectives (``NXD_CPU_MODE=1``: gloo) and the checkpoint sharding are NxD's own code.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
import types
from pathlib import Path

STUBBED = ("torch_neuronx", "neuronxcc")
SOURCE = Path(__file__).resolve().parents[2] / "third_party" / "neuronx-distributed"
PLATFORM_TARGET = "inf2"


class _PlaceholderMeta(type):
    def __getattr__(cls, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return _placeholder(f"{cls.__name__}.{name}")

    def __call__(cls, *args, **kwargs):
        if len(args) == 1 and callable(args[0]) and not kwargs:
            return args[0]  # used as a decorator: the function itself
        return type.__call__(cls)

    def __getitem__(cls, key):
        return _placeholder(f"{cls.__name__}[]")

    def __iter__(cls):
        return iter(())


def _call(self, *args, **kwargs):
    if len(args) == 1 and callable(args[0]) and not kwargs:
        return args[0]
    return _placeholder(type(self).__name__ + "()")()


def _attribute(self, name):
    if name.startswith("__"):
        raise AttributeError(name)
    return _placeholder(f"{type(self).__name__}.{name}")


def _placeholder(name: str) -> type:
    return _PlaceholderMeta(name, (), {"__call__": _call, "__getattr__": _attribute})


class _PlaceholderModule(types.ModuleType):
    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return _placeholder(f"{self.__name__}.{name}")


class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, fullname, path, target=None):
        if fullname.split(".")[0] in STUBBED:
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec):
        module = _PlaceholderModule(spec.name)
        module.__path__ = []
        module.__version__ = "2.8.0+import-stub"
        return module

    def exec_module(self, module):
        if module.__name__ == "torch_neuronx.utils":
            module.get_platform_target = lambda: PLATFORM_TARGET


def _bare_package(name: str, path: Path) -> None:
    package = types.ModuleType(name)
    package.__path__ = [str(path)]
    sys.modules[name] = package


def install(source: Path = SOURCE) -> None:
    """Install the stand-ins and the vendored neuronx-distributed source (idempotent)."""
    if not any(isinstance(f, _Finder) for f in sys.meta_path):
        sys.meta_path.insert(0, _Finder())
    _bare_package("neuronx_distributed", source / "neuronx_distributed")
    _bare_package("neuronx_distributed.trace", source / "neuronx_distributed" / "trace")
