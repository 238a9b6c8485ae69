"""Static-shape prefill and decode graphs over the Hugging Face text forward itself.

The graphs call the real ``transformers`` decoder stack of any supported family (so KV sharing,
per-layer inputs, per-type RoPE and head sizes come for free) with three substitutions:

* a static KV store (owners only; sliding owners as rings) passed in and returned as
  explicit tensors, written through Hugging Face's ``cache.update`` hook: a prefill writes its
  prompt's rows by position (:func:`~neuron_port.graph.kv.prefill_write`), a decode step its new
  row by a one-hot map (a select, a scatter of the row, or an in-place scatter, as the backend
  asks);
* masks per attention type built in the graph from the position ids (and, in decode, each row's
  length; :func:`~neuron_port.graph.masks.step_maps`; the family adapter says in what form its text
  model takes them), with decode's one-hot write maps and the last-token pick;
* no embedding tables and no softcap: embeddings come in as activations and the graph ends
  at raw logits of the LM head for each row's last real token.

Inputs: the fields of :class:`~neuron_port.graph.step.StepInputs` in order, then (a decode graph keyed by
its length, :attr:`StaticLMGraph.slot_input`) ``slot_ids [kv_len]``, then the store flat (K of every
owner, then V of every owner, each ``[batch, n_kv, slots, head_dim]``). Outputs:
``(logits [batch, vocab], *store)``; :attr:`StaticLMGraph.aliases` maps each KV input to its
output. :func:`build_graphs` builds one rank's set: a prefill graph per prompt bucket and a
decode graph per KV length.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from neuron_port.families import family_of
from neuron_port.graph import attention, masks
from neuron_port.graph.kv import KVStoreSpec, KVWrite, prefill_write, prefix_slots
from neuron_port.graph.shapes import StoreShapes
from neuron_port.graph.step import kv_aliases
from neuron_port.model.quant import Int8Linear


class OneHotCache:
    """Hugging Face cache protocol over the static store (built fresh inside each forward).

    ``update`` writes a layer's new K/V into its buffer. In prefill the prompt's rows go by
    position (``positions``, ``lengths``: the step's position ids and each row's real length;
    :func:`~neuron_port.graph.kv.prefill_write`) and
    it returns the fresh prompt K/V (the prompt attends itself; a ring could not hold a prompt
    longer than the window); in decode the new row goes where the one-hot ``writes`` map of its
    layer's kind points, and it returns the updated buffers (with ``read_slots``, each owner's first
    ``read_slots[j]`` slots of them: a decode graph on a prefix of a larger store; with ``read_rows``, the
    step's rows are the buffers' first ``read_rows``: written there, the rest of each buffer kept).
    """

    def __init__(self, spec: KVStoreSpec, kv: tuple[torch.Tensor, ...], writes: dict[str, torch.Tensor] | None,
                 prefill: bool, kv_write: KVWrite = KVWrite.BLEND, positions: torch.Tensor | None = None,
                 lengths: torch.Tensor | None = None, read_slots: list[int] | None = None,
                 leading_update: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None,
                 read_rows: int | None = None):
        n = len(spec.slots)
        # decode on a prefix of a larger store: each owner's new row goes into the whole buffer (a
        # row write), attention reads its first read_slots[j] slots; None: the buffers are the store read
        self.read_slots = read_slots
        self.read_rows = read_rows  # a decode step over the first rows of a store with more (None: all of them)
        self.leading_update = leading_update  # a prefill's by-position write (None: slice_scatter)
        self.index = {slot.layer: j for j, slot in enumerate(spec.slots)}
        self.kinds = {slot.layer: slot.attention for slot in spec.slots}
        self.rings = {slot.layer: slot.slots if slot.ring else None for slot in spec.slots}
        self.keys = list(kv[:n])
        self.values = list(kv[n:])
        self.writes = writes
        self.prefill = prefill
        if prefill and (positions is None or lengths is None):
            raise ValueError("a prefill cache writes its rows by position: pass the position ids and each row's length")
        self.positions = positions
        self.lengths = lengths
        self.kv_write = kv_write  # decode's write (a prefill writes by position whatever the backend asks)
        self.is_compileable = False

    def update(self, key_states, value_states, layer_idx, *args, **kwargs):
        j = self.index[layer_idx]
        if self.prefill:
            ring = self.rings[layer_idx]
            self.keys[j] = prefill_write(self.keys[j], key_states, self.positions, self.lengths, ring, self.leading_update)
            self.values[j] = prefill_write(self.values[j], value_states, self.positions, self.lengths, ring,
                                           self.leading_update)
            return key_states, value_states
        write = self.writes[self.kinds[layer_idx]]
        store = self.kv_write.write
        keys, values = self.keys[j], self.values[j]
        if self.read_rows is None:
            keys, values = store(keys, key_states, write), store(values, value_states, write)
            self.keys[j], self.values[j] = keys, values
        else:  # the step's rows, written into the whole buffer (one dynamic-update-slice on a device)
            r = self.read_rows
            keys, values = store(keys[:r], key_states, write), store(values[:r], value_states, write)
            self.keys[j] = self.keys[j].slice_scatter(keys, dim=0, start=0, end=r)
            self.values[j] = self.values[j].slice_scatter(values, dim=0, start=0, end=r)
        if self.read_slots is None:
            return keys, values
        width = self.read_slots[j]
        return keys[:, :, :width], values[:, :, :width]

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return 0

    def outputs(self) -> list[torch.Tensor]:
        return self.keys + self.values


class StaticLMGraph(nn.Module):
    """One static graph (prefill or decode) over a Hugging Face CausalLM.

    The wrapped model is switched to the ``neuron_port_eager`` attention function; give the
    graph its own model instance (the CPU reference keeps Hugging Face's eager path).
    ``kv_expand``: layer index -> ``[local_q, local_kv]`` one-hot gather for the layers where a
    tensor-parallel rank's query heads straddle KV groups (from its shard plan); kept as buffers
    of the graph and handed to the attention function explicitly on every call.
    """

    def __init__(self, model: nn.Module, spec: KVStoreSpec, prefill: bool, seq: int,
                 kv_expand: Mapping[int, torch.Tensor] | None = None, store: KVStoreSpec | None = None,
                 rows: int | None = None):
        super().__init__()
        # A decode step over the first ``rows`` rows of a store with more (one device-resident store shared
        # with the full-batch graphs: decode by occupancy); None: the rows it is handed.
        self.rows = rows
        if rows is not None and (prefill or store is None):
            raise ValueError("a graph over some rows of a store is a decode graph handed that whole store (store=)")
        # The store the graph is handed and returns: ``spec``'s own, or (decode) a larger one of which
        # ``spec``'s is a prefix (decode by length over one device-resident store; see :class:`DecodeGraph`).
        self.store = spec if store is None else store
        self.read_slots = None if store is None or store is spec else prefix_slots(store, spec)
        if self.read_slots is not None and prefill:
            raise ValueError("a prefill writes into the store it is handed: build it over that store's spec")
        # A prefill's write of its prompt rows into a by-position buffer (None: slice_scatter): set by backends
        # whose lowering should see one dynamic-update-slice (backends.leading_update).
        self.leading_update: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None
        # Decode graphs keyed by their KV length take ``slot_ids [kv_len]`` after the step inputs (the
        # position each full slot holds): set by backends whose executor routes a call by its input shapes.
        self.slot_input = False
        # Also return the final-norm hidden state of what the logits are taken from (after the logits: a drafter
        # reads it; :func:`~neuron_port.graph.step.run_step_hidden`).
        self.returns_hidden = False
        self.family = family_of(model)
        self.family.use_attention(model, attention.register())
        for module in model.modules():
            if getattr(module, "loss_type", "") is None:
                # what transformers' loss_function falls back to (after logging that loss_type is unset)
                # when anything reads it, as TorchScript's module walker does; the graphs compute no loss
                module.loss_type = "ForCausalLM"
        self.model = model
        self.spec = spec
        self.prefill = prefill
        self.seq = seq
        self.has_ple = self.family.per_layer_input_size(self.family.text_config_of(model)) > 0
        # How decode writes its new K/V rows: the backend's kind, set when it compiles the graph
        # (a prefill writes by position whatever the backend asks).
        self.kv_write = KVWrite.BLEND
        layers = self.family.decoder_layers(model)
        self._expanded: list[tuple[nn.Module, str]] = []
        self._kv_expand = dict(kv_expand or {})  # what a sibling over other rows is built with
        for index, matrix in sorted((kv_expand or {}).items()):
            name = f"kv_expand_{index}"
            self.register_buffer(name, matrix.detach().clone(), persistent=False)
            self._expanded.append((self.family.attention(layers[index]), name))

    @property
    def kind(self) -> str:
        """``prefill``, ``decode`` or ``verify``: what a backend names the graph by."""
        return "prefill" if self.prefill else "decode"

    @property
    def aliases(self) -> dict[int, int]:
        """Input index -> output index of every KV tensor (for a device-resident store)."""
        aliases = kv_aliases(2 * len(self.store.slots))
        shift_in, shift_out = int(self.slot_input), int(self.returns_hidden)
        return {i + shift_in: o + shift_out for i, o in aliases.items()}

    def _attention_kwargs(self) -> dict[str, dict[nn.Module, torch.Tensor]]:
        if not self._expanded:
            return {}
        return {attention.KV_EXPAND: {module: getattr(self, name) for module, name in self._expanded}}

    def forward(
        self,
        inputs_embeds: torch.Tensor,
        per_layer: torch.Tensor,
        position_ids: torch.Tensor,
        lengths: torch.Tensor,
        *kv: torch.Tensor,
    ) -> tuple[torch.Tensor, ...]:
        slot_ids, kv = (kv[0], kv[1:]) if self.slot_input else (None, kv)
        if self.read_slots is not None and self.kv_write is not KVWrite.ROWS:
            raise ValueError(f"decode on a prefix of a larger store writes its new rows by scatter: expected kv_write "
                             f"{KVWrite.ROWS.value!r}, found {self.kv_write.value!r}")
        mask, writes, pick = self._maps(position_ids, lengths, inputs_embeds.dtype, slot_ids)
        if self.rows is not None and inputs_embeds.shape[0] != self.rows:
            raise ValueError(f"a decode graph over {self.rows} rows of its store, found {inputs_embeds.shape[0]} rows")
        cache = OneHotCache(self.store, kv, writes, self.prefill, self.kv_write, position_ids, lengths, self.read_slots,
                            self.leading_update, self.rows)
        extra = self.family.text_model_extra_inputs(per_layer) if self.has_ple else {}
        out = self.family.text_model(self.model)(
            inputs_embeds=inputs_embeds,
            attention_mask=self.family.attention_mask_argument(mask),
            position_ids=position_ids,
            cache=cache,
            use_cache=True,
            **extra,
            **self._attention_kwargs(),
        )
        picked = self._pick(out.last_hidden_state, pick)  # [batch, hidden] ([batch, tokens, hidden] in a verify step)
        logits = head_logits(self.family, self.model, picked)
        return (logits, picked, *cache.outputs()) if self.returns_hidden else (logits, *cache.outputs())

    def _maps(self, position_ids: torch.Tensor, lengths: torch.Tensor, dtype: torch.dtype,
              slot_ids: torch.Tensor | None) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor] | None, torch.Tensor]:
        """(masks by attention kind, decode's write maps by kind or None in prefill, the last-token pick [batch, seq])."""
        spec = self.spec
        maps = masks.step_maps(position_ids, lengths, self.prefill, spec.kv_len, spec.window, spec.ring, dtype, slot_ids)
        writes = None if self.prefill else {"full": maps.write_full, "sliding": maps.write_sliding}
        return {"full": maps.mask_full, "sliding": maps.mask_sliding}, writes, maps.last_onehot

    def _pick(self, hidden: torch.Tensor, pick: torch.Tensor) -> torch.Tensor:
        """hidden [batch, seq, hidden] -> [batch, hidden] of each row's last token (its logits' hidden state)."""
        return torch.einsum("bs,bsh->bh", pick.to(hidden.dtype), hidden)


def head_logits(family: Any, model: nn.Module, hidden: torch.Tensor) -> torch.Tensor:
    """hidden [..., hidden] -> raw logits [..., vocab]: ``hidden @ family.lm_head_weight(model).T``, or an
    int8 head's own matmul (``--quant-head``: the weight cast to hidden's dtype, the output scaled in fp32)."""
    head = family.head_module(model)
    if isinstance(head, Int8Linear):
        return head(hidden)
    return hidden @ family.lm_head_weight(model).t()


class PrefillGraph(StaticLMGraph):
    """Prefill over a right-padded prompt bucket of ``bucket`` tokens."""

    def __init__(self, model: nn.Module, spec: KVStoreSpec, bucket: int, kv_expand: Mapping[int, torch.Tensor] | None = None):
        super().__init__(model, spec, prefill=True, seq=bucket, kv_expand=kv_expand)


class DecodeGraph(StaticLMGraph):
    """Decode of one token per row against the store.

    ``store``: a larger store the graph is handed instead of ``spec``'s own (one device-resident store
    shared by decode graphs of several KV lengths): it writes each new row into the whole buffer (by
    scatter: ``kv_write`` is ``KVWrite.ROWS``) and attends over the first ``spec`` slots of each owner
    (:func:`~neuron_port.graph.kv.prefix_slots`), so a short context reads a short store. ``rows``: the
    step's rows are the first ``rows`` of that store's (decode by occupancy on a resident store)."""

    def __init__(self, model: nn.Module, spec: KVStoreSpec, kv_expand: Mapping[int, torch.Tensor] | None = None,
                 store: KVStoreSpec | None = None, rows: int | None = None):
        super().__init__(model, spec, prefill=False, seq=1, kv_expand=kv_expand, store=store, rows=rows)

    def over_rows(self, rows: int) -> DecodeGraph:
        """The same step over the first ``rows`` rows of this graph's store (decode by occupancy on one store):
        same model, KV length, store, KV write and inputs."""
        graph = DecodeGraph(self.model, self.spec, self._kv_expand, store=self.store, rows=rows)
        graph.kv_write, graph.slot_input, graph.returns_hidden = self.kv_write, self.slot_input, self.returns_hidden
        return graph


class VerifyGraph(StaticLMGraph):
    """A verify step of speculative decoding: ``tokens`` new tokens per row at consecutive positions (the last
    accepted token, then the drafted ones), all written into the store before any is attended
    (:func:`~neuron_port.graph.masks.verify_maps`: the store's rings must hold ``window + tokens - 1`` slots,
    ``kv_store_spec(..., draft_tokens=tokens - 1)``). Returns raw logits ``[batch, tokens, vocab]``: row ``i`` is
    the distribution after the first ``i + 1`` of them. A drafted row that is rejected stays in the store at a
    position the next step writes again before reading it. Its rows are written as its backend's decode writes
    them (``kv_write``: a blend eagerly, a scatter of the rows where the store stays on the device)."""

    def __init__(self, model: nn.Module, spec: KVStoreSpec, tokens: int,
                 kv_expand: Mapping[int, torch.Tensor] | None = None):
        super().__init__(model, spec, prefill=False, seq=tokens, kv_expand=kv_expand)

    def _maps(self, position_ids: torch.Tensor, lengths: torch.Tensor, dtype: torch.dtype,
              slot_ids: torch.Tensor | None) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor], torch.Tensor]:
        if position_ids.shape[1] != self.seq:
            raise ValueError(f"a verify graph of {self.seq} tokens, found position ids {tuple(position_ids.shape)}")
        spec = self.spec
        m_full, m_slide, w_full, w_slide = masks.verify_maps(position_ids, spec.kv_len, spec.window, spec.ring, dtype)
        return {"full": m_full, "sliding": m_slide}, {"full": w_full, "sliding": w_slide}, position_ids

    @property
    def kind(self) -> str:
        return "verify"

    def _pick(self, hidden: torch.Tensor, pick: torch.Tensor) -> torch.Tensor:
        """hidden [batch, tokens, hidden]: every token's (raw logits [batch, tokens, vocab] come of each)."""
        return hidden


