"""One generator per device, a worker thread, static batching and a bounded queue.

Requests are queued in arrival order. The worker takes the first waiting request plus every
other one already waiting (up to ``max_batch``) and decodes them together with the runtime's
static batching; later arrivals wait for the next batch. Beyond ``max_queue`` waiting requests
:meth:`Engine.submit` raises :class:`QueueFull` (the server's 429). A request whose client went
away is cancelled: its row stops at the next step and its slot is freed when the batch ends.
Events reach the submitter through a callback, called on the worker thread.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Callable

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


class Engine:
    """Owns the generator; ``fixed_batch`` pads every batch to the size compiled graphs expect."""

    def __init__(self, generator: Generator, max_batch: int = 4, max_queue: int = 64, fixed_batch: int | None = None,
                 pad_prompt: tuple[int, ...] = (2,)):
        self.generator = generator
        self.max_batch = fixed_batch or max_batch
        self.max_queue = max_queue
        self.fixed_batch = fixed_batch
        self.pad_prompt = list(pad_prompt)
        self.waiting: deque[Request] = deque()
        self.running = 0
        self._cv = threading.Condition()
        self._stop = False
        self._thread = threading.Thread(target=self._loop, name="neuron-port-engine", daemon=True)
        self._thread.start()

    @property
    def queue_depth(self) -> int:
        return len(self.waiting)

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

    def _take_batch(self) -> list[Request]:
        with self._cv:
            while not self.waiting and not self._stop:
                self._cv.wait()
            if self._stop:
                return []
            batch = []
            while self.waiting and len(batch) < self.max_batch:
                req = self.waiting.popleft()
                if req.cancelled.is_set():
                    req.on_event(None)
                    continue
                batch.append(req)
            self.running = len(batch)
            return batch

    def _loop(self) -> None:
        while True:
            batch = self._take_batch()
            if not batch:
                if self._stop:
                    return
                continue
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
                with self._cv:
                    self.running = 0


__all__ = ["Engine", "Request", "QueueFull"]
