"""Stand-in torch_neuronx (see tests/support/sdk_standin/README.md): importable, and it registers the runtime's
collective (``neuron_standin::all_reduce``) that a loaded tensor-parallel executor calls."""

import neuronx_distributed.parallel_layers.mappings  # noqa: F401  (registers the collective op)
import torch

__version__ = "2.8.0+standin"

try:  # every rank of an executor runs at once: one inter-op thread per rank beyond the first (tp up to 9)
    if torch.get_num_interop_threads() < 8:
        torch.set_num_interop_threads(8)
except RuntimeError:  # the pool already started; a wider tp than it holds fails at its first all-reduce, saying so
    pass
