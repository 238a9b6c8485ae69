"""The server's engine: a worker thread per model that drives the slot batch, and a bounded queue.

:class:`Engine` runs submitted prompts on :class:`~neuron_port.generation.slots.SlotBatch`, a
fixed number of slots over one port. How waiting requests join is its one policy (``admission``):

* ``continuous`` (the default): at every step boundary waiting requests fill the free slots
  (prefilled in their own rows) while the others keep decoding, and a finished request frees its
  slot at once;
* ``static``: requests join only when every slot is free: the first waiting request plus every
  other one already waiting (up to the slots) decode together until all are done; later arrivals
  wait for the next batch. Kept for comparison (``serve --batching static``,
  ``benchmarks/serve_bench.py``).

Beyond ``max_queue`` waiting requests :meth:`Engine.submit` raises :class:`QueueFull` (the
server's 429); :meth:`Engine.submit_all` queues several (a request's ``n`` choices) all or none.
A cancelled request (its client went away) stops at the next step.

With ``draft_tokens`` k (speculative decoding, an eager port built for it), every step is a verify step of up to
k drafts per slot: a Gemma-4 ``drafter``'s over the batch's store, or prompt lookup's without one. Greedy output
is what plain steps give; each slot's first event of a step carries what it drafted and kept. Events reach the submitter
through its callback, on the worker thread: the prompt's :class:`PromptScores` first when it asked
for them, a :class:`TokenEvent` per token, then exactly one final event — ``None`` when it is
done, or the exception that ended it.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from neuron_port.errors import NeuronPortError, QueueFull
from neuron_port.generation.request import GenerationParams
from neuron_port.generation.request_state import PromptScores, TokenEvent
from neuron_port.generation.slots import SlotBatch

if TYPE_CHECKING:
    from neuron_port.generation.drafting import ModelDrafter

ADMISSIONS = ("continuous", "static")


@dataclass
class Submission:
    """One prompt submitted to the engine, with its parameters and who hears its events."""

    prompt: list[int]
    params: GenerationParams
    on_event: Callable[[TokenEvent | PromptScores | BaseException | None], None]
    cancelled: threading.Event = field(default_factory=threading.Event)
    created: float = field(default_factory=time.monotonic)
    finished: bool = False  # its final event (None or an exception) was delivered
    token_times: list[float] = field(default_factory=list)  # when each token was told (monotonic), for TTFT and ITL

    def tell(self, event: TokenEvent | PromptScores | BaseException | None) -> None:
        """Deliver an event; a final one (None or an exception) only once. A callback that fails
        (its client's loop is gone) is the client's problem, never the engine's."""
        if self.finished:
            return
        self.finished = event is None or isinstance(event, BaseException)
        if isinstance(event, TokenEvent):
            self.token_times.append(time.monotonic())  # before the submitter hears of it
        try:
            self.on_event(event)
        except Exception:  # noqa: BLE001 - see above
            self.cancelled.set()


class _Worker:
    """The queue, the worker thread and its lifecycle; subclasses say what one round of work is.

    A round that raises past its own handling stops the engine: every request it holds or that
    waits hears the error, later submissions are refused with it, and ``error`` says why (the
    server's health reports it)."""

    def __init__(self, max_queue: int):
        self.max_queue = max_queue
        self.waiting: deque[Submission] = deque()
        self.running = 0
        self.error: str | None = None
        self._cv = threading.Condition()
        self._stop = False
        self._thread = threading.Thread(target=self._loop, name="neuron-port-engine", daemon=True)
        self._thread.start()

    @property
    def queue_depth(self) -> int:
        return len(self.waiting)

    @property
    def idle(self) -> bool:
        with self._cv:
            return not self.waiting and not self.running

    def submit(self, request: Submission) -> None:
        self.submit_all([request])

    def submit_all(self, requests: list[Submission]) -> None:
        """Queue all of them or none (QueueFull when they do not all fit)."""
        with self._cv:
            if self.error is not None:
                raise NeuronPortError(f"the engine stopped: {self.error}")
            if len(self.waiting) + len(requests) > self.max_queue:
                raise QueueFull(f"queue is full ({self.max_queue} requests waiting); retry later")
            self.waiting.extend(requests)
            self._cv.notify()

    def close(self) -> None:
        with self._cv:
            self._stop = True
            self._cv.notify()
        self._thread.join(timeout=60)

    def _take(self, limit: int, block: bool) -> list[Submission]:
        """Up to ``limit`` waiting requests (the cancelled ones are dropped); waits for one when ``block``."""
        with self._cv:
            while block and not self.waiting and not self._stop:
                self._cv.wait()
            taken = []
            while self.waiting and len(taken) < limit:
                req = self.waiting.popleft()
                if req.cancelled.is_set():
                    req.tell(None)
                    continue
                taken.append(req)
            self.running = max(self.running, len(taken))
            return taken

    def _loop(self) -> None:
        try:
            while not self._stop:
                self._round()
        except BaseException as exc:  # noqa: BLE001 - the engine cannot go on: everyone hears why
            with self._cv:
                self.error = f"{type(exc).__name__}: {exc}"
                left = list(self.waiting)
                self.waiting.clear()
            for req in left + self._held():
                req.tell(exc)
        finally:
            self.running = 0
            self._shutdown()

    def _held(self) -> list[Submission]:
        """Submissions the engine is decoding (failed together when it stops)."""
        return []

    def _shutdown(self) -> None:
        """Whatever must happen on the engine thread when it ends."""

    def _round(self) -> None:
        raise NotImplementedError


class Engine(_Worker):
    """``slots`` slots of one port (compiled graphs: their batch), filled by ``admission``
    (``continuous`` or ``static``; see the module).

    ``lockstep``: a tensor-parallel artifact's follower ranks (:class:`~neuron_port.serve.lockstep.Lockstep`),
    told each round before this rank (rank 0) runs it. Under lockstep any failure of a round is
    fatal (the ranks would no longer hold the same state); without it a failed prefill fails the
    requests it was admitting and a failed decode step the requests decoding."""

    def __init__(self, port, tokenizer: Any = None, slots: int = 4, max_queue: int = 64, pad_id: int = 0,
                 lockstep: Any = None, admission: str = "continuous", draft_tokens: int = 0,
                 drafter: ModelDrafter | None = None):
        if admission not in ADMISSIONS:
            raise ValueError(f"admission must be one of {ADMISSIONS}, found {admission!r}")
        _check_speculation(port, draft_tokens, drafter, lockstep)
        self.admission = admission
        self.draft_tokens = draft_tokens
        self.batch = SlotBatch(port, port.batch or slots, tokenizer, pad_id, drafter=drafter)
        self.max_batch = self.batch.slots
        self.lockstep = lockstep
        self._new: list[Submission] = []  # taken this round, maybe not yet in a slot
        super().__init__(max_queue)

    def _held(self) -> list[Submission]:
        active = [self.batch.release(slot) for slot in self.batch.active]
        return active + [r for r in self._new if all(r is not a for a in active)]

    def _shutdown(self) -> None:
        if self.lockstep is not None:
            self.lockstep.close()  # from this thread: no round can be running beside it

    @staticmethod
    def _dispatch(outcomes) -> None:
        for req, event in outcomes:
            req.tell(event)
            if isinstance(event, (TokenEvent, PromptScores)) and event.finish_reason is not None:
                req.tell(None)

    def _round(self) -> None:
        batch = self.batch
        room = len(batch.free) if self.admission == "continuous" or not batch.active else 0
        new = self._new = self._take(room, block=not batch.active)
        released = [slot for slot in batch.active if batch.owners[slot].cancelled.is_set()]
        for slot in released:
            batch.release(slot).tell(None)
        if self.lockstep is not None:
            if new or released or batch.active:
                self.lockstep.round(released, [(r.prompt, r.params) for r in new])
                self._dispatch(batch.admit([(r.prompt, r.params, r) for r in new]))
                self._dispatch(self._step())
        else:
            self._isolated_round(new)
        self._new = []
        self.running = len(batch.active)

    def _isolated_round(self, new: list[Submission]) -> None:
        batch = self.batch
        try:
            self._dispatch(batch.admit([(r.prompt, r.params, r) for r in new]))
        except Exception as exc:  # noqa: BLE001 - the prefill failed: the requests it admitted hear why
            for slot in [s for s in batch.active if any(batch.owners[s] is r for r in new)]:
                batch.release(slot)
            for req in new:
                req.tell(exc)
        try:
            self._dispatch(self._step())
        except Exception as exc:  # noqa: BLE001 - the decode step failed: every request in it hears why
            for req in [batch.release(slot) for slot in batch.active]:
                req.tell(exc)
            batch.store = None

    def _step(self) -> list:
        """One decode step of the occupied slots, or with speculation one verify step of their drafts."""
        batch = self.batch
        if not self.draft_tokens:
            return batch.step()
        draft = batch.model_drafts if batch.drafter is not None else batch.lookup_drafts
        return batch.verify_step(draft(self.draft_tokens))


def _check_speculation(port, draft_tokens: int, drafter: ModelDrafter | None, lockstep: Any) -> None:
    """Refuse speculation an engine cannot run, before its thread starts."""
    if draft_tokens < 0:
        raise ValueError(f"draft_tokens is 0 (no speculation) or more, found {draft_tokens}")
    if drafter is not None and not draft_tokens:
        raise ValueError("a drafter drafts draft_tokens per verify step: set draft_tokens >= 1")
    if not draft_tokens:
        return
    if lockstep is not None:
        raise ValueError("speculative decoding needs verify graphs, which a tensor-parallel artifact does not hold")
    if draft_tokens + 1 not in port.runners.verify:
        raise ValueError(f"{draft_tokens} drafts per step need a port built with draft_tokens >= {draft_tokens} "
                         f"(verify graphs {sorted(port.runners.verify) or 'none'})")


__all__ = ["ADMISSIONS", "Engine", "Submission"]
