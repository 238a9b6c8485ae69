"""The typed values one graph step takes and returns.

A prefill or decode graph is called as ``graph(*inputs, *store.tensors())`` and returns
``(logits, *new_store)``. Everything outside the call site works with the named fields of
:class:`StepInputs` and with a :class:`~neuron_port.graph.kv.KVStore`; :func:`run_step` is the one
place that flattens them into that call and reads the answer back.

Shapes (``seq`` is the prompt bucket for prefill and 1 for decode)::

    inputs_embeds   [batch, seq, hidden]
    per_layer       [batch, seq, layers, per_layer]   (per_layer = 0 without per-layer inputs)
    position_ids    [batch, seq]
    lengths         [batch] (int64): the positions each row holds once the step has written
                    (prefill: the prompt's real length; decode: the new token's position + 1)

The graph builds its masks, decode's one-hot write maps and the last-token pick from
``position_ids`` and ``lengths`` on the device (:func:`neuron_port.graph.masks.step_maps`), and a
prefill writes its rows by position, so no input grows with the KV length: a step ships its
activations and two small integer tensors.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import NamedTuple

import torch

from neuron_port.graph.kv import KVStore

Runnable = Callable[..., Sequence[torch.Tensor]]


class StepInputs(NamedTuple):
    """The host-built, non-KV inputs of one graph step, in the graphs' argument order."""

    inputs_embeds: torch.Tensor
    per_layer: torch.Tensor
    position_ids: torch.Tensor
    lengths: torch.Tensor


INPUT_NAMES: tuple[str, ...] = StepInputs._fields
"""Names of the graphs' non-KV inputs, in argument order."""


def kv_aliases(n_tensors: int) -> dict[int, int]:
    """Input index -> output index of every KV tensor of a graph whose store has ``n_tensors``
    tensors: the map a device backend uses to keep the store resident between calls."""
    first = len(INPUT_NAMES)
    return {first + j: 1 + j for j in range(n_tensors)}


def run_step(runner: Runnable, inputs: StepInputs, store: KVStore) -> tuple[torch.Tensor, KVStore]:
    """Call a graph (eager or compiled) on one step: returns (logits [batch, vocab], new store)."""
    logits, _, answer = run_step_hidden(runner, inputs, store)
    return logits, answer


def run_step_hidden(runner: Runnable, inputs: StepInputs, store: KVStore
                    ) -> tuple[torch.Tensor, torch.Tensor | None, KVStore]:
    """:func:`run_step`, and the hidden state [batch, hidden] the logits come of where the graph returns it
    (``returns_hidden``; a verify step's are [batch, tokens, hidden]), None where it does not."""
    out = runner(*inputs, *store.tensors())
    extra = len(out) - len(store.tensors())
    if extra not in (1, 2):
        raise ValueError(f"a step returns its logits, optionally the hidden state, then the {len(store.tensors())} "
                         f"store tensors; found {len(out)} outputs")
    return out[0], (out[1] if extra == 2 else None), KVStore.from_tensors(store.spec, out[extra:])


__all__ = ["StepInputs", "INPUT_NAMES", "kv_aliases", "run_step", "run_step_hidden", "Runnable"]
