"""A traceable all-reduce for tensor-parallel ranks on CPU.

``torch.ops.neuron_port.all_reduce_sum`` is a registered custom op: eager code calls it like any
op, and ``torch.jit.trace`` records it in the graph, so a traced rank graph saved with
``torch.jit.save`` still performs the all-reduce when a fresh process loads and runs it (that
process must import this module first). Outside an initialised process group it is the identity.
"""

from __future__ import annotations

import torch
import torch.distributed as dist


@torch.library.custom_op("neuron_port::all_reduce_sum", mutates_args=())
def all_reduce_sum(x: torch.Tensor) -> torch.Tensor:
    """Sum of ``x`` over the default process group (a new tensor)."""
    y = x.clone()
    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        dist.all_reduce(y)
    return y


@all_reduce_sum.register_fake
def _all_reduce_sum_shape(x: torch.Tensor) -> torch.Tensor:
    return torch.empty_like(x)


def process_group_reduce(x: torch.Tensor) -> torch.Tensor:
    """The ``reduce`` callable for row-parallel layers in a gloo rank."""
    return torch.ops.neuron_port.all_reduce_sum(x)


__all__ = ["all_reduce_sum", "process_group_reduce"]
