"""Layer ``artifacts``: a compiled port on disk.

The manifest and its verification (``manifest``), writing every rank's graphs and the host files
(``writer``), and reading one rank's port back without a model (``reader``).
"""

from __future__ import annotations

from neuron_port.artifacts.manifest import verify
from neuron_port.artifacts.reader import load_rank_port
from neuron_port.artifacts.record import Manifest
from neuron_port.artifacts.writer import write_artifact

__all__ = ["Manifest", "verify", "write_artifact", "load_rank_port"]
