"""The serving engine: a short request overtakes a long one, and a broken callback ends one round, not the
engine."""


from __future__ import annotations

import threading
import time

import pytest

from neuron_port.generation.request import GenerationParams
from neuron_port.graph.port import Port
from neuron_port.graph.shapes import PortShape
from neuron_port.serve.engine import Engine, Submission
from tests.helpers import run_slot_schedule

SLOTS = 3


@pytest.fixture(scope="module")
def port(tiny_e2b):
    return Port.over_model(tiny_e2b, PortShape([16, 32], [48, 96])), tiny_e2b


def test_a_short_request_overtakes_a_long_one_through_the_engine(port):
    port = port[0]
    engine = Engine(port, slots=SLOTS)
    order, tokens, done = [], {"long": [], "short": []}, threading.Event()

    def listen(name):
        def on_event(event):
            if event is None:
                order.append(name)
                if len(order) == 2:
                    done.set()
            elif not isinstance(event, BaseException):
                tokens[name].append(event.token_id)
        return on_event

    short = ([2, 30, 31, 32], GenerationParams(5))
    engine.submit(Submission([2, 10, 11, 12, 13], GenerationParams(80), listen("long")))
    time.sleep(0.05)
    engine.submit(Submission(short[0], short[1], listen("short")))
    assert done.wait(120)
    engine.close()
    assert order == ["short", "long"] and len(tokens["long"]) == 80
    assert tokens["short"] == run_slot_schedule(port, [(0, *short)], SLOTS)[0]


def test_the_engine_survives_a_broken_callback_and_reports_a_fatal_round(port):
    port = port[0]
    engine = Engine(port, slots=SLOTS)
    got, done = [], threading.Event()

    def broken(event):
        raise RuntimeError("the client's loop is gone")

    def fine(event):
        if event is None:
            done.set()
        elif not isinstance(event, BaseException):
            got.append(event.token_id)

    engine.submit(Submission([2, 5, 6], GenerationParams(6), broken))
    engine.submit(Submission([2, 9, 9], GenerationParams(6), fine))
    assert done.wait(60) and len(got) == 6 and engine.error is None
    engine.close()

    class Doomed(Engine):  # the device fails in the middle of a round, after taking a request
        def _round(self):
            self._new = self._take(1, block=True)
            raise RuntimeError("the device is gone")

    fatal = Doomed(port, slots=SLOTS)
    heard, failed = [], threading.Event()
    fatal.submit(Submission([2, 5], GenerationParams(4), lambda e: (heard.append(e), failed.set())))
    assert failed.wait(30) and len(heard) == 1 and isinstance(heard[0], RuntimeError)
    assert fatal.error == "RuntimeError: the device is gone"
    with pytest.raises(Exception, match="the engine stopped"):
        fatal.submit(Submission([2, 5], GenerationParams(4), lambda e: None))
