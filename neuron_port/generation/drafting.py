"""Drafting with a Gemma-4 drafter inside the one scheduler.

:class:`ModelDrafter` keeps, per slot, what the drafter needs of its target's latest call (the final hidden state
of the row that gave the slot's last token, the last position the call wrote and how many it fed: a
:class:`Seen`) and drafts a round for every slot that asks: ``k`` calls of the drafter graph
(:class:`~neuron_port.graph.drafter.DrafterGraph`) from the position of the slot's pending token, each feeding the
target's scaled embedding of the token before it and the drafter's projected state back, greedy as transformers'
``SinglePositionMultiTokenCandidateGenerator`` drafts. The target's store is read, never written.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from neuron_port.graph.drafter import DrafterGraph
from neuron_port.graph.kv import KVStore

if TYPE_CHECKING:
    from torch import nn

    from neuron_port.graph.port import Port

DrafterRunner = Callable[..., Sequence[torch.Tensor]]
"""``runner(inputs_embeds, position_ids, written, fed, *store) -> (logits [batch, vocab], state [batch, hidden])``."""


@dataclass
class Seen:
    """A slot's latest target call, as its drafter reads it: ``hidden`` [target hidden] of the row that gave the
    slot's last token, ``written`` the last position the call wrote, ``fed`` how many positions it fed."""

    hidden: torch.Tensor
    written: int
    fed: int


class ModelDrafter:
    """Drafts for the slots of one batch with ``runner`` (a drafter graph over the target's store);
    ``embed`` ids [batch, seq] -> the target's scaled word embeddings [batch, seq, hidden]."""

    def __init__(self, runner: DrafterRunner, embed: Callable[[torch.Tensor], torch.Tensor]):
        self.runner = runner
        self.embed = embed
        self.seen: dict[int, Seen] = {}

    def observe(self, slot: int, hidden: torch.Tensor, written: int, fed: int) -> None:
        """Record ``slot``'s latest target call (``hidden`` [hidden]: the row that gave its last token)."""
        self.seen[slot] = Seen(hidden.detach().clone(), int(written), int(fed))

    def forget(self, slot: int) -> None:
        self.seen.pop(slot, None)

    def draft(self, wanted: dict[int, int], tokens: torch.Tensor, positions: torch.Tensor, store: KVStore
              ) -> dict[int, list[int]]:
        """``wanted[slot]`` tokens drafted for each slot (its pending token ``tokens[slot]`` at ``positions[slot]``,
        not yet fed to the target), all slots in one drafter call per drafted token over the store's rows."""
        asking = {slot: k for slot, k in wanted.items() if k > 0 and slot in self.seen}
        drafts: dict[int, list[int]] = {slot: [] for slot in wanted}
        if not asking:
            return drafts
        rows = store.tensors()[0].shape[0]
        some = self.seen[next(iter(asking))].hidden
        hidden = some.new_zeros(rows, some.shape[-1])  # [rows, target hidden]: a row that drafts nothing reads zeros
        last = torch.zeros(rows, dtype=torch.long)
        position = torch.zeros(rows, 1, dtype=torch.long)
        written = torch.zeros(rows, dtype=torch.long)
        fed = torch.ones(rows, dtype=torch.long)
        for slot in asking:
            seen = self.seen[slot]
            hidden[slot], last[slot], position[slot, 0] = seen.hidden, tokens[slot], positions[slot]
            written[slot], fed[slot] = seen.written, seen.fed
        for step in range(max(asking.values())):
            word = self.embed(last[:, None])  # [rows, 1, target hidden]
            logits, hidden = self.runner(torch.cat([word, hidden[:, None].to(word.dtype)], dim=-1), position, written,
                                         fed, *store.tensors())[:2]
            last = logits.argmax(dim=-1)
            for slot, k in asking.items():
                if step < k:
                    drafts[slot].append(int(last[slot]))
        return drafts


def drafter_over_port(drafter: nn.Module, target_config: Any, port: Port) -> ModelDrafter:
    """A drafter (:func:`~neuron_port.model.drafter.load_drafter`) drafting over ``port``'s store: its graph in the
    port's dtype reading the port's largest store, fed the port's host word embeddings. ``target_config``: the
    target's text config; ``port`` must return its hidden states (``returns_hidden=True``)."""
    graph = DrafterGraph.over(drafter, target_config, port.stores.largest, dtype=port.inputs.dtype)
    return ModelDrafter(graph, lambda ids: port.inputs.embeddings.embed(ids)[0])


__all__ = ["ModelDrafter", "Seen", "DrafterRunner", "drafter_over_port"]
