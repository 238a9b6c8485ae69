"""neuron_port: reusable primitives for porting Hugging Face decoder models to AWS Inferentia2.

Everything here imports and runs on a plain CPU. The Neuron SDK (torch-neuronx,
neuronx-distributed) is an optional backend, imported lazily only where it is used.
"""

from __future__ import annotations

from neuron_port.versions import LIBRARY_VERSION, check_transformers

__version__ = LIBRARY_VERSION

check_transformers()  # one line naming the found and the needed version, before anything imports transformers

from neuron_port.auto import PortedModel, from_pretrained  # noqa: E402
from neuron_port.model.configs import load_config  # noqa: E402
from neuron_port.model.layout import LayerSpec, Layout, describe  # noqa: E402

__all__ = ["__version__", "from_pretrained", "PortedModel", "load_config", "describe", "Layout", "LayerSpec"]
