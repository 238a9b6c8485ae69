"""Progress bars on the long steps (reading a checkpoint, tracing and compiling graphs, hashing an artifact), by
tqdm, which transformers and huggingface_hub already draw theirs with.

A bar shows on a terminal only (tqdm's own rule: off when stderr is not a TTY, so logs and pipes stay clean) and
never when quiet: ``neuron-port --quiet`` or ``NEURON_PORT_QUIET=1``, which child processes (tensor-parallel
ranks) inherit.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from typing import Any, TypeVar

from tqdm import tqdm

QUIET_ENV = "NEURON_PORT_QUIET"
T = TypeVar("T")


def quiet() -> bool:
    """Whether progress bars are off everywhere (``NEURON_PORT_QUIET=1``)."""
    return os.environ.get(QUIET_ENV) == "1"


def set_quiet(on: bool = True) -> None:
    """Turn progress bars off (or back on) in this process and the processes it starts."""
    if on:
        os.environ[QUIET_ENV] = "1"
    else:
        os.environ.pop(QUIET_ENV, None)


def progress(items: Iterable[T] | None = None, desc: str = "", unit: str = "it", total: int | None = None,
             at_least: int = 2) -> Any:
    """A tqdm bar over ``items`` (or a manual one of ``total`` steps: call ``update``), shown on a terminal unless
    quiet, and only for ``at_least`` steps or more (one step has nothing to show); it clears itself when done."""
    count = total if total is not None else (len(items) if hasattr(items, "__len__") else None)
    off = True if quiet() or (count is not None and count < at_least) else None  # None: tqdm's own TTY test
    return tqdm(items, desc=desc, unit=unit, total=total, leave=False, disable=off)


__all__ = ["QUIET_ENV", "quiet", "set_quiet", "progress"]
