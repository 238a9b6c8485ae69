"""The server's parts without a server: a failing stream ends with an error event, metric labels are escaped."""


from __future__ import annotations

import pytest

pytest.importorskip("fastapi")


def test_a_stream_that_fails_ends_with_an_error_event_and_done():
    import asyncio

    from neuron_port.generation.request_state import TokenEvent
    from neuron_port.serve.metrics import Metrics
    from neuron_port.serve.reply import Reply

    class _Req:
        def __init__(self):
            import threading

            self.cancelled = threading.Event()
            self.prompt = [2, 5, 6]

    async def run():
        queue = asyncio.Queue()
        served = type("S", (), {"model_id": "m", "tokenizer": None})()
        reply = Reply(served, Metrics(), False, [_Req(), _Req()], queue, [[2, 5, 6]], None, False, False)
        queue.put_nowait((0, TokenEvent(0, 0, 7, "a", 0.0, 0.0)))
        queue.put_nowait((1, RuntimeError("the graph failed")))
        return [chunk async for chunk in reply.stream()], reply

    chunks, reply = asyncio.run(run())
    assert chunks[0].startswith("data: {") and '"text": "a"' in chunks[0]
    assert chunks[1].startswith("event: error\ndata: ") and "the graph failed" in chunks[1]
    assert chunks[-1] == "data: [DONE]\n\n"
    assert reply.requests[0].cancelled.is_set()  # the sibling choice stops: nobody would read it
    assert reply.metrics.counters["cancelled"] == 0  # not a client that went away


def test_metric_labels_are_escaped_and_unmatched_paths_share_one_label():
    from neuron_port.serve.metrics import Metrics, escape, render_metrics, route_label

    assert escape('/q"x\\y\n') == '/q\\"x\\\\y\\n'
    assert (
        route_label({}) == "unmatched"
        and route_label({"route": type("R", (), {"path": "/v1/completions"})()}) == "/v1/completions"
    )
    m = Metrics()
    m.count('/q"x', 404)
    m.count("/v1/completions", 503)
    text = render_metrics(m, 0, 0)
    assert 'route="/q\\"x"' in text and "neuron_port_server_errors_total 1" in text
    helps = {line.split()[2] for line in text.splitlines() if line.startswith("# HELP")}
    types = {line.split()[2] for line in text.splitlines() if line.startswith("# TYPE")}
    assert helps == types
