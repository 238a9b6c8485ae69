"""Single-core Neuron backend: ``torch_neuronx.trace``, saved with ``torch.jit.save``.

Needs the AWS Neuron SDK (``torch-neuronx`` from the Neuron repository); imported only inside
the functions below. The KV store's input -> output aliases are passed to the tracer so the
cache stays resident on the NeuronCore between calls.
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
        require_backend("neuron")
        import torch_neuronx

        args = list((options or {}).get("compiler_args", self.args))
        return torch_neuronx.trace(graph, tuple(example_inputs), compiler_args=args,
                                   input_output_aliases=dict(aliases))

    def save(self, runnable: Runnable, path: Path) -> None:
        torch.jit.save(runnable, str(path))

    def load(self, path: Path) -> Runnable:
        require_backend("neuron")
        import torch_neuronx  # noqa: F401  (registers the Neuron runtime ops)

        return torch.jit.load(str(path))


__all__ = ["NeuronBackend", "compiler_args"]
