"""Tensor-parallel ranks that step together with the server's engine (serving a tp > 1 artifact).

The server process is rank 0: its engine decides each round (which slots to release, which
requests to admit) and broadcasts it; ranks 1..tp-1 are processes of their own that load their
graphs from the artifact and apply the same round to their own :class:`~neuron_port.generation.slots.SlotBatch`
(the same prompts, parameters and seeds, so the same releases, admissions and samples). Every
prefill and decode step runs on all ranks at once, and the all-reduce inside the traced graphs
keeps their logits equal. Each rank holds only its own KV store. Followers exit when the engine
closes (or when the server process goes, being daemons).

Two process groups: the default one, which the graphs' all-reduce uses, with a finite timeout (a
step never legitimately waits long), and one for the rounds, with a long one (an idle server
waits for its next round). Rank 0 checks that every follower is alive before each round; any
failure under lockstep stops the engine (:class:`~neuron_port.serve.engine.Engine`) rather than let the
ranks drift apart.
"""

from __future__ import annotations

import datetime
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch.distributed as dist
import torch.multiprocessing as mp

from neuron_port.artifacts.record import Manifest
from neuron_port.parallel.launch import CHILD_ENV, free_port, join_process_group

ROUND_TIMEOUT = datetime.timedelta(days=30)  # an idle server waits for its next round this long
STEP_TIMEOUT = datetime.timedelta(minutes=10)  # a collective inside a step (or loading) waits at most this long


def _rank_port(directory: str, manifest: Manifest, rank: int):
    from neuron_port.artifacts.reader import load_rank_port
    from neuron_port.parallel.collectives import process_group_reduce

    return load_rank_port(directory, manifest, rank, process_group_reduce)


def _follow(rank: int, tp: int, init: str, directory: str, manifest: Manifest, slots: int, pad_id: int) -> None:
    """A follower rank: load its graphs, then apply every round rank 0 broadcasts until it sends None."""
    from neuron_port.generation.slots import SlotBatch
    from neuron_port.model.tokenizer import load_tokenizer

    os.environ[CHILD_ENV] = "1"
    join_process_group(init, rank, tp, STEP_TIMEOUT)
    rounds = dist.new_group(backend="gloo", timeout=ROUND_TIMEOUT)
    try:
        batch = SlotBatch(_rank_port(directory, manifest, rank), slots, load_tokenizer(directory), pad_id)
        while True:
            box: list[Any] = [None]
            dist.broadcast_object_list(box, src=0, group=rounds)
            if box[0] is None:
                return
            released, entries = box[0]
            for slot in released:
                batch.release(slot)
            batch.admit([(prompt, params, None) for prompt, params in entries])
            batch.step()
    finally:
        dist.destroy_process_group()


class Lockstep:
    """Rank 0's side: the follower processes and the broadcast of each round."""

    def __init__(self, directory: str | Path, manifest: Manifest, slots: int, pad_id: int):
        self.tp = manifest.host_ranks
        init = f"tcp://127.0.0.1:{free_port()}"
        ctx = mp.get_context("spawn")
        self.followers = [ctx.Process(target=_follow, args=(r, self.tp, init, str(directory), manifest, slots, pad_id),
                                      name=f"neuron-port-rank{r}", daemon=True) for r in range(1, self.tp)]
        for proc in self.followers:
            proc.start()
        join_process_group(init, 0, self.tp, STEP_TIMEOUT)
        self.rounds = dist.new_group(backend="gloo", timeout=ROUND_TIMEOUT)
        self.port = _rank_port(str(directory), manifest, 0)

    def round(self, released: Sequence[int], entries: Sequence[tuple[list[int], Any]]) -> None:
        """Tell the followers what this round does, before rank 0 does it."""
        dead = [proc.name for proc in self.followers if not proc.is_alive()]
        if dead:
            raise RuntimeError(f"tensor-parallel follower ranks stopped: {dead}; the server cannot go on")
        dist.broadcast_object_list([(list(released), list(entries))], src=0, group=self.rounds)

    def close(self) -> None:
        if dist.is_initialized():
            if all(proc.is_alive() for proc in self.followers):
                dist.broadcast_object_list([None], src=0, group=self.rounds)
            for proc in self.followers:
                proc.join(timeout=30)
            dist.destroy_process_group()


__all__ = ["Lockstep"]
