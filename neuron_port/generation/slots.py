"""Continuous batching on the static graphs: a fixed number of slots, requests join and leave at step boundaries.

The decode graph runs on ``slots`` rows over one KV store at the port's largest KV length; each
step runs the decode graph of the shortest KV length that holds every active slot's position, on a
prefix of that store (:meth:`~neuron_port.graph.kv.KVStore.prefix`), so short requests read a short
store. Each row is a slot with its own KV rows, position, sampler and stop state. At a step boundary,
:meth:`SlotBatch.admit` puts waiting requests into free slots: one prefill call fills a fresh
store with the new prompts, whose rows are copied into the running store at their slots (into its
first slots when the prefill wrote a shorter store: every store of a port is a prefix of the largest,
:meth:`~neuron_port.graph.kv.KVStore.prefix`). Compiled graphs take only their own
batch, so there the prefill runs over ``slots`` rows with the new prompts in their slots' rows and
every other row empty (it writes nothing there); eager graphs prefill just the new rows. The other
slots only wait for that prefill; their KV rows are untouched. :meth:`SlotBatch.step` decodes
the occupied slots once, on the fewest rows that hold them (a request takes the lowest free slot;
compiled ports carry decode graphs for fewer rows, :func:`~neuron_port.graph.shapes.occupancy_rows`),
so one request alone does not pay for every slot; a finished request frees its slot at once, and
empty slots below the last occupied one decode as padding. Graphs built over one store (``runners.one_store``:
a device that keeps it aliased, xla) take that store whole, every row: the prefill writes the new prompts' rows
into it and a short decode step attends over its prefix inside the graph, so nothing is viewed or copied.

A request that scores its prompt (``GenerationParams.prompt_logprobs``) prefills its first token
alone and is fed the rest one decode step each, every step's logits scoring the token fed next:
the same decode graphs, so the scores are the logits the port's checks compare with Hugging Face.
Its :class:`PromptScores` come once every prompt token is scored, before its first token.

A row's computation never reads another row's values and the decode graph's shapes never change,
so a request's tokens do not depend on which other requests share the batch or when they arrived (the property
tests check this against runs of each request alone). An error while advancing one row fails
only that request; the others go on.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

import torch

from neuron_port.generation.request import GenerationParams
from neuron_port.generation.request_state import (
    PromptScores,
    RowState,
    TokenEvent,
    advance,
    feed_prompt,
    new_row,
    prefill_length,
    prompt_scores,
)
from neuron_port.generation.speculative import ngram_draft
from neuron_port.graph.kv import KVStore
from neuron_port.graph.shapes import select_bucket
from neuron_port.graph.step import run_step_hidden

if TYPE_CHECKING:
    from neuron_port.generation.drafting import ModelDrafter

Outcome = tuple[Any, "TokenEvent | PromptScores | BaseException"]
"""(the request's owner, its next event or the error that ended it)."""


@dataclass(frozen=True)
class StepInfo:
    """What the batch's last prefill or decode step ran: the KV length of its store, its rows, the seconds
    spent in the graph and on the host before it, and (a batch keeping logits) each advanced slot's raw
    logits [vocab]."""

    kv_len: int = 0
    rows: int = 0
    host_s: float = 0.0
    graph_s: float = 0.0
    logits: dict[int, torch.Tensor] = field(default_factory=dict)


class SlotBatch:
    """``slots`` requests decoding together over one port (rank 0's, or a tp 1 port)."""

    def __init__(self, port, slots: int, tokenizer: Any = None, pad_id: int = 0, keep_logits: bool = False,
                 drafter: ModelDrafter | None = None):
        port.check_batch(slots)
        if drafter is not None and not (port.graphs is not None and all(
                g.returns_hidden for g in (*port.graphs.prefill.values(), *port.graphs.decode.values(),
                                           *port.graphs.verify.values()))):
            raise ValueError("a drafter reads the hidden state every step of its port returns: build the port with "
                             "returns_hidden=True (Port.over_model, Port.for_rank)")
        # a Gemma-4 drafter reading this batch's store (its port's graphs return their hidden states); None: drafts,
        # if any, come by prompt lookup
        self.drafter = drafter
        self.port, self.slots, self.tokenizer, self.pad_id = port, slots, tokenizer, pad_id
        self.keep_logits = keep_logits  # each step's logits stay in ``last`` (an offline run's checks read them)
        self.last = StepInfo()
        self.kv_len = port.kv_len
        self.rows: list[RowState | None] = [None] * slots
        self.owners: list[Any] = [None] * slots
        self.positions = torch.zeros(slots, dtype=torch.long)
        self.tokens = torch.full((slots,), pad_id, dtype=torch.long)
        self.store: KVStore | None = None
        self.mode = torch.inference_mode if port.runners.inference_mode else torch.no_grad
        self.drafted = self.accepted = 0  # speculative decoding: drafted tokens verified, and those kept

    @property
    def free(self) -> list[int]:
        return [s for s, row in enumerate(self.rows) if row is None]

    @property
    def active(self) -> list[int]:
        return [s for s, row in enumerate(self.rows) if row is not None]

    def release(self, slot: int) -> Any:
        """Free ``slot`` (its request finished, failed or was cancelled); returns its owner."""
        owner, self.rows[slot], self.owners[slot] = self.owners[slot], None, None
        self.tokens[slot] = self.pad_id
        if self.drafter is not None:
            self.drafter.forget(slot)
        return owner

    def _event(self, slot: int, step, host_ms: float, graph_ms: float) -> TokenEvent:
        row = self.rows[slot]
        return TokenEvent(
            slot,
            len(row.tokens) - 1,
            step.token,
            step.text,
            host_ms,
            graph_ms,
            step.finish_reason,
            step.logprob,
            step.top_logprobs,
        )

    def _advance(self, slots: Sequence[int], logits: Sequence[torch.Tensor], host_ms: float, graph_ms: float) -> list[Outcome]:
        """Advance each given slot from its logits [vocab] (``logits[i]`` is ``slots[i]``'s); free
        the finished and the failed."""
        out: list[Outcome] = []
        cap = self.port.layout.softcap
        for slot, row_logits in zip(slots, logits, strict=True):
            owner, row = self.owners[slot], self.rows[slot]
            try:
                if self._score_prompt(slot, row, row_logits, cap, out):
                    continue
                step = advance(row, row_logits, int(self.positions[slot]), self.kv_len, cap)
            except Exception as exc:  # noqa: BLE001 - this request's own failure: it alone ends
                self.release(slot)
                out.append((owner, exc))
                continue
            out.append((owner, self._event(slot, step, host_ms, graph_ms)))
            self.tokens[slot] = step.token
            if step.finish_reason is not None:
                self.release(slot)
        return out

    def _score_prompt(self, slot: int, row: RowState, logits: torch.Tensor, cap: float | None, out: list[Outcome]) -> bool:
        """For a row scoring its prompt: feed its next prompt token (scored by ``logits``) and, once
        every prompt token is scored, send the scores. True when this step is spent on the prompt
        (the row samples nothing from ``logits``)."""
        fed = bool(row.forced)
        if fed:
            self.tokens[slot] = feed_prompt(row, logits, cap)
        if row.params.prompt_logprobs is not None and not row.forced and not row.scores_sent:
            out.append((self.owners[slot], prompt_scores(row, slot)))
            if row.done:
                self.release(slot)
                return True
        return fed

    def admit(self, entries: Sequence[tuple[Sequence[int], GenerationParams, Any]]) -> list[Outcome]:
        """Prefill ``(prompt, params, owner)`` entries into free slots (at most as many as are free);
        their first tokens."""
        entries = list(entries)[: len(self.free)]
        if not entries:
            return []
        with self.mode():
            t0 = time.perf_counter()
            slots = self.free[: len(entries)]
            one = self.port.runners.one_store
            # compiled graphs or one store: every slot's row, the new prompts at their slots; eager: the new rows only
            every_row = self.port.batch is not None or one
            rows = slots if every_row else list(range(len(entries)))
            states = [new_row(prompt, params, self.tokenizer) for prompt, params, _ in entries]
            bucket = select_bucket(max(prefill_length(state) for state in states), self.port.buckets)
            ids = torch.full((self.slots if every_row else len(entries), bucket), self.pad_id, dtype=torch.long)
            lengths = torch.zeros(ids.shape[0], dtype=torch.long)
            for slot, row, state, (prompt, _, owner) in zip(slots, rows, states, entries, strict=True):
                length = prefill_length(state)
                ids[row, :length] = torch.as_tensor(list(prompt[:length]), dtype=torch.long)
                lengths[row] = length
                self.rows[slot], self.owners[slot] = state, owner
                self.positions[slot] = length
            inputs = self.port.inputs.prefill(ids, lengths, bucket)
            first = self.port.stores.specs[self.port.stores.prefill_kv[bucket]]
            resident = self.port.runners.resident_kv
            if (resident or one) and self.store is None:  # the one store, made at the first admission
                self.store = self.port.inputs.new_store(self.slots, self.kv_len)
            if resident:  # the device holds the store: the host's one placeholder, viewed
                fresh = self.store.prefix(first)
            elif one:  # the prefill writes the new rows into the running store itself (it leaves empty rows alone)
                fresh = self.store
            else:
                fresh = self.port.inputs.new_store(ids.shape[0], first.kv_len)
            host = time.perf_counter() - t0
            g0 = time.perf_counter()
            logits, hidden, fresh = run_step_hidden(self.port.runners.prefill[bucket], inputs, fresh)
            graph = time.perf_counter() - g0
            for slot, row in zip(slots, rows, strict=True):
                self._seen(slot, hidden, row, int(lengths[row]) - 1, int(lengths[row]))
            if one:
                self.store = fresh
            else:
                self._merge(fresh, rows, slots)
            self._note(first.kv_len, ids.shape[0], host, graph, slots, [logits[r] for r in rows])
            return self._advance(slots, [logits[r] for r in rows], 1e3 * host, 1e3 * graph)

    def _note(self, kv_len: int, rows: int, host: float, graph: float, slots: Sequence[int],
              logits: Sequence[torch.Tensor]) -> None:
        kept = {slot: row.clone() for slot, row in zip(slots, logits, strict=True)} if self.keep_logits else {}
        self.last = StepInfo(kv_len, rows, host, graph, kept)

    def _merge(self, fresh: KVStore, rows: list[int], slots: list[int]) -> None:
        """Copy the prefilled ``rows`` of ``fresh`` into the running store at ``slots``, into the first slots
        of each buffer when the prefill wrote a shorter store (its prefix view; what lies past it in those
        rows is a former request's, which no mask of the new one reaches). Nothing to copy where the store
        lives on the device (the prefill wrote its rows there), nor where the first prefill filled every slot at
        the store's full length (its store becomes the running one)."""
        if self.port.runners.resident_kv:
            return
        whole = fresh.spec.kv_len == self.kv_len and rows == slots == list(range(self.slots))
        if self.store is None and whole:  # every slot filled at the full length: the prefill's store is the store
            self.store = fresh
            return
        if self.store is None:  # on the device the prefill's store is on
            self.store = self.port.inputs.new_store(self.slots, self.kv_len).to(fresh.tensors()[0].device)
        target = self.store if fresh.spec.kv_len == self.kv_len else self.store.prefix(fresh.spec)
        src_index, dst_index = torch.tensor(rows, dtype=torch.long), torch.tensor(slots, dtype=torch.long)
        for dst, src in zip(target.tensors(), fresh.tensors(), strict=True):
            dst.index_copy_(0, dst_index.to(dst.device), src.index_select(0, src_index.to(src.device)).to(dst.device))

    def decode_length(self, active: Sequence[int]) -> int:
        """The shortest KV length of the port that holds every active slot's next position."""
        needed = int(self.positions[list(active)].max()) + 1
        return min((kv for kv in self.port.runners.decode if kv >= needed), default=self.kv_len)

    def step(self) -> list[Outcome]:
        """One decode step of the occupied slots, at the shortest KV length holding the active ones and
        over the fewest rows holding them (the first ``rows`` slots: a request takes the lowest free slot):
        the graph runs on a prefix of the one store, its rows and slots; the events of the active ones."""
        active = self.active
        if not active or self.store is None:
            return []
        with self.mode():
            t0 = time.perf_counter()
            kv = self.decode_length(active)
            one = self.port.runners.one_store
            if one and self.port.batch is None:  # eager graphs over one store take all of its rows
                rows, runner = self.slots, self.port.runners.decode[kv]
            else:
                rows, runner = self.port.runners.decode_step(max(active) + 1, kv)
            steps = torch.clamp(self.positions[:rows], max=kv - 1)  # a waiting slot's stale position stays in range
            inputs = self.port.inputs.decode(self.tokens[:rows], steps)
            whole = one or (kv == self.kv_len and rows == self.slots)
            store = self.store if whole else self.store.prefix(self.port.stores.specs[kv], rows)
            host = time.perf_counter() - t0
            g0 = time.perf_counter()
            logits, hidden, answer = run_step_hidden(runner, inputs, store)
            for slot in active:
                self._seen(slot, hidden, slot, int(steps[slot]), 1)
            if whole:
                self.store = answer
            else:
                self.store.write_prefix(answer)
            graph = time.perf_counter() - g0
            self.positions[active] += 1
            self._note(kv, rows, host, graph, active, [logits[s] for s in active])
            return self._advance(active, [logits[s] for s in active], 1e3 * host, 1e3 * graph)

    # ---- speculative decoding ------------------------------------------------------------------------
    def _seen(self, slot: int, hidden: torch.Tensor | None, row: int, written: int, fed: int) -> None:
        """Tell the drafter ``slot``'s latest target call: ``hidden[row]`` gave its last token."""
        if self.drafter is not None and hidden is not None:
            self.drafter.observe(slot, hidden[row], written, fed)

    def model_drafts(self, draft_tokens: int) -> dict[int, list[int]]:
        """The drafter's drafts of up to ``draft_tokens`` tokens for each active slot: none for a row still scoring
        its prompt, never past the store, and (as transformers' assisted generation) never more than leaves one
        token of the row's ``max_new_tokens`` to the target."""
        if self.drafter is None:
            raise ValueError("this batch has no drafter: build it with SlotBatch(..., drafter=ModelDrafter(...))")
        wanted = {}
        for slot in self.active:
            row = self.rows[slot]
            room = min(self.kv_len - 1 - int(self.positions[slot]), row.params.max_new_tokens - len(row.tokens) - 1)
            wanted[slot] = 0 if row.forced else max(0, min(draft_tokens, room))
        with self.mode():
            return self.drafter.draft(wanted, self.tokens, self.positions, self.store)

    def lookup_drafts(self, draft_tokens: int) -> dict[int, list[int]]:
        """Prompt-lookup drafts of up to ``draft_tokens`` tokens for each active slot
        (:func:`~neuron_port.generation.speculative.ngram_draft` over its prompt and tokens): none for a row still
        scoring its prompt, never past the store (the fed token and its drafts must fit), and (as
        :meth:`model_drafts`) never more than leaves one token of the row's ``max_new_tokens`` to the target."""
        drafts = {}
        for slot in self.active:
            row = self.rows[slot]
            room = min(self.kv_len - 1 - int(self.positions[slot]), row.params.max_new_tokens - len(row.tokens) - 1)
            if row.forced or room < 1:
                drafts[slot] = []
                continue
            drafts[slot] = ngram_draft(row.history, min(draft_tokens, room), stop_ids=row.params.stop_token_ids)
        return drafts

    def verify_step(self, drafts: dict[int, Sequence[int]]) -> list[Outcome]:
        """One verify step of the active slots: each feeds its pending token then its drafted tokens (``drafts[slot]``,
        at most the port's ``draft_tokens``), the target's logits of every fed position come back in one call, and
        each slot emits tokens from them in order while they equal its draft: sampled as a plain step samples them
        (greedy: the argmax), so with a deterministic draft the output is distributed as without one (speculative
        sampling's rule for a one-hot draft), and greedy output is token for token the same. Without drafts it is
        a plain :meth:`step`. A port built with ``draft_tokens`` k (``PortShape(..., draft_tokens=k)``): eager graphs
        verify the rows that hold the active slots, compiled ones (xla, cpu TorchScript) every row of their batch."""
        active = self.active
        longest = max((len(drafts.get(slot, ())) for slot in active), default=0)
        if not longest or self.store is None:
            return self.step()
        if self.keep_logits:
            raise ValueError("a batch keeping every step's logits runs plain steps (verify steps keep none yet)")
        if longest + 1 not in self.port.runners.verify:
            raise ValueError(f"a verify step of {longest + 1} tokens needs a port built with draft_tokens >= "
                             f"{longest} (verify graphs {sorted(self.port.runners.verify)})")
        with self.mode():
            t0 = time.perf_counter()
            every_row = self.port.batch is not None or self.port.runners.one_store  # compiled: the whole batch
            rows, width = self.slots if every_row else max(active) + 1, longest + 1
            fed = torch.full((rows, width), self.pad_id, dtype=torch.long)
            fed[:, 0] = self.tokens[:rows]
            for slot in active:
                fed[slot, 1: 1 + len(drafts.get(slot, ()))] = torch.as_tensor(list(drafts.get(slot, ())), dtype=torch.long)
            inputs = self.port.inputs.verify(fed, torch.clamp(self.positions[:rows], max=self.kv_len - 1))
            whole = rows == self.slots
            store = self.store if whole else self.store.prefix(self.port.stores.largest, rows)
            host = time.perf_counter() - t0
            g0 = time.perf_counter()
            logits, hidden, answer = run_step_hidden(self.port.runners.verify[width], inputs, store)
            self.store = answer if whole else self.store
            if not whole:
                self.store.write_prefix(answer)
            graph = time.perf_counter() - g0
            self._note(self.kv_len, rows, host, graph, [], [])
            out: list[Outcome] = []
            for slot in active:
                draft, start = list(drafts.get(slot, ())), int(self.positions[slot])
                out += self._accept(slot, draft, logits[slot], 1e3 * host, 1e3 * graph)
                if self.rows[slot] is not None:  # the row that gave its last token: one per token kept this step
                    kept = int(self.positions[slot]) - start - 1
                    self._seen(slot, None if hidden is None else hidden[:, kept], slot, start + len(draft), len(draft) + 1)
            return out

    def _accept(self, slot: int, draft: list[int], logits: torch.Tensor, host_ms: float, graph_ms: float) -> list[Outcome]:
        """Emit ``slot``'s tokens from its verify rows ``logits`` [len(draft) + 1, vocab] while they equal its draft.
        A drafted token the target emits is accepted (the one that ends the row included); the first event carries
        the step's drafted and accepted counts."""
        out: list[Outcome] = []
        start = int(self.positions[slot])
        kept = 0
        for i in range(len(draft) + 1):
            self.positions[slot] = start + i + 1
            emitted = self._advance([slot], [logits[i]], host_ms, graph_ms)
            out += emitted
            event = emitted[0][1] if emitted else None
            matched = i < len(draft) and isinstance(event, TokenEvent) and event.token_id == draft[i]
            kept += matched
            if self.rows[slot] is None or not matched:
                break
        self.drafted += len(draft)
        self.accepted += kept
        if draft and out and isinstance(out[0][1], TokenEvent):
            out[0] = (out[0][0], replace(out[0][1], drafted=len(draft), accepted=kept))
        return out

__all__ = ["SlotBatch", "StepInfo", "Outcome"]
