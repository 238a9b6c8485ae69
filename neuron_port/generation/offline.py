"""A whole request through the slot batch: what :func:`~neuron_port.generation.generate.generate` runs on a port.

There is one scheduler, :class:`~neuron_port.generation.slots.SlotBatch`: the server's engine feeds it
requests as they arrive, and :func:`run_request` feeds it one request's rows at once (row ``r`` takes
slot ``r``: one prefill of every prompt) and steps it until every row has finished. A finished row
frees its slot at once; later steps decode the fewest rows that hold the live ones, at the shortest KV
length that holds them, over the one store (see :mod:`neuron_port.generation.slots`). A row stops
with ``length`` at its ``max_new_tokens`` or at the port's largest KV length.

What the offline caller gets beyond the server's events: the run's timings (prefill, decode, host and
graph seconds, the KV length each decode step read) and, when the request keeps them, the raw logits of
every step as ``[batch, vocab]`` (a row that had already finished is NaN in the steps after its last).
Every rank of a tensor-parallel port runs this same loop; the all-reduces keep their logits identical.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch

from neuron_port.generation.request import GenerationRequest, GenerationResult
from neuron_port.generation.request_state import TokenEvent
from neuron_port.generation.slots import SlotBatch

if TYPE_CHECKING:
    from neuron_port.generation.drafting import ModelDrafter
    from neuron_port.graph.port import Port


def _check(port: Port, request: GenerationRequest, tokenizer: Any) -> None:
    port.check_batch(request.batch)
    if any(p.stop_strings for p in request.params) and tokenizer is None:
        raise ValueError("stop strings need a tokenizer: pass one with the request's source")
    if any(p.prompt_logprobs is not None for p in request.params):
        raise ValueError("a GenerationResult has no place for prompt scores: prompt_logprobs is the server's "
                         "(neuron_port.serve.engine.Engine, whose events carry them)")


def run_request(port: Port, request: GenerationRequest, tokenizer: Any = None, pad_id: int = 0,
                on_token: Callable[[TokenEvent], None] | None = None, drafter: ModelDrafter | None = None
                ) -> GenerationResult:
    """Decode every row of ``request`` to its end on one port.

    With ``request.draft_tokens``, each step verifies drafts: the ``drafter``'s (a Gemma-4 drafter over this port's
    store, whose graphs return their hidden states) or, without one, prompt lookup's.

    ``on_token(event)`` hears every token as it is made (``event.row`` is the request's row), outside the
    batch's grad mode. The result holds each row's tokens, texts and finish reasons, the timings, and
    (``request.keep_logits``) every step's raw logits [batch, vocab]."""
    _check(port, request, tokenizer)
    result = GenerationResult.empty(request.batch)
    batch = SlotBatch(port, request.batch, tokenizer, pad_id, keep_logits=request.keep_logits, drafter=drafter)
    draft = batch.model_drafts if drafter is not None else batch.lookup_drafts
    entries = [(prompt, params, row) for row, (prompt, params) in enumerate(zip(request.prompts, request.params,
                                                                                 strict=True))]
    t0 = time.perf_counter()
    outcomes = batch.admit(entries)
    result.prefill_s = time.perf_counter() - t0
    result.graph_s, result.host_s = batch.last.graph_s, result.prefill_s - batch.last.graph_s
    result.kv_len = batch.last.kv_len
    _record(result, batch, outcomes, request, on_token)
    t_dec = time.perf_counter()
    while batch.active:
        s0 = time.perf_counter()
        outcomes = batch.verify_step(draft(request.draft_tokens)) if request.draft_tokens else batch.step()
        result.graph_s += batch.last.graph_s
        result.host_s += time.perf_counter() - s0 - batch.last.graph_s
        result.step_kv_lens.append(batch.last.kv_len)
        result.kv_len = max(result.kv_len, batch.last.kv_len)
        result.decode_steps += 1
        _record(result, batch, outcomes, request, on_token)
    result.decode_s = time.perf_counter() - t_dec
    result.drafted, result.accepted = batch.drafted, batch.accepted
    return result


def _record(result: GenerationResult, batch: SlotBatch, outcomes, request: GenerationRequest,
            on_token: Callable[[TokenEvent], None] | None) -> None:
    """Put one call's outcomes into the result (tokens, texts, finish reasons; the step's logits)."""
    if request.keep_logits:
        first = next(iter(batch.last.logits.values()))
        step = torch.full((request.batch, first.shape[-1]), float("nan"), dtype=first.dtype)
        for slot, logits in batch.last.logits.items():
            step[slot] = logits
        result.step_logits.append(step)
    for row, event in outcomes:
        if isinstance(event, BaseException):
            raise event
        result.tokens[row].append(event.token_id)
        result.texts[row] += event.text
        if event.finish_reason is not None:
            result.finish_reasons[row] = event.finish_reason
        if on_token is not None:
            on_token(event)


__all__ = ["run_request"]
