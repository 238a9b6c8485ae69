"""Static KV store for KV-owner layers only, with one-hot writes and ring buffers.

Only layers that own K/V allocate a buffer; KV-shared layers read their source layer's
buffer. Full-attention owners hold ``kv_len`` slots; sliding owners hold a ring of
``window`` slots (position ``p`` lives in slot ``p % window``). Every write is static-shaped, so
the same code traces into one device graph. A prefill writes its prompt's rows by position
(:func:`prefill_write`: a slice of the first slots, or a gather into a ring). A decode write takes
the one-hot map of the slot each row writes (built in the graph from the positions,
:mod:`neuron_port.graph.masks`): a select over the whole store (:func:`onehot_write`), or, where the
backend keeps the store aliased on the device, a scatter of the new rows at the slot the map
selects (:func:`row_write`), or an in-place scatter on a backend that allows one
(:func:`scatter_write_`). :func:`onehot_write` with a prefill's map is the reference the prefill
write is tested against.
Buffers are ``[batch, n_kv, slots, head_dim]``; one K and one V buffer per owner layer.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import Enum

import torch

from neuron_port.model.layout import Layout


@dataclass(frozen=True)
class KVSlotSpec:
    """The K (and V) buffer of one owner layer: ``[batch, n_kv, slots, head_dim]``."""

    layer: int
    attention: str  # "sliding" | "full"
    n_kv: int
    head_dim: int
    slots: int
    ring: bool

    def shape(self, batch: int) -> tuple[int, int, int, int]:
        return (batch, self.n_kv, self.slots, self.head_dim)

    def bytes(self, batch: int, dtype_bytes: int) -> int:
        """K plus V bytes of this layer."""
        return 2 * batch * self.n_kv * self.slots * self.head_dim * dtype_bytes


@dataclass(frozen=True)
class KVStoreSpec:
    """Shapes of the whole store. ``slots`` are in owner order (``layout.kv_owners``)."""

    kv_len: int
    window: int | None
    slots: tuple[KVSlotSpec, ...]

    @property
    def owners(self) -> tuple[int, ...]:
        return tuple(s.layer for s in self.slots)

    @property
    def ring(self) -> int | None:
        """Slots of the sliding owners' rings (the window, more for verify steps: :func:`kv_store_spec`), or None
        when the store has no ring."""
        return next((s.slots for s in self.slots if s.ring), None)

    def bytes_per_layer(self, batch: int = 1, dtype_bytes: int = 2) -> dict[int, int]:
        return {s.layer: s.bytes(batch, dtype_bytes) for s in self.slots}

    def total_bytes(self, batch: int = 1, dtype_bytes: int = 2) -> int:
        return sum(self.bytes_per_layer(batch, dtype_bytes).values())

    def attended_bytes(self, context: int, batch: int = 1, dtype_bytes: int = 2,
                       readers: dict[int, int] | None = None) -> int:
        """K plus V bytes a decode step at ``context`` positions must read: every full owner's
        ``min(context, slots)`` positions, every sliding owner's last ``min(context, window)``, once
        per layer that attends it (``readers``: owner layer -> layers attending it, from
        :meth:`~neuron_port.model.layout.Layout.kv_readers`; default once each)."""
        total = 0
        for s in self.slots:
            held = min(context, s.slots)
            if s.attention == "sliding" and self.window is not None:
                held = min(held, self.window)
            total += 2 * batch * s.n_kv * held * s.head_dim * dtype_bytes * (readers or {}).get(s.layer, 1)
        return total

    def row_bytes(self, batch: int = 1, dtype_bytes: int = 2) -> int:
        """K plus V bytes of one new position in every owner (what a decode step must write)."""
        return sum(2 * batch * s.n_kv * s.head_dim * dtype_bytes for s in self.slots)

    def allocate(self, batch: int, dtype: torch.dtype = torch.float32) -> list[torch.Tensor]:
        """Zeroed buffers in graph order: K of every owner, then V of every owner."""
        ks = [torch.zeros(s.shape(batch), dtype=dtype) for s in self.slots]
        vs = [torch.zeros(s.shape(batch), dtype=dtype) for s in self.slots]
        return ks + vs


@dataclass(frozen=True)
class KVStore:
    """The KV tensors of one store, typed: ``keys[j]`` and ``values[j]`` belong to ``spec.slots[j]``.

    Each tensor is ``[batch, n_kv, slots, head_dim]``. The graphs take and return the store flat
    (every K, then every V): :meth:`tensors` and :meth:`from_tensors` are the only places that
    know that order.
    """

    spec: KVStoreSpec
    keys: tuple[torch.Tensor, ...]
    values: tuple[torch.Tensor, ...]

    @classmethod
    def zeros(cls, spec: KVStoreSpec, batch: int, dtype: torch.dtype = torch.float32) -> KVStore:
        return cls.from_tensors(spec, spec.allocate(batch, dtype))

    @classmethod
    def from_tensors(cls, spec: KVStoreSpec, tensors: Sequence[torch.Tensor]) -> KVStore:
        """A store from its flat form (every K, then every V)."""
        n = len(spec.slots)
        if len(tensors) != 2 * n:
            raise ValueError(f"a store of {n} owner layers has {2 * n} tensors, found {len(tensors)}")
        return cls(spec, tuple(tensors[:n]), tuple(tensors[n:]))

    def tensors(self) -> list[torch.Tensor]:
        """The flat form the graphs take and return: K of every owner, then V of every owner."""
        return [*self.keys, *self.values]

    def __iter__(self):
        """Iterates the flat form (so ``graph(*inputs, *store)`` reads as the call it is)."""
        return iter(self.tensors())

    def prefix(self, spec: KVStoreSpec, rows: int | None = None) -> KVStore:
        """This store seen at a shorter KV length: views of each buffer's first ``spec`` slots, no copy
        (and of its first ``rows`` rows only, when given: a decode step over the occupied rows).

        Valid because every position a store at ``spec.kv_len`` can hold sits in the same slot in
        this one: a full owner holds position ``p`` at slot ``p``; a sliding owner that is a ring
        here and full-length in ``spec`` (``spec.kv_len <= window``) holds ``p < window`` at
        ``p % window = p``; two rings are the same ring. A decode graph at ``spec.kv_len`` run on
        the views reads and writes this store's rows (write its answer back with
        :meth:`write_prefix`), so decode buckets by length share one store.
        """
        widths = prefix_slots(self.spec, spec)
        held = self.keys[0].shape[0] if self.keys else 0
        if rows is not None and not 1 <= rows <= held:
            raise ValueError(f"a view of 1..{held} rows of this store, found {rows}")
        return KVStore.from_tensors(spec, [t[:rows, :, :n] for t, n in zip(self.tensors(), widths * 2, strict=True)])

    def write_prefix(self, answer: KVStore) -> None:
        """Copy a step's answer on :meth:`prefix` views (its rows and slots) back into this store (nothing
        to copy for a tensor the step wrote in place)."""
        for tensor, new in zip(self.tensors(), answer.tensors(), strict=True):
            view = tensor[: new.shape[0], :, : new.shape[2]]
            if new.data_ptr() != view.data_ptr() or new.stride() != view.stride():
                view.copy_(new)

    def to(self, device: torch.device | str) -> KVStore:
        return KVStore(self.spec, tuple(k.to(device) for k in self.keys), tuple(v.to(device) for v in self.values))


def prefix_slots(store: KVStoreSpec, spec: KVStoreSpec) -> list[int]:
    """How many leading slots of each owner's buffer in ``store`` make ``spec``'s store, in owner order;
    a clear error where ``spec`` is not a prefix of ``store`` (see :meth:`KVStore.prefix`: every position a
    store at ``spec.kv_len`` can hold must sit in the same slot in ``store``)."""
    if spec.owners != store.owners:
        raise ValueError(f"a prefix has this store's owners {store.owners}, found {spec.owners}")
    widths = []
    for mine, theirs in zip(store.slots, spec.slots, strict=True):
        if theirs.slots > mine.slots or (theirs.ring and (not mine.ring or theirs.slots != mine.slots)):
            raise ValueError(f"layer {mine.layer}: {theirs.slots} slots ({'ring' if theirs.ring else 'full length'}) "
                             f"are not a prefix of {mine.slots} ({'ring' if mine.ring else 'full length'})")
        widths.append(theirs.slots)
    return widths


def kv_store_spec(
    layout: Layout,
    kv_len: int,
    ring_buffers: bool = True,
    kv_heads: dict[int, int] | None = None,
    draft_tokens: int = 0,
) -> KVStoreSpec:
    """The store of a layout for a KV length.

    ``ring_buffers=False`` gives sliding owners the full ``kv_len`` (the field report's
    design); ``kv_heads`` overrides the KV-head count per layer (a tensor-parallel rank's
    local count); ``draft_tokens``: the most drafted tokens a verify step checks, whose rings hold that
    many slots more than the window (:func:`~neuron_port.graph.masks.verify_ring`).
    """
    window = layout.sliding_window
    ring_slots = window + draft_tokens if window is not None else None
    slots = []
    for spec in layout.owner_specs():
        ring = ring_buffers and spec.attention == "sliding" and ring_slots < kv_len
        n_kv = kv_heads[spec.index] if kv_heads is not None else spec.n_kv
        slots.append(
            KVSlotSpec(
                layer=spec.index,
                attention=spec.attention,
                n_kv=n_kv,
                head_dim=spec.head_dim,
                slots=ring_slots if ring else kv_len,
                ring=ring,
            )
        )
    return KVStoreSpec(kv_len=kv_len, window=window, slots=tuple(slots))


def naive_kv_bytes(layout: Layout, kv_len: int, batch: int = 1, dtype_bytes: int = 2) -> int:
    """Bytes if every layer (shared ones too) kept its own full-length K and V."""
    return sum(2 * batch * s.n_kv * kv_len * s.head_dim * dtype_bytes for s in layout.layers)


def onehot_write(buf: torch.Tensor, new: torch.Tensor, onehot: torch.Tensor) -> torch.Tensor:
    """Write ``new`` into ``buf`` at the slots ``onehot`` selects.

    buf:    [batch, heads, slots, head_dim]
    new:    [batch, heads, steps, head_dim]
    onehot: [batch, steps, slots] with at most one 1 per slot (a step may select no slot)
    returns [batch, heads, slots, head_dim]
    """
    if new.shape[2] == 1:
        # Decode: one select over the buffer (read once, written once) instead of a blend.
        hit = onehot[:, 0, :][:, None, :, None] > 0  # [batch, 1, slots, 1]
        return torch.where(hit, new.to(buf.dtype), buf)
    onehot = onehot.to(buf.dtype)
    hit = onehot.sum(dim=1)[:, None, :, None]  # [batch, 1, slots, 1]
    written = torch.einsum("bts,bhtd->bhsd", onehot, new.to(buf.dtype))
    return buf * (1 - hit) + written


def prefill_write(buf: torch.Tensor, new: torch.Tensor, positions: torch.Tensor, lengths: torch.Tensor,
                  ring: int | None, leading_update: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None
                  ) -> torch.Tensor:
    """Prefill write of the prompt rows only, equal to :func:`onehot_write` with
    :func:`~neuron_port.graph.masks.prefill_writes`' map.

    buf: [batch, heads, slots, head_dim]; new: [batch, heads, steps, head_dim], a prompt right-padded
    to ``steps`` positions; positions: [batch, steps], each row ``0..steps-1`` (the graph's input, so
    a traced graph holds no per-bucket constant); lengths: [batch] real lengths (0 writes nothing). A buffer
    where slot ``p`` holds position ``p`` (``ring`` None, ``slots >= steps``) takes the real steps in
    its first ``steps`` slots, one static slice update (``leading_update(buf, head)``: ``slice_scatter``
    unless the backend gives its own; torch-xla lowers ``slice_scatter`` as a select over the buffer, and
    the XLA and nxd backends pass :func:`neuron_port.backends.leading_update.leading_update`, one
    dynamic-update-slice, as NxD Inference's ``fill_prefix`` writes it); a
    ring of ``ring`` slots takes, in slot ``s``, the last real step ``t`` with ``t % ring == s``, one
    gather along the steps. Every other slot keeps what it held. No ``[steps, slots]`` map is built
    or read, and no matmul over the store is made.
    """
    b, h, slots, d = buf.shape
    steps = new.shape[2]
    new = new.to(buf.dtype)
    if ring is None:
        if steps > slots:
            raise ValueError(f"a prefill of {steps} steps does not fit a buffer of {slots} slots")
        real = positions < lengths[:, None]  # [batch, steps]
        head = torch.where(real[:, None, :, None], new, buf[:, :, :steps])
        if leading_update is not None:
            return leading_update(buf, head)
        return buf.slice_scatter(head, dim=2, start=0, end=steps)
    if ring != slots:
        raise ValueError(f"a ring of {ring} slots does not match a buffer of {slots} slots")
    slot = torch.arange(ring, device=lengths.device)[None, :]  # [1, ring]
    last = lengths[:, None] - 1  # [batch, 1]
    step = slot + ring * torch.div(last - slot, ring, rounding_mode="floor")  # [batch, ring]: last t <= last, t % ring == s
    held = (last >= slot)[:, None, :, None]  # a slot no real step reaches keeps its value
    index = step.clamp(0, steps - 1)[:, None, :, None].expand(b, h, ring, d)
    return torch.where(held, new.gather(2, index), buf)


def row_write(buf: torch.Tensor, new: torch.Tensor, onehot: torch.Tensor) -> torch.Tensor:
    """Decode (and verify) write of the new rows only: ``buf`` with ``new[b, :, s]`` at row ``b``'s slot of step ``s``.

    buf: [batch, heads, slots, head_dim]; new: [batch, heads, steps, head_dim]; onehot: [batch, steps, slots]
    with at most one 1 per step, no slot chosen by two steps. Returns a new tensor equal to :func:`onehot_write`'s:
    a step that selects no slot writes back what its row's slot 0 holds. Each step's slot is found on the device
    (argmax of its map) and written by ``scatter`` along the sequence, one step after another, the decode write
    NxD Inference uses (its ``kv_cache_manager``); a backend that aliases the store updates those rows where they
    lie, so a step moves its new rows instead of reading and rewriting the whole store.
    """
    b, h, _, d = buf.shape
    for step in range(new.shape[2]):
        picked = onehot[:, step, :]  # [batch, slots]
        index = picked.argmax(dim=-1).view(b, 1, 1, 1).expand(b, h, 1, d)
        hit = (picked.amax(dim=-1) > 0).view(b, 1, 1, 1)
        row = torch.where(hit, new[:, :, step: step + 1].to(buf.dtype), buf.gather(2, index))  # [batch, heads, 1, d]
        buf = buf.scatter(2, index, row)
    return buf


def scatter_write_(buf: torch.Tensor, new: torch.Tensor, onehot: torch.Tensor) -> torch.Tensor:
    """Decode (and verify) write done in place: ``buf[b, :, slot] = new[b, :, s]`` at each step's slot.

    buf: [batch, heads, slots, head_dim]; new: [batch, heads, steps, head_dim]; onehot: [batch, steps, slots].
    A decode step (one step) always writes its position: exactly one 1 per row. A verify step's steps may select
    no slot (past the store), and write back what the row's slot 0 holds, one step after another. Returns ``buf``
    itself. Only for backends that allow data-dependent in-place writes (the CPU backend): the buffer is not copied
    every step. Neuron graphs use :func:`row_write` (out of place, the store aliased by the graph; ``neuron-port
    lint`` flags any other scatter).
    """
    b, h, _, d = buf.shape
    if new.shape[2] == 1:
        slot = onehot[:, 0, :].argmax(dim=-1)  # [batch]
        return buf.scatter_(2, slot.view(b, 1, 1, 1).expand(b, h, 1, d), new.to(buf.dtype))
    for step in range(new.shape[2]):
        picked = onehot[:, step, :]
        index = picked.argmax(dim=-1).view(b, 1, 1, 1).expand(b, h, 1, d)
        hit = (picked.amax(dim=-1) > 0).view(b, 1, 1, 1)
        buf.scatter_(2, index, torch.where(hit, new[:, :, step: step + 1].to(buf.dtype), buf.gather(2, index)))
    return buf


class KVWrite(str, Enum):
    """How a backend's decode graphs write each step's new K/V row into the store: one value, declared
    by the backend (``backend.kv_write``) and recorded in an artifact's manifest.

    ``BLEND``: a one-hot select over every buffer, returned (:func:`onehot_write`; eager graphs, the
    reference). ``IN_PLACE``: a scatter into the buffers the graph is handed (:func:`scatter_write_`;
    CPU TorchScript, which allows data-dependent in-place writes). ``ROWS``: a scatter of the new rows,
    returned (:func:`row_write`): a device that aliases the store updates those rows where they lie
    (xla, nxd, neuron); the one kind that can write into a store larger than the step reads."""

    BLEND = "blend"
    IN_PLACE = "in_place"
    ROWS = "rows"

    @property
    def write(self) -> Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]:
        """``(buf [batch, heads, slots, head_dim], new [batch, heads, 1, head_dim], onehot [batch, 1, slots])
        -> buf with the new rows``."""
        return {KVWrite.BLEND: onehot_write, KVWrite.IN_PLACE: scatter_write_, KVWrite.ROWS: row_write}[self]


__all__ = ["KVSlotSpec", "KVStoreSpec", "KVStore", "KVWrite", "prefix_slots", "kv_store_spec", "naive_kv_bytes",
           "onehot_write", "prefill_write", "row_write", "scatter_write_"]
