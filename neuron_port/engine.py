"""The server's engines: a worker thread per model that runs submitted requests, and a bounded queue.

* :class:`Engine` — continuous batching (:mod:`neuron_port.continuous`): a fixed number of slots;
  at every step boundary waiting requests fill the free slots (prefilled in their own rows) while
  the others keep decoding, and a finished request frees its slot at once. The default.
* :class:`StaticEngine` — static batching: the worker takes the first waiting request plus every
  other one already waiting (up to the batch) and decodes them together until all are done;
  later arrivals wait for the next batch. Kept for comparison (``serve --batching static``,
  ``benchmarks/serve_load.py``).

Both: beyond ``max_queue`` waiting requests :meth:`submit` raises :class:`QueueFull` (the server's
429). A request whose client went away is cancelled: its row stops at the next step. Events reach
the submitter through its callback, on the worker thread: a :class:`TokenEvent` per token, then
``None`` when it is done, or one exception that ended it (that request alone).
"""

from __future__ import annotations

import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Callable

from neuron_port.continuous import SlotBatch
from neuron_port.errors import NeuronPortError
from neuron_port.runtime import GenerationParams, Generator, TokenEvent


class QueueFull(NeuronPortError, RuntimeError):
    pass


@dataclass
class Request:
    prompt: list[int]
    params: GenerationParams
    on_event: Callable[[TokenEvent | BaseException | None], None]
    cancelled: threading.Event = field(default_factory=threading.Event)
    created: float = field(default_factory=time.monotonic)


class _Worker:
    """The queue, the worker thread and its lifecycle; subclasses say what one round of work is."""

    def __init__(self, max_queue: int):
        self.max_queue = max_queue
        self.waiting: deque[Request] = deque()
        self.running = 0
        self._cv = threading.Condition()
        self._stop = False
        self._thread = threading.Thread(target=self._loop, name="neuron-port-engine", daemon=True)
        self._thread.start()

    @property
    def queue_depth(self) -> int:
        return len(self.waiting)

    @property
    def idle(self) -> bool:
        return not self.waiting and not self.running

    def submit(self, request: Request) -> None:
        with self._cv:
            if len(self.waiting) >= self.max_queue:
                raise QueueFull(f"queue is full ({self.max_queue} requests waiting); retry later")
            self.waiting.append(request)
            self._cv.notify()

    def close(self) -> None:
        with self._cv:
            self._stop = True
            self._cv.notify()
        self._thread.join(timeout=5)

    def _take(self, limit: int, block: bool) -> list[Request]:
        """Up to ``limit`` waiting requests (the cancelled ones are dropped); waits for one when ``block``."""
        with self._cv:
            while block and not self.waiting and not self._stop:
                self._cv.wait()
            taken = []
            while self.waiting and len(taken) < limit:
                req = self.waiting.popleft()
                if req.cancelled.is_set():
                    req.on_event(None)
                    continue
                taken.append(req)
            return taken

    def _loop(self) -> None:
        while not self._stop:
            self._round()

    def _round(self) -> None:
        raise NotImplementedError


class Engine(_Worker):
    """Continuous batching over ``slots`` slots of one port (compiled graphs: their batch).

    ``lockstep``: a tensor-parallel artifact's follower ranks (:class:`~neuron_port.lockstep.Lockstep`),
    told each round before this rank (rank 0) runs it."""

    def __init__(self, port, tokenizer: Any = None, slots: int = 4, max_queue: int = 64, pad_id: int = 0,
                 lockstep: Any = None):
        self.batch = SlotBatch(port, port.batch or slots, tokenizer, pad_id)
        self.max_batch = self.batch.slots
        self.lockstep = lockstep
        super().__init__(max_queue)

    def close(self) -> None:
        super().close()
        if self.lockstep is not None:
            self.lockstep.close()

    @staticmethod
    def _dispatch(outcomes) -> None:
        for req, event in outcomes:
            req.on_event(event)
            if isinstance(event, BaseException):
                continue  # that error ended the request
            if event.finish_reason is not None:
                req.on_event(None)

    def _round(self) -> None:
        batch = self.batch
        new = self._take(len(batch.free), block=not batch.active)
        released = [slot for slot in batch.active if batch.owners[slot].cancelled.is_set()]
        for slot in released:
            batch.release(slot).on_event(None)
        if self.lockstep is not None and (new or released or batch.active):
            self.lockstep.round(released, [(r.prompt, r.params) for r in new])
        try:
            self._dispatch(batch.admit([(r.prompt, r.params, r) for r in new]))
            self.running = len(batch.active)
            self._dispatch(batch.step())
        except BaseException as exc:  # noqa: BLE001 - a failed graph step: every request in it hears why
            hit = [batch.release(slot) for slot in batch.active]
            for req in hit + [r for r in new if all(r is not h for h in hit)]:
                req.on_event(exc)
            batch.store = None
        self.running = len(batch.active)


class StaticEngine(_Worker):
    """Static batching: ``fixed_batch`` pads every batch to the size compiled graphs expect."""

    def __init__(self, generator: Generator, max_batch: int = 4, max_queue: int = 64, fixed_batch: int | None = None,
                 pad_prompt: tuple[int, ...] = (2,)):
        self.generator = generator
        self.max_batch = fixed_batch or max_batch
        self.fixed_batch = fixed_batch
        self.pad_prompt = list(pad_prompt)
        super().__init__(max_queue)

    def _round(self) -> None:
        batch = self._take(self.max_batch, block=True)
        if not batch:
            return
        self.running = len(batch)
        prompts = [r.prompt for r in batch]
        params = [r.params for r in batch]
        if self.fixed_batch:
            pad = self.fixed_batch - len(batch)
            prompts += [self.pad_prompt] * pad
            params += [GenerationParams(max_new_tokens=1)] * pad
        try:
            for event in self.generator.stream_batch(prompts, params,
                                                     cancelled=lambda row: row < len(batch) and batch[row].cancelled.is_set()):
                if event.row < len(batch):
                    batch[event.row].on_event(event)
            for req in batch:
                req.on_event(None)
        except BaseException as exc:  # noqa: BLE001 - every waiting client must hear about it
            for req in batch:
                req.on_event(exc)
        finally:
            self.running = 0


__all__ = ["Engine", "StaticEngine", "Request", "QueueFull"]
