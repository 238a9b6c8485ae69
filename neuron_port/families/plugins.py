"""Family adapters from other distributions: the ``neuron_port.families`` entry-point group.

A package that ports a family the library does not ship declares, in its ``pyproject.toml``::

    [project.entry-points."neuron_port.families"]
    helium = "helium_port:HeliumFamily"      # a DecoderFamily subclass, or an instance of one

Once it is pip-installed, every process that asks for an adapter finds it — the command, gloo
ranks (fresh processes), the fresh-process artifact check and the server — without a wrapper
script. Entry points are read once, on the first lookup. A plugin adapter that claims a model
type the library ships replaces the shipped adapter, with a warning, so a shipped adapter can
be fixed without forking. A plugin that fails to load is reported as a warning naming it and
its error; the model types it would have served stay unsupported.
"""

from __future__ import annotations

import functools
import warnings
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from importlib import metadata
from typing import Any

from neuron_port.families.decoder import DecoderFamily

GROUP = "neuron_port.families"


@dataclass(frozen=True)
class AdapterSource:
    """Where an adapter comes from: its class, and the distribution (with version) that installed it."""

    name: str
    adapter_class: str
    distribution: str
    version: str | None
    entry_point: str | None = None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    def requirement(self) -> str:
        return f"{self.distribution}=={self.version}" if self.version else self.distribution


def class_path(family: DecoderFamily) -> str:
    cls = type(family)
    return f"{cls.__module__}:{cls.__qualname__}"


@functools.lru_cache(maxsize=1)
def _installed_version() -> str | None:
    """This package's installed version, read once (None from a source tree never installed)."""
    try:
        return metadata.version("neuron-port")
    except metadata.PackageNotFoundError:
        return None


def shipped_source(family: DecoderFamily) -> AdapterSource:
    return AdapterSource(family.name, class_path(family), "neuron-port", _installed_version())


def _as_family(obj: Any) -> DecoderFamily:
    if isinstance(obj, type) and issubclass(obj, DecoderFamily):
        obj = obj()
    if not isinstance(obj, DecoderFamily):
        raise TypeError(f"expected a DecoderFamily subclass or instance, found {type(obj).__name__}")
    if not obj.model_types:
        raise TypeError(f"adapter {obj.name!r} declares no model_types")
    return obj


def discover() -> Iterator[tuple[DecoderFamily, AdapterSource]]:
    """Every adapter the installed distributions declare, in a stable order (by distribution, then name).

    Failures are warnings naming the plugin; nothing here raises."""
    entries = sorted(metadata.entry_points(group=GROUP),
                     key=lambda e: ((e.dist.name if e.dist else ""), e.name))
    for entry in entries:
        dist = entry.dist.name if entry.dist else "(unknown distribution)"
        version = entry.dist.version if entry.dist else None
        try:
            family = _as_family(entry.load())
        except Exception as exc:  # a broken plugin must not take the library down with it
            warnings.warn(f"the {GROUP} plugin {entry.name!r} ({entry.value}) from {dist} {version or ''} "
                          f"could not be loaded, its model types stay unsupported: {type(exc).__name__}: {exc}",
                          RuntimeWarning, stacklevel=2)
            continue
        yield family, AdapterSource(family.name, class_path(family), dist, version, entry.name)


__all__ = ["GROUP", "AdapterSource", "class_path", "shipped_source", "discover"]
