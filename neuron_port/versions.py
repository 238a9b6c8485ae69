"""Versions the library needs, checked when it is imported.

transformers older than 5.24 breaks the port in ways that are hard to see: 5.13 (the field
report's) fails deep inside with an ``AttributeError`` on the per-layer config attribute, and 5.23 silently ignores
the ``cache=`` keyword the graphs pass, so the port's KV store is never used and the output is
simply wrong. An older version is refused up front, in one line.
"""

from __future__ import annotations

import re
from importlib import metadata

LIBRARY_VERSION = "0.1.0"
"""This library's version (``neuron_port.__version__``; pyproject.toml says the same), recorded in artifacts."""

MIN_TRANSFORMERS = (5, 24)


def _release(text: str) -> tuple[int, ...]:
    """The leading ``major.minor`` numbers of a version string ("5.24.0.dev0" -> (5, 24): a 5.24
    pre-release counts as 5.24, which has the ``cache=`` keyword and the Gemma-4 classes)."""
    match = re.match(r"(\d+)(?:\.(\d+))?", text)
    return tuple(int(g) for g in match.groups() if g is not None) if match else ()


def transformers_problem(found: str | None) -> str | None:
    """Why ``found`` (an installed transformers version, or None) cannot run the port; None when it can."""
    need = ".".join(map(str, MIN_TRANSFORMERS))
    if found is None:
        return f"neuron_port needs transformers >= {need}, found none installed: pip install 'transformers>={need},<6'"
    if _release(found)[:2] < MIN_TRANSFORMERS:
        return (f"neuron_port needs transformers >= {need} (older releases fail inside the Gemma-4 classes or ignore "
                f"the cache keyword the graphs pass), found {found}: pip install 'transformers>={need},<6'")
    return None


def check_transformers() -> None:
    """Raise ImportError with one line when the installed transformers is too old (or missing).

    The version is read from the installed distribution's metadata (nothing imported); a
    transformers importable without metadata (a bare source checkout) counts as missing."""
    try:
        found: str | None = metadata.version("transformers")
    except metadata.PackageNotFoundError:
        found = None
    problem = transformers_problem(found)
    if problem is not None:
        refusal = ImportError(problem)
        refusal.neuron_port_refusal = True  # the launcher prints it as one line; other import errors keep their traceback
        raise refusal


__all__ = ["LIBRARY_VERSION", "MIN_TRANSFORMERS", "transformers_problem", "check_transformers"]
