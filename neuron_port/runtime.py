"""The generation runtime: the host loop between two device graphs.

Per step the host rewrites masks, one-hot writes and embeddings into preallocated tensors
(:mod:`neuron_port.scratch`), samples from raw logits (softcap only where sampling needs it),
and checks stop conditions. Rows of a batch
decode together (static batching): each row has its own position, masks, ring slots, sampling
stream and stop state, and a finished row keeps running as padding without changing the others.

KV lengths: when a row's next position does not fit the current store, the whole batch moves
to the next KV length (the store is copied, :func:`kvcache.grow`) if ``on_kv_full="grow"`` and
there is one; otherwise that row stops with finish reason ``length``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable, Iterator, Sequence

import torch

from neuron_port.port import Port, select_bucket
from neuron_port.sampling import SamplingParams, sample_token


@dataclass(frozen=True)
class GenerationParams:
    max_new_tokens: int = 64
    sampling: SamplingParams = SamplingParams()
    seed: int | None = None
    stop_token_ids: tuple[int, ...] = ()
    stop_strings: tuple[str, ...] = ()
    on_kv_full: str = "grow"  # "grow" | "stop"

    def __post_init__(self) -> None:
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be at least 1, found {self.max_new_tokens}")
        if self.on_kv_full not in ("grow", "stop"):
            raise ValueError(f"on_kv_full must be 'grow' or 'stop', found {self.on_kv_full!r}")


@dataclass(frozen=True)
class TokenEvent:
    """One generated token of one row. ``text`` is the newly released text (may be empty)."""

    row: int
    index: int
    token_id: int
    text: str
    host_ms: float
    graph_ms: float
    finish_reason: str | None = None


@dataclass
class Completion:
    prompt_tokens: int
    tokens: list[int] = field(default_factory=list)
    text: str = ""
    finish_reason: str | None = None


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


class _TextState:
    """Incremental detokenisation with stop strings (text that may start a stop string is held back)."""

    def __init__(self, tokenizer, stops: Sequence[str]):
        self.tokenizer = tokenizer
        self.stops = [s for s in stops if s]
        self.hold = max((len(s) for s in self.stops), default=1) - 1
        self.released = 0
        self.text = ""

    def push(self, tokens: list[int]) -> tuple[str, bool]:
        """Returns (newly released text, stop string hit)."""
        if self.tokenizer is None:
            return "", False
        full = self.tokenizer.decode(tokens)
        for stop in self.stops:
            at = full.find(stop, max(0, self.released - len(stop)))
            if at != -1:
                self.text = full[:at]
                piece = self.text[self.released:]
                self.released = len(self.text)
                return piece, True
        self.text = full
        end = max(self.released, len(full) - self.hold)
        piece = full[self.released:end]
        self.released = end
        return piece, False

    def flush(self) -> str:
        piece = self.text[self.released:]
        self.released = len(self.text)
        return piece


class Generator:
    """Greedy and sampled decoding, streaming and static batching over a :class:`Port`."""

    def __init__(self, port: Port, tokenizer=None, pad_id: int = 0):
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
    @torch.inference_mode()
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
        of a CPU decode step at the mid-size benchmark variant). Tensors it hands back (kept
        logits) are inference tensors: read them freely, but clone one before changing it in
        place outside inference mode. The port's reused decode inputs stay ordinary tensors."""
        port = self.port
        batch = len(prompts)
        rows = list(params) if isinstance(params, (list, tuple)) else [params] * batch
        if len(rows) != batch:
            raise ValueError(f"{batch} prompts but {len(rows)} parameter sets")
        if batch == 0 or min(len(p) for p in prompts) < 1:
            raise ValueError("every prompt needs at least one token")
        port.check_batch(batch)
        if any(p.stop_strings for p in rows) and self.tokenizer is None:
            raise ValueError("stop strings need a tokenizer")
        bucket = select_bucket(max(len(p) for p in prompts), port.buckets)
        run = run if run is not None else BatchRun([])
        run.completions[:] = [Completion(prompt_tokens=len(p)) for p in prompts]
        gens = [torch.Generator().manual_seed(p.seed if p.seed is not None else 0) for p in rows]
        texts = [_TextState(self.tokenizer, p.stop_strings) for p in rows]
        history = [list(p) for p in prompts]

        t0 = time.perf_counter()
        ids = torch.full((batch, bucket), self.pad_id, dtype=torch.long)
        for r, p in enumerate(prompts):
            ids[r, : len(p)] = torch.as_tensor(list(p), dtype=torch.long)
        lengths = torch.tensor([len(p) for p in prompts], dtype=torch.long)
        kv = port.prefill_kv[bucket]
        inputs = port.host_inputs_prefill(ids, lengths, bucket)
        host = time.perf_counter() - t0
        g0 = time.perf_counter()
        out = port.prefill_runners[bucket](*inputs, *port.new_store(batch, kv))
        graph = time.perf_counter() - g0
        logits, store = out[0], list(out[1:])
        run.prefill_s = time.perf_counter() - t0
        positions = lengths.clone()
        done = [False] * batch
        step_host, step_graph = host, graph
        t_dec = time.perf_counter()
        while True:
            if keep_logits:
                run.step_logits.append(logits.clone())
            h0 = time.perf_counter()
            next_tok = torch.zeros(batch, dtype=torch.long)
            events = []
            for r in range(batch):
                if not done[r] and cancelled is not None and cancelled(r):
                    done[r], run.completions[r].finish_reason = True, "cancelled"
                if done[r]:
                    next_tok[r] = self.pad_id
                    continue
                p, c = rows[r], run.completions[r]
                tok = sample_token(logits[r], p.sampling, self.softcap, gens[r], history[r] if p.sampling.repetition_penalty != 1.0 else ())
                c.tokens.append(tok)
                history[r].append(tok)
                next_tok[r] = tok
                piece, hit_stop_string = texts[r].push(c.tokens)
                reason = None
                if tok in p.stop_token_ids or hit_stop_string:
                    reason = "stop"
                elif len(c.tokens) >= p.max_new_tokens:
                    reason = "length"
                elif int(positions[r]) >= kv and (p.on_kv_full == "stop" or kv == port.kv_lens[-1]):
                    reason = "length"
                if reason is not None:
                    piece += texts[r].flush() if not hit_stop_string else ""
                    done[r], c.finish_reason = True, reason
                    c.text = texts[r].text
                events.append((r, len(c.tokens) - 1, tok, piece, reason))
            step_host += time.perf_counter() - h0
            for r, index, tok, piece, reason in events:
                yield TokenEvent(r, index, tok, piece, 1e3 * step_host, 1e3 * step_graph, reason)
            host += step_host
            if all(done):
                break
            h0 = time.perf_counter()
            live = [r for r in range(batch) if not done[r]]
            if max(int(positions[r]) for r in live) >= kv:
                new_kv = next(k for k in port.kv_lens if k > kv)
                store = port.grow_store(store, kv, new_kv, positions - 1)
                kv = new_kv
            step_pos = torch.clamp(positions, max=kv - 1)
            inputs = port.decode_inputs(next_tok, step_pos, kv)
            step_host = time.perf_counter() - h0
            g0 = time.perf_counter()
            out = port.decode_runners[kv](*inputs, *store)
            step_graph = time.perf_counter() - g0
            graph += step_graph
            logits, store = out[0], list(out[1:])
            positions = positions + 1
            run.decode_steps += 1
        run.decode_s = time.perf_counter() - t_dec
        run.host_s, run.graph_s, run.kv_len = host, graph, kv


__all__ = ["GenerationParams", "TokenEvent", "Completion", "BatchRun", "Generator"]
