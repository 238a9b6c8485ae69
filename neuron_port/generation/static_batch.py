"""The generation runtime: the host loop between two device graphs.

The loop is made of small steps: :func:`pad_prompts` (the prompts in one bucket), the prefill
step, :func:`pick_tokens` (sample every live row and decide its stop), :func:`grow_if_full`
(move the store to the next KV length when a row outgrows it) and the decode step. The
:class:`Generator` strings them together, times them and streams :class:`TokenEvent` s;
:func:`greedy_generate` is the greedy shortcut over it. The loop works on any object with a
``Port``'s step methods; it never imports the port module.

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
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable, Iterator, Sequence

import torch

from neuron_port.generation.request_state import Completion, GenerationParams, RowState, Step, TokenEvent, advance, new_row
from neuron_port.graph.shapes import select_bucket
from neuron_port.graph.step import run_step

if TYPE_CHECKING:
    from neuron_port.graph.kv import KVStore
    from neuron_port.graph.port import Port


@dataclass
class BatchRun:
    completions: list[Completion]
    prefill_s: float = 0.0
    decode_s: float = 0.0
    decode_steps: int = 0
    host_s: float = 0.0
    graph_s: float = 0.0
    kv_len: int = 0
    step_logits: list[torch.Tensor] = field(default_factory=list)


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
            row.done, row.completion.finish_reason = True, "cancelled"
        if row.done:
            continue
        step = advance(row, logits[r], int(positions[r]), kv_len, can_grow, softcap)
        next_tok[r] = step.token
        events.append((r, step))
    return next_tok, events


def grow_if_full(port: "Port", store: "KVStore", positions: torch.Tensor, rows: list[RowState]) -> "KVStore":
    """Move the store to the next KV length when a live row's next position does not fit."""
    kv = store.spec.kv_len
    if max(int(positions[r]) for r, row in enumerate(rows) if not row.done) < kv:
        return store
    return store.grow(port.specs[port.stores.next_kv(kv)], positions - 1)


class Generator:
    """Greedy and sampled decoding, streaming and static batching over a :class:`~neuron_port.graph.port.Port`."""

    def __init__(self, port: "Port", tokenizer=None, pad_id: int = 0):
        self.port = port
        self.tokenizer = tokenizer
        self.pad_id = pad_id
        self.softcap = port.layout.softcap

    # ---- public API -------------------------------------------------------------------------
    def stream(self, prompt: Sequence[int], params: GenerationParams) -> Iterator[TokenEvent]:
        yield from self.stream_batch([prompt], params)

    def generate(self, prompt: Sequence[int], params: GenerationParams) -> Completion:
        return self.run_batch([prompt], params).completions[0]

    def run_batch(
        self, prompts: Sequence[Sequence[int]], params: GenerationParams | Sequence[GenerationParams], keep_logits: bool = False
    ) -> BatchRun:
        run = BatchRun([])
        for _ in self.stream_batch(prompts, params, run=run, keep_logits=keep_logits):
            pass
        return run

    # ---- the loop ---------------------------------------------------------------------------
    def _rows(self, prompts: Sequence[Sequence[int]], params: GenerationParams | Sequence[GenerationParams]) -> list[RowState]:
        batch = len(prompts)
        per_row = list(params) if isinstance(params, (list, tuple)) else [params] * batch
        if len(per_row) != batch:
            raise ValueError(f"{batch} prompts but {len(per_row)} parameter sets")
        if batch == 0 or min(len(p) for p in prompts) < 1:
            raise ValueError("every prompt needs at least one token")
        self.port.check_batch(batch)
        if any(p.stop_strings for p in per_row) and self.tokenizer is None:
            raise ValueError("stop strings need a tokenizer")
        return [new_row(prompt, p, self.tokenizer) for prompt, p in zip(prompts, per_row)]

    def stream_batch(
        self,
        prompts: Sequence[Sequence[int]],
        params: GenerationParams | Sequence[GenerationParams],
        run: BatchRun | None = None,
        keep_logits: bool = False,
        cancelled: Callable[[int], bool] | None = None,
    ) -> Iterator[TokenEvent]:
        """Yield every row's tokens step by step. ``cancelled(row)`` -> True stops that row
        (finish reason ``cancelled``; it keeps running as padding until the batch ends).

        The loop runs in ``torch.inference_mode`` (no autograd bookkeeping per op: about 5-10 %
        of a CPU decode step at the mid-size benchmark variant), or in ``no_grad`` where the
        runners cannot (XLA). Tensors it hands back (kept logits) may be inference tensors: read
        them freely, but clone one before changing it in place outside inference mode. The port's
        reused decode inputs stay ordinary tensors."""
        mode = torch.inference_mode if self.port.runners.inference_mode else torch.no_grad
        # As a decorator on a generator, torch holds the mode around each step of it, not across yields.
        return mode()(self._steps)(prompts, params, run, keep_logits, cancelled)

    def _steps(self, prompts, params, run, keep_logits, cancelled) -> Iterator[TokenEvent]:
        port = self.port
        rows = self._rows(prompts, params)
        run = run if run is not None else BatchRun([])
        run.completions[:] = [row.completion for row in rows]
        t0 = time.perf_counter()
        bucket, ids, lengths = pad_prompts(prompts, port.buckets, self.pad_id)
        inputs = port.inputs.prefill(ids, lengths, bucket)
        store = port.inputs.new_store(len(rows), port.prefill_kv[bucket])
        step_host = time.perf_counter() - t0
        logits, store, step_graph = _timed_step(port.prefill_runners[bucket], inputs, store)
        run.prefill_s, run.graph_s, run.host_s, run.decode_steps = time.perf_counter() - t0, step_graph, 0.0, 0
        positions = lengths.clone()
        t_dec = time.perf_counter()
        while True:
            if keep_logits:
                run.step_logits.append(logits.clone())
            h0 = time.perf_counter()
            kv = store.spec.kv_len
            next_tok, events = pick_tokens(rows, logits, positions, kv, port.stores.next_kv(kv) is not None,
                                           self.softcap, self.pad_id, cancelled)
            step_host += time.perf_counter() - h0
            for r, step in events:
                yield TokenEvent(r, len(rows[r].completion.tokens) - 1, step.token, step.text, 1e3 * step_host,
                                 1e3 * step_graph, step.finish_reason, step.logprob, step.top_logprobs)
            run.host_s += step_host
            if all(row.done for row in rows):
                break
            h0 = time.perf_counter()
            store = grow_if_full(port, store, positions, rows)
            kv = store.spec.kv_len
            inputs = port.inputs.decode(next_tok, torch.clamp(positions, max=kv - 1), kv)
            step_host = time.perf_counter() - h0
            logits, store, step_graph = _timed_step(port.decode_runners[kv], inputs, store)
            run.graph_s += step_graph
            positions = positions + 1
            run.decode_steps += 1
        run.decode_s = time.perf_counter() - t_dec
        run.kv_len = store.spec.kv_len


