"""Single-core Neuron backend: neuronx-distributed's ModelBuilder at tp 1.

``--backend neuron`` builds the same artifact as ``--backend nxd --tp 1``
(:func:`neuron_port.backends.nxd_artifact.write_nxd_rank`), recorded as ``neuron``. It no longer
traces each graph with ``torch_neuronx.trace``, for two reasons read in the torch-neuronx 2.28 API
reference:

* a trace with its weights kept out of the neff (``inline_weights_to_neff=False``) copies them from
  the host at every call unless ``torch_neuronx.move_trace_to_device`` is called, which for the
  real E2B in bf16 is gigabytes per token;
* nothing there documents one state shared by two separately traced modules: each traced module
  keeps its own, and binding the same host tensors to both (``replace_weights``) is not a promise
  that prefill's KV writes reach decode on the device.

ModelBuilder documents both: its executor runs every graph key over one set of weights, loaded onto
the core once at ``nxd_model.initialize``, and keeps the aliased KV store as one state for all
keys. So a single core takes the documented path the multi-core one takes; the device checkpoint
holds device tensors only (:func:`neuron_port.backends.nxd_checkpoint.nxd_checkpoint`).

``port --backend neuron`` (graphs compiled one by one in process) is refused with that advice: the
Neuron path is an artifact, written by ``neuron-port compile MODEL --backend neuron --out DIR`` and
run by ``neuron-port generate DIR`` or ``serve``. The SDK is imported only when that runs.
"""

from __future__ import annotations

from neuron_port.backends.nxd_artifact import NxdBackend
from neuron_port.backends.registry import BACKENDS

IN_PROCESS_REFUSAL = BACKENDS["neuron"].refusal
"""Why ``port --backend neuron`` compiles nothing in process, and what to run instead."""


class NeuronBackend(NxdBackend):
    """Loads a ``neuron`` artifact (a ModelBuilder executor for one core); compiles nothing graph by graph."""

    name = "neuron"


__all__ = ["NeuronBackend", "IN_PROCESS_REFUSAL"]