@dataclass
class GraphSet:
    """One rank's graphs: a prefill graph per prompt bucket, a decode graph per KV length, and (a port for
    speculative decoding) a verify graph per token count over the store at the largest KV length. ``one_store``:
    every graph takes and returns the one store at the largest KV length (see :func:`build_graphs`)."""

    prefill: dict[int, PrefillGraph]
    decode: dict[int, DecodeGraph]
    one_store: bool = False
    verify: dict[int, VerifyGraph] = field(default_factory=dict)


def build_graphs(model: nn.Module, stores: StoreShapes, kv_expand: Mapping[int, torch.Tensor] | None = None,
                 one_store: bool = False, returns_hidden: bool = False) -> GraphSet:
    """The graphs over ``model`` (one rank's shard, or the whole model at tp 1) for ``stores``.

    Each graph takes the store of its own KV length, or, with ``one_store``, every graph takes the store at the
    largest length: a prefill writes its prompt rows into it, a decode graph of a shorter length attends over
    its prefix (:func:`~neuron_port.graph.kv.prefix_slots`) and writes its new rows into the whole buffer (its
    backend's KV write must be ``KVWrite.ROWS``). That is the shape of a device that keeps the store aliased
    between steps (xla): no store is copied between lengths.

    A port for speculative decoding (``stores.shape.draft_tokens`` k > 0) also gets a verify graph of each of 2 to
    k + 1 tokens over the store at the largest KV length (one token is a decode step).

    ``returns_hidden``: every graph also returns the hidden state its logits come of (a port a drafter reads).

    The graphs share ``model``, which is switched to the library's attention function: pass a
    copy where the original must stay Hugging Face's reference.
    """
    graphs = _graph_set(model, stores, kv_expand, one_store)
    for graph in (*graphs.prefill.values(), *graphs.decode.values(), *graphs.verify.values()):
        graph.returns_hidden = returns_hidden
    return graphs


