"""The static-batch scheduler: the host loop between two device graphs.

The loop is made of small steps: :func:`pad_prompts` (the prompts in one bucket), the prefill
step, :func:`pick_tokens` (sample every live row and decide its stop), :func:`grow_if_full`
(move the store to the next KV length when a row outgrows it) and the decode step.
:func:`stream_static` strings them together, times them and streams :class:`TokenEvent` s;
:func:`run_static` runs it to the end for a :class:`GenerationResult`. Both serve
:func:`neuron_port.generation.generate.generate`, the public way in. The loop works on any object
with a ``Port``'s step methods; it never imports the port module.

Per step the host rewrites masks, one-hot writes and embeddings into preallocated tensors
(:mod:`neuron_port.graph.scratch`), samples from raw logits (softcap only where sampling needs it),
and checks stop conditions. Rows of a batch
decode together (static batching): each row has its own position, masks, ring slots, sampling
stream and stop state, and a finished row keeps running as padding without changing the others.

KV lengths: when a row's next position does not fit the current store, the whole batch moves
to the next KV length (the store is copied, :func:`neuron_port.graph.kv.grow`) if ``on_kv_full="grow"`` and
there is one; otherwise that row stops with finish reason ``length``.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

import torch

from neuron_port.generation.request import GenerationRequest, GenerationResult
from neuron_port.generation.request_state import RowState, Step, TokenEvent, advance, new_row
from neuron_port.graph.shapes import select_bucket
from neuron_port.graph.step import run_step

if TYPE_CHECKING:
    from neuron_port.graph.kv import KVStore
    from neuron_port.graph.port import Port


def pad_prompts(prompts: Sequence[Sequence[int]], buckets: Sequence[int], pad_id: int) -> tuple[int, torch.Tensor, torch.Tensor]:
    """Right-pad the prompts into the first bucket that holds the longest one.

    Returns (bucket, ids [batch, bucket], lengths [batch])."""
    bucket = select_bucket(max(len(p) for p in prompts), buckets)
    ids = torch.full((len(prompts), bucket), pad_id, dtype=torch.long)
    for r, p in enumerate(prompts):
        ids[r, : len(p)] = torch.as_tensor(list(p), dtype=torch.long)
    return bucket, ids, torch.tensor([len(p) for p in prompts], dtype=torch.long)


def pick_tokens(rows: list[RowState], logits: torch.Tensor, positions: torch.Tensor, kv_len: int, can_grow: bool,
                softcap: float | None, pad_id: int, cancelled: Callable[[int], bool] | None = None
                ) -> tuple[torch.Tensor, list[tuple[int, Step]]]:
    """Advance every live row from logits [batch, vocab] (:func:`neuron_port.generation.request_state.advance`).

    Returns (next tokens [batch], with ``pad_id`` for finished rows; ``(row, step)`` per live row)."""
    next_tok = torch.full((len(rows),), pad_id, dtype=torch.long)
    events = []
    for r, row in enumerate(rows):
        if not row.done and cancelled is not None and cancelled(r):
            row.finish("cancelled")
        if row.done:
            continue
        step = advance(row, logits[r], int(positions[r]), kv_len, can_grow, softcap)
        next_tok[r] = step.token
        events.append((r, step))
    return next_tok, events


def grow_if_full(port: Port, store: KVStore, positions: torch.Tensor, rows: list[RowState],
                 whole: KVStore | None = None) -> KVStore:
    """Move the store to the next KV length when a live row's next position does not fit: a copy into
    the larger store, or, given the ``whole`` store at the largest length that ``store`` is a prefix of
    (a device-resident store's host placeholder), the next prefix of it (nothing copied)."""
    kv = store.spec.kv_len
    if max(int(positions[r]) for r, row in enumerate(rows) if not row.done) < kv:
        return store
    bigger = port.stores.specs[port.stores.next_kv(kv)]
    return whole.prefix(bigger) if whole is not None else store.grow(bigger, positions - 1)


def _rows(port: Port, request: GenerationRequest, tokenizer: Any) -> list[RowState]:
    port.check_batch(request.batch)
    if any(p.stop_strings for p in request.params) and tokenizer is None:
        raise ValueError("stop strings need a tokenizer: pass one with the request's source")
    if any(p.prompt_logprobs is not None for p in request.params):
        raise ValueError("the static batch prefills whole prompts and scores none of their tokens: prompt_logprobs "
                         "is the slot batch's (generation.slots.SlotBatch, the server's engine)")
    return [new_row(prompt, p, tokenizer) for prompt, p in zip(request.prompts, request.params, strict=True)]


def stream_static(port: Port, request: GenerationRequest, tokenizer: Any = None, pad_id: int = 0,
                  result: GenerationResult | None = None, cancelled: Callable[[int], bool] | None = None
                  ) -> Iterator[TokenEvent]:
    """Yield every row's tokens step by step; ``result`` (when given) gets the tokens as they come,
    and the texts, finish reasons and timings when the run ends.

    ``cancelled(row)`` -> True stops that row (finish reason ``cancelled``; it keeps running as
    padding until the batch ends).

    The loop runs in ``torch.inference_mode`` (no autograd bookkeeping per op: about 5-10 %
    of a CPU decode step at the mid-size benchmark variant), or in ``no_grad`` where the
    runners cannot (XLA). Tensors it hands back (kept logits) may be inference tensors: read
    them freely, but clone one before changing it in place outside inference mode. The port's
    reused decode inputs stay ordinary tensors."""
    mode = torch.inference_mode if port.runners.inference_mode else torch.no_grad
    result = result if result is not None else GenerationResult.empty(request.batch)
    # As a decorator on a generator, torch holds the mode around each step of it, not across yields.
    return mode()(_steps)(port, request, tokenizer, pad_id, result, cancelled)


def run_static(port: Port, request: GenerationRequest, tokenizer: Any = None, pad_id: int = 0) -> GenerationResult:
    """Decode the request to the end on one port (see :func:`stream_static`)."""
    result = GenerationResult.empty(request.batch)
    for _ in stream_static(port, request, tokenizer, pad_id, result):
        pass
    return result


def _steps(port: Port, request: GenerationRequest, tokenizer: Any, pad_id: int, result: GenerationResult,
           cancelled: Callable[[int], bool] | None) -> Iterator[TokenEvent]:
    rows = _rows(port, request, tokenizer)
    result.tokens[:] = [row.tokens for row in rows]
    t0 = time.perf_counter()
    bucket, ids, lengths = pad_prompts(request.prompts, port.buckets, pad_id)
    inputs = port.inputs.prefill(ids, lengths, bucket)
    # a device-resident store: one host placeholder at the largest length, each graph handed a prefix of it
    whole = port.inputs.new_store(len(rows), port.stores.kv_len) if port.runners.resident_kv else None
    first = port.stores.specs[port.stores.prefill_kv[bucket]]
    store = whole.prefix(first) if whole is not None else port.inputs.new_store(len(rows), first.kv_len)
    step_host = time.perf_counter() - t0
    logits, store, step_graph = _timed_step(port.runners.prefill[bucket], inputs, store)
    result.prefill_s, result.graph_s, result.host_s, result.decode_steps = time.perf_counter() - t0, step_graph, 0.0, 0
    positions = lengths.clone()
    t_dec = time.perf_counter()
    while True:
        if request.keep_logits:
            result.step_logits.append(logits.clone())
        h0 = time.perf_counter()
        kv = store.spec.kv_len
        next_tok, events = pick_tokens(rows, logits, positions, kv, port.stores.next_kv(kv) is not None,
                                       port.layout.softcap, pad_id, cancelled)
        step_host += time.perf_counter() - h0
        for r, step in events:
            yield TokenEvent(r, len(rows[r].tokens) - 1, step.token, step.text, 1e3 * step_host,
                             1e3 * step_graph, step.finish_reason, step.logprob, step.top_logprobs)
        result.host_s += step_host
        if all(row.done for row in rows):
            break
        h0 = time.perf_counter()
        store = grow_if_full(port, store, positions, rows, whole)
        kv = store.spec.kv_len
        inputs = port.inputs.decode(next_tok, torch.clamp(positions, max=kv - 1), kv)
        step_host = time.perf_counter() - h0
        logits, store, step_graph = _timed_step(port.runners.decode[kv], inputs, store)
        result.step_kv_lens.append(kv)
        result.graph_s += step_graph
        positions = positions + 1
        result.decode_steps += 1
    result.decode_s = time.perf_counter() - t_dec
    result.kv_len = store.spec.kv_len
    result.finish_reasons[:] = [row.finish_reason for row in rows]
    result.texts[:] = [row.text.text for row in rows]


def _timed_step(runner, inputs, store) -> tuple[torch.Tensor, KVStore, float]:
    g0 = time.perf_counter()
    logits, store = run_step(runner, inputs, store)
    return logits, store, time.perf_counter() - g0


__all__ = ["stream_static", "run_static", "pad_prompts", "pick_tokens", "grow_if_full"]
