"""A prefill's by-position K/V write as the device should see it: one dynamic-update-slice.

A prefill of ``steps`` positions writes the first ``steps`` slots of every full-attention buffer
(:func:`neuron_port.graph.kv.prefill_write`). torch-xla 2.8 lowers every torch way of saying so
(``slice_scatter``, an in-place slice assignment) as a pad of the update and a select over the whole
buffer, so the buffer is read and written whole; ``index_copy`` lowers to a scatter. NxD Inference
writes the same slice as an HLO ``dynamic-update-slice``, emitted through torch-neuronx's own HLO call.
:func:`leading_update` does the same through torch-xla's op builder (``torch_xla.core.xla_builder``, an
HLO computation called on the device tensors, which XLA inlines), so the lowered prefill touches only
the slots it writes. On any other device it is ``slice_scatter`` (the CPU and TorchScript paths, the
stand-in SDK). torch-xla is imported only when a tensor is on an XLA device.

Where it is used: the XLA backend (checked here: the same tokens, one dynamic-update-slice per full
buffer in the optimized HLO, fewer bytes moved). The nxd and neuron artifacts take it only when asked
(``write_nxd_rank(prefill_update=True)``): the HLO ``call`` it adds has not been through torch-neuronx's
capture and neuronx-cc on an Inferentia2 host, and every nxd artifact's prefill would depend on it.
"""

from __future__ import annotations

import torch


def leading_update(buf: torch.Tensor, head: torch.Tensor) -> torch.Tensor:
    """``buf`` with ``head`` written over its leading corner along dim 2.

    buf: [batch, heads, slots, head_dim]; head: [batch, heads, steps, head_dim], ``steps <= slots``.
    Returns a new tensor: slots ``0..steps-1`` are ``head``'s, the rest ``buf``'s."""
    steps = head.shape[2]
    if head.shape[:2] != buf.shape[:2] or head.shape[3] != buf.shape[3] or steps > buf.shape[2]:
        raise ValueError(f"a leading update of {tuple(head.shape)} does not fit a buffer of {tuple(buf.shape)}")
    if buf.device.type != "xla":
        return buf.slice_scatter(head, dim=2, start=0, end=steps)
    import torch_xla.core.xla_builder as xb

    def at_origin(target, update):
        zero = xb.Op.scalar(target.builder(), 0, dtype=xb.Type.S32)
        return target.dynamic_update_slice(update, [zero] * buf.dim())

    head = head.to(buf.dtype)
    computation = xb.create_computation("neuron_port_leading_update", at_origin, xb.tensor_shape((buf, head)))
    return xb.xla_computation_as_func(computation, "neuron_port::leading_update")([buf, head])[0]


__all__ = ["leading_update"]
