"""The stand-in's tensor-parallel state: the world a module is built for, and the rank tensor a traced graph reads.

NxD traces one SPMD graph for every rank (release 2.28.0's ``trace/spmd.py``): the modules are built
at rank 0 under a mocked process group, and the same compiled graph runs on every core with that
core's shard. The stand-in does the same: :class:`traced_world` sets the world size while ModelBuilder
builds and traces the modules, and the rank reaches the graph as an input tensor (what NxD's
``SPMDRank`` reads from a rank-indexed parameter), never as a constant.
"""

from __future__ import annotations

import torch

_WORLD = 1
_RANK_TENSOR: torch.Tensor | None = None  # set by ModelBuilder while it traces: the graph's rank input
_MOCKED = False  # collectives return their input while tracing (no other rank is running)


def get_tensor_model_parallel_size() -> int:
    return _WORLD


def get_tensor_model_parallel_rank() -> int:
    return 0  # SPMD: every module is built as rank 0; the shard decides what a core holds


def model_parallel_is_initialized() -> bool:
    return True


def rank_tensor() -> torch.Tensor:
    """The rank the running graph belongs to, as the tensor the trace takes it from (rank 0 outside a trace)."""
    return _RANK_TENSOR if _RANK_TENSOR is not None else torch.zeros(1, dtype=torch.long)


class traced_world:
    """``with traced_world(tp):`` modules are sized for ``tp`` ranks and collectives are mocked."""

    def __init__(self, world: int):
        self.world = world

    def __enter__(self):
        global _WORLD, _MOCKED
        self.saved = (_WORLD, _MOCKED)
        _WORLD, _MOCKED = self.world, True
        return self

    def __exit__(self, *exc):
        global _WORLD, _MOCKED
        _WORLD, _MOCKED = self.saved
        return False


def divide(numerator: int, denominator: int) -> int:
    """``numerator / denominator``, refused where it does not divide (as NxD's ``utils.divide``)."""
    if numerator % denominator:
        raise ValueError(f"{numerator} is not divisible by {denominator}")
    return numerator // denominator


def set_tensor_model_parallel_attributes(tensor: torch.Tensor, is_parallel: bool, dim: int, stride: int = 1,
                                         num_partitions: int = -1) -> None:
    """The attributes NxD's ``shard_children`` splits a checkpoint tensor by (``parallel_layers/utils.py``)."""
    tensor.tensor_model_parallel = is_parallel
    tensor.partition_dim = dim
    tensor.partition_stride = stride
    tensor.num_partitions = num_partitions if num_partitions > 0 else _WORLD