def _graph_set(model: nn.Module, stores: StoreShapes, kv_expand: Mapping[int, torch.Tensor] | None,
               one_store: bool) -> GraphSet:
    k = stores.shape.draft_tokens
    verify = {s: VerifyGraph(model, stores.largest, s, kv_expand) for s in range(2, k + 2)}
    if one_store:
        prefill = {b: PrefillGraph(model, stores.largest, b, kv_expand) for b in stores.buckets}
        decode = {kv: DecodeGraph(model, stores.specs[kv], kv_expand, store=stores.largest) for kv in stores.kv_lens}
        for graph in (*decode.values(), *verify.values()):
            graph.kv_write = KVWrite.ROWS  # the one write into a store larger than the step reads
        return GraphSet(prefill, decode, one_store=True, verify=verify)
    prefill = {b: PrefillGraph(model, stores.specs[stores.prefill_kv[b]], b, kv_expand) for b in stores.buckets}
    decode = {kv: DecodeGraph(model, stores.specs[kv], kv_expand) for kv in stores.kv_lens}
    return GraphSet(prefill, decode, verify=verify)


__all__ = ["OneHotCache", "StaticLMGraph", "head_logits", "PrefillGraph", "DecodeGraph", "VerifyGraph",
           "GraphSet", "build_graphs"]
