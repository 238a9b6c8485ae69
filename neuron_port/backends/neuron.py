"""Single-core Neuron backend: ``torch_neuronx.trace``, saved with ``torch.jit.save``.

Needs the AWS Neuron SDK (``torch-neuronx`` from the Neuron repository); imported only inside
the functions below. The calls follow the torch-neuronx API reference (SDK 2.28); they have not
run on hardware in this project's CI, and :mod:`tests.test_neuron_contract` checks what is
handed to the tracer against that reference.

* Weights are kept out of the neff (``inline_weights_to_neff=False``) and every graph of a
  model is bound to the same state with ``torch_neuronx.replace_weights``, so no graph carries
  a compile-time copy of its own.
* No ``input_output_aliases``: torch-neuronx keys them by *parameter tensors of the traced
  module* (matched with ``torch.equal``), not by input positions, and a state tensor held by one
  traced module is not visible to another — the prefill and decode graphs would each keep their
  own cache. The KV store is therefore an ordinary input and output of every graph (a host round
  trip per step). A device-resident store shared by all graphs needs one owner of the state
  for every graph: neuronx-distributed's ModelBuilder (``nxd``), not yet built (issue 29).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

import torch
from torch import nn

from neuron_port.backends.sdk import require_backend
from neuron_port.backends.base import Runnable


def compiler_args(auto_cast: str = "none", model_type: str = "transformer", optimize: str | None = None,
                  extra: Sequence[str] = ()) -> list[str]:
    """``neuronx-cc`` arguments. ``auto_cast``: none | matmult | all (the compiler's choices)."""
    if auto_cast not in ("none", "matmult", "all"):
        raise ValueError(f"auto_cast must be none, matmult or all; found {auto_cast!r}")
    args = ["--model-type", model_type, "--auto-cast", auto_cast]
    if optimize:
        args.append(f"-{optimize}" if not optimize.startswith("-") else optimize)
    return args + list(extra)


class NeuronBackend:
    name = "neuron"

    def __init__(self, auto_cast: str = "none"):
        self.args = compiler_args(auto_cast)

    def compile(self, graph: nn.Module, example_inputs: Sequence[torch.Tensor], aliases: dict[int, int],
                options: dict[str, Any] | None = None) -> Runnable:
        """``aliases`` (input index -> output index) is not passed on: see the module docstring."""
        require_backend("neuron")
        import torch_neuronx

        args = list((options or {}).get("compiler_args", self.args))
        traced = torch_neuronx.trace(graph, tuple(example_inputs), compiler_args=args, inline_weights_to_neff=False)
        torch_neuronx.replace_weights(traced, graph.state_dict())
        return traced

    def save(self, runnable: Runnable, path: Path) -> None:
        torch.jit.save(runnable, str(path))

    def load(self, path: Path) -> Runnable:
        require_backend("neuron")
        import torch_neuronx  # noqa: F401  (registers the Neuron runtime ops)

        return torch.jit.load(str(path))


__all__ = ["NeuronBackend", "compiler_args"]
