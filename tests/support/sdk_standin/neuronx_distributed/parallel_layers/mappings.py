"""The stand-in's all-reduce: a registered op, so a traced graph holds it and a fresh process runs it.

``neuron_standin::all_reduce(x, rank, world)`` sums ``x`` over the ``world`` ranks of the running
executor, which runs every rank's graph at once (one thread each, as the Neuron runtime runs every
core at once). Each rank puts its partial result in its slot, waits for the others, and sums the
slots in rank order, so every rank gets the same bits (as a device all-reduce gives them). A rank
that waits longer than ``NEURON_STANDIN_COLLECTIVE_TIMEOUT`` seconds (default 120) fails with the
reason instead of hanging. While ModelBuilder traces (no other rank runs), the op returns its input.
"""

from __future__ import annotations

import os
import threading

import torch

from neuronx_distributed.parallel_layers import parallel_state


class _Rendezvous:
    def __init__(self, world: int):
        timeout = float(os.environ.get("NEURON_STANDIN_COLLECTIVE_TIMEOUT", "120"))
        self.world, self.barrier = world, threading.Barrier(world, timeout=timeout)
        self.slots: list[torch.Tensor | None] = [None] * world

    def all_reduce(self, x: torch.Tensor, rank: int) -> torch.Tensor:
        self.slots[rank] = x
        try:
            self.barrier.wait()  # every rank's partial result is in
            total = self.slots[0].clone()
            for other in self.slots[1:]:
                total += other
            self.barrier.wait()  # every rank has read the slots before any reuses them
        except threading.BrokenBarrierError:
            raise RuntimeError(f"rank {rank} of {self.world} waited for the other ranks at an all-reduce and they "
                               "never came: run every rank's graph at once (the executor needs at least "
                               f"{self.world - 1} inter-op threads: torch.set_num_interop_threads)") from None
        return total


_RENDEZVOUS: dict[int, _Rendezvous] = {}
_LOCK = threading.Lock()


def _all_reduce(x: torch.Tensor, rank: torch.Tensor, world: int) -> torch.Tensor:
    if world == 1 or parallel_state._MOCKED:
        return x.clone()
    with _LOCK:
        meeting = _RENDEZVOUS.setdefault(world, _Rendezvous(world))
    return meeting.all_reduce(x, int(rank.reshape(-1)[0]))


if not hasattr(torch.ops.neuron_standin, "all_reduce"):
    _LIBRARY = torch.library.Library("neuron_standin", "DEF")
    _LIBRARY.define("all_reduce(Tensor x, Tensor rank, int world) -> Tensor")
    _LIBRARY.impl("all_reduce", _all_reduce, "CompositeExplicitAutograd")


def reduce_from_tensor_model_parallel_region(x: torch.Tensor) -> torch.Tensor:
    """The sum of ``x`` over the tensor-parallel ranks (NxD's name for its forward all-reduce)."""
    world = parallel_state.get_tensor_model_parallel_size()
    if world == 1:
        return x
    return torch.ops.neuron_standin.all_reduce(x, parallel_state.rank_tensor(), world)