def _timed_step(runner, inputs, store) -> tuple[torch.Tensor, "KVStore", float]:
    g0 = time.perf_counter()
    logits, store = run_step(runner, inputs, store)
    return logits, store, time.perf_counter() - g0


@dataclass
class GreedyResult:
    """Tokens of each row and timings of a greedy run."""

    tokens: list[list[int]]
    finish_reasons: list[str]
    prefill_s: float
    decode_s: float
    decode_steps: int
    host_s: float = 0.0
    step_logits: list[torch.Tensor] = field(default_factory=list)

    @property
    def decode_tok_per_s(self) -> float | None:
        return round(self.decode_steps / self.decode_s, 3) if self.decode_s > 0 else None

    def to_json(self) -> dict:
        """Tokens, finish reasons and timings as JSON-able data (logits excluded)."""
        return {"tokens": self.tokens, "finish_reasons": self.finish_reasons, "prefill_s": self.prefill_s,
                "decode_s": self.decode_s, "decode_steps": self.decode_steps, "host_s": self.host_s,
                "decode_tok_per_s": self.decode_tok_per_s}


def greedy_generate(
    port: "Port",
    prompts: Sequence[Sequence[int]],
    max_new_tokens: int,
    stop_ids: Sequence[int] = (),
    pad_id: int = 0,
    keep_logits: bool = False,
) -> GreedyResult:
    """Greedy decoding of a batch of prompts over one port's graphs (see :class:`Generator`).

    ``keep_logits``: the raw logits of every step, before the host softcap."""
    params = GenerationParams(max_new_tokens=max_new_tokens, stop_token_ids=tuple(stop_ids))
    run = Generator(port, pad_id=pad_id).run_batch(list(prompts), params, keep_logits=keep_logits)
    return GreedyResult(
        tokens=[c.tokens for c in run.completions],
        finish_reasons=[c.finish_reason for c in run.completions],
        prefill_s=run.prefill_s,
        decode_s=run.decode_s,
        decode_steps=run.decode_steps,
        host_s=run.host_s,
        step_logits=run.step_logits,
    )


__all__ = ["BatchRun", "Generator", "GreedyResult", "greedy_generate", "pad_prompts", "pick_tokens", "grow_if_full"]
