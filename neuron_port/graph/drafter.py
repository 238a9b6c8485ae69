"""One drafting step of a Gemma-4 drafter, reading its target's KV store in place.

:class:`DrafterGraph` runs transformers' own drafter (``Gemma4AssistantForCausalLM``: its ``pre_projection``, text
model, ``post_projection`` and head, or its centroid head) with two substitutions: the K/V each drafter layer
attends are the target store's buffers of that attention type's producer (no copy, no KV of its own; the
``shared_kv_states`` transformers' assisted generation hands it), and the masks are built in the graph from three
integers per row (:func:`~neuron_port.graph.masks.drafter_masks`: the positions transformers' assisted generation
lets it read). The store goes in and is not written.

Inputs: ``inputs_embeds [batch, 1, 2 * target hidden]`` (the target's scaled embedding of the last seen token,
then the target's final hidden state or the drafter's own projected state), ``position_ids [batch, 1]`` (the
position of the last seen token: every step of a round drafts from it), ``written [batch]`` and ``fed [batch]``
(the target's latest call: its last written position and how many it fed), then the store flat. Outputs:
``(logits [batch, vocab], state [batch, target hidden])``.
"""

from __future__ import annotations

import copy
from typing import Any

import torch
from torch import nn

from neuron_port.families import family_for
from neuron_port.families.gemma4_drafter import drafter_parts, producer_layers
from neuron_port.graph import attention, masks
from neuron_port.graph.kv import KVStoreSpec


class DrafterGraph(nn.Module):
    """A drafter over the store ``spec`` of its target (whose text config is ``target_config``); the drafter is the
    graph's own (it is switched to the library's attention function): :meth:`over` copies one."""

    def __init__(self, drafter: nn.Module, target_config: Any, spec: KVStoreSpec):
        super().__init__()
        family_for(target_config.model_type).use_attention(drafter, attention.register())
        self.drafter = drafter
        self.parts = drafter_parts(drafter)
        self.spec = spec
        owner = {slot.layer: j for j, slot in enumerate(spec.slots)}
        self.reads = {kind: owner[layer] for kind, layer in producer_layers(target_config).items()}

    @classmethod
    def over(cls, drafter: nn.Module, target_config: Any, spec: KVStoreSpec, *, owned: bool = False,
             dtype: torch.dtype | None = None) -> DrafterGraph:
        """A drafter graph over a copy of ``drafter`` (``owned``: one made for this graph alone, used as it is), its
        weights cast to ``dtype`` (the target port's: what its embeddings, hidden states and store are in)."""
        mine = drafter if owned else copy.deepcopy(drafter)
        return cls(mine if dtype is None else mine.to(dtype), target_config, spec)

    def forward(self, inputs_embeds: torch.Tensor, position_ids: torch.Tensor, written: torch.Tensor,
                fed: torch.Tensor, *kv: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        spec, n = self.spec, len(self.spec.slots)
        if len(kv) != 2 * n:
            raise ValueError(f"a drafter step reads the target's {2 * n} store tensors, found {len(kv)}")
        full, sliding = masks.drafter_masks(position_ids[:, 0], written, fed, spec.kv_len, spec.window, spec.ring,
                                            inputs_embeds.dtype)
        shared = {kind: (kv[j], kv[n + j]) for kind, j in self.reads.items()}
        parts = self.parts
        out = parts.text_model(inputs_embeds=parts.pre_projection(inputs_embeds),
                               attention_mask={"full_attention": full, "sliding_attention": sliding},
                               position_ids=position_ids, shared_kv_states=shared, use_cache=False)
        hidden = out.last_hidden_state  # [batch, 1, drafter hidden]
        state = parts.post_projection(hidden)[:, 0]
        if parts.centroid_head is not None:
            return centroid_logits(parts.centroid_head, parts.head_weight, hidden[:, 0]), state
        return hidden[:, 0] @ parts.head_weight.t(), state

def centroid_logits(head: nn.Module, weight: torch.Tensor, hidden: torch.Tensor) -> torch.Tensor:
    """The ordered-embedding head (``use_ordered_embeddings``): hidden [batch, hidden] -> logits [batch, vocab] where
    the tokens of the ``centroid_intermediate_top_k`` best clusters get their dot product with ``weight`` [vocab,
    hidden] and every other token one less than the row's lowest of those. transformers' ``Gemma4AssistantMaskedEmbedder``
    floors at the whole batch's lowest (with a host sync, ``.item()``); per row, a row's logits do not depend on the
    rows beside it, and a batch of one is the same."""
    top = torch.topk(head.centroids(hidden), k=head.centroid_intermediate_top_k, dim=-1).indices  # [batch, top_k]
    members = head.token_ordering.long().view(head.num_centroids, head.vocab_size_per_centroid)[top].flatten(1)
    scored = torch.einsum("bh,bth->bt", hidden, weight[members])  # [batch, top_k * per cluster]
    floor = scored.min(dim=-1, keepdim=True).values - 1.0
    logits = floor.expand(-1, head.vocab_size).clone()
    return logits.scatter(-1, members, scored)


__all__ = ["DrafterGraph", "centroid_logits"]
