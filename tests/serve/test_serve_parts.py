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
        reply = Reply(served, Metrics(), False, [_Req(), _Req()], queue, [[2, 5, 6]], None, False)
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


def _reply(chat: bool, usage_chunks: str, stamps: list[float] | None = None, arrived: float = 0.0):
    import asyncio
    import threading

    from neuron_port.serve.metrics import Metrics
    from neuron_port.serve.reply import Reply

    req = type("Req", (), {})()
    req.cancelled, req.prompt, req.token_times = threading.Event(), [2, 5, 6], list(stamps or [])
    queue = asyncio.Queue()
    served = type("S", (), {"model_id": "m", "tokenizer": None})()
    return Reply(served, Metrics(), chat, [req], queue, [[2, 5, 6]], None, False, usage_chunks, arrived=arrived), queue


def _stream(chat: bool, usage_chunks: str, tokens: int = 3) -> list[dict]:
    import asyncio
    import json

    from neuron_port.generation.request_state import TokenEvent

    async def run():
        reply, queue = _reply(chat, usage_chunks)
        for i in range(tokens):
            queue.put_nowait((0, TokenEvent(0, i, 7 + i, "ab"[i % 2], 0.0, 0.0, "length" if i == tokens - 1 else None)))
        queue.put_nowait((0, None))
        return [chunk async for chunk in reply.stream()]

    chunks = asyncio.run(run())
    assert chunks[-1] == "data: [DONE]\n\n"
    return [json.loads(chunk[len("data: "):]) for chunk in chunks[:-1]]


def test_continuous_usage_stats_put_the_usage_so_far_in_every_chunk_as_vllm_does():
    from neuron_port.serve.schemas import StreamOptions

    every = _stream(True, StreamOptions(include_usage=True, continuous_usage_stats=True).usage_chunks())
    assert [c["usage"]["completion_tokens"] for c in every] == [0, 1, 2, 3, 3]  # role chunk, 3 tokens, the last
    assert all(c["usage"]["prompt_tokens"] == 3 and c["usage"]["total_tokens"] == 3 + c["usage"]["completion_tokens"]
               for c in every)
    assert every[-1]["choices"] == [] and every[-2]["choices"][0]["finish_reason"] == "length"
    last = _stream(False, StreamOptions(include_usage=True).usage_chunks())
    assert ["usage" in c for c in last] == [False, False, False, True] and last[-1]["usage"]["completion_tokens"] == 3
    # vLLM's rule: continuous usage only with include_usage
    assert StreamOptions(continuous_usage_stats=True).usage_chunks() == "none"
    assert StreamOptions(include_usage=True, include_obfuscation=True).usage_chunks() == "last"  # the openai client's
    assert all("usage" not in c for c in _stream(False, "none"))


def test_token_times_feed_the_ttft_and_inter_token_histograms():
    import asyncio

    from neuron_port.generation.request_state import TokenEvent
    from neuron_port.serve.metrics import render_metrics

    async def run():
        reply, queue = _reply(False, "none", stamps=[10.25, 10.29, 10.42], arrived=10.0)
        for i in range(3):
            queue.put_nowait((0, TokenEvent(0, i, 7, "a", 0.0, 0.0, "length" if i == 2 else None)))
        queue.put_nowait((0, None))
        await reply.whole()
        return reply.metrics

    metrics = asyncio.run(run())
    ttft, itl = metrics.tokens["ttft"], metrics.tokens["itl"]
    assert ttft.count == 1 and abs(ttft.total - 0.25) < 1e-9
    assert itl.count == 2 and abs(itl.total - 0.17) < 1e-9
    text = render_metrics(metrics, 0, 0, "smol")
    assert 'vllm:time_to_first_token_seconds_bucket{model_name="smol",le="0.1"} 0' in text
    assert 'vllm:time_to_first_token_seconds_bucket{model_name="smol",le="0.25"} 1' in text
    assert 'vllm:inter_token_latency_seconds_bucket{model_name="smol",le="0.05"} 1' in text  # 0.04
    assert 'vllm:inter_token_latency_seconds_bucket{model_name="smol",le="+Inf"} 2' in text
    assert 'vllm:inter_token_latency_seconds_count{model_name="smol"} 2' in text
    assert "vllm:e2e_request_latency_seconds_count" in text and "# TYPE vllm:time_to_first_token_seconds histogram" in text


def test_verify_steps_feed_the_speculation_counters_and_the_per_request_acceptance():
    """Two verify steps of one request (4 drafted, 3 kept; 4 drafted, 1 kept) and a plain token: vLLM's counters,
    the tokens kept at each draft position, and one request at acceptance 0.5."""
    import asyncio

    from neuron_port.generation.request_state import TokenEvent
    from neuron_port.serve.metrics import render_metrics

    steps = [(4, 3), (0, 0), (0, 0), (0, 0), (4, 1), (0, 0), (0, 0)]  # each token's (drafted, accepted)

    async def run():
        reply, queue = _reply(False, "none")
        for i, (drafted, accepted) in enumerate(steps):
            last = i == len(steps) - 1
            queue.put_nowait((0, TokenEvent(0, i, 7, "a", 0.0, 0.0, "length" if last else None, drafted=drafted,
                                            accepted=accepted)))
        queue.put_nowait((0, None))
        await reply.whole()
        return reply.metrics

    text = render_metrics(asyncio.run(run()), 0, 0, "smol")
    assert 'vllm:spec_decode_num_drafts_total{model_name="smol"} 2' in text
    assert 'vllm:spec_decode_num_draft_tokens_total{model_name="smol"} 8' in text
    assert 'vllm:spec_decode_num_accepted_tokens_total{model_name="smol"} 4' in text
    per_position = [f'vllm:spec_decode_num_accepted_tokens_per_pos_total{{model_name="smol",position="{i}"}} {n}'
                    for i, n in enumerate([2, 1, 1])]
    assert all(line in text for line in per_position) and 'position="3"' not in text
    assert 'neuron_port_request_draft_acceptance_rate_bucket{model_name="smol",le="0.4"} 0' in text
    assert 'neuron_port_request_draft_acceptance_rate_bucket{model_name="smol",le="0.5"} 1' in text
    assert 'neuron_port_request_draft_acceptance_rate_count{model_name="smol"} 1' in text
    assert "# TYPE vllm:spec_decode_num_drafts_total counter" in text


def test_a_whole_response_whose_client_left_ends_quietly_with_499():
    import asyncio

    async def run():
        reply, _ = _reply(False, "none")

        async def gone() -> bool:
            return True

        from neuron_port.serve import reply as reply_module

        reply_module.DISCONNECT_POLL_S, saved = 0.01, reply_module.DISCONNECT_POLL_S
        try:
            return await reply.whole(gone), reply
        finally:
            reply_module.DISCONNECT_POLL_S = saved

    response, reply = asyncio.run(run())
    assert response.status_code == 499 and reply.requests[0].cancelled.is_set()
    assert reply.metrics.counters["cancelled"] == 1


def test_every_4xx_is_logged_with_its_reason(caplog):
    import logging

    from neuron_port.serve.http import log_refusal

    scope = {"method": "POST", "path": "/v1/completions", "client": ("127.0.0.1", 5)}
    with caplog.at_level(logging.INFO, logger="uvicorn.error"):
        log_refusal(scope, 400, b'{"error": {"message": "unknown parameter \'foo\'"}}')
        log_refusal(scope, 499, b'{"error": {"message": "the client closed the request"}}')
        log_refusal(scope, 200, b"{}")
        log_refusal(scope, 503, b"{}")
        log_refusal(scope, 404, b"not json")  # no reason to give: the line ends at the client
        log_refusal(scope, 400, b'{"error": {"message": "expected one of: "}}')  # a reason's own ending is kept
    assert [(r.levelno, r.getMessage()) for r in caplog.records] == [
        (logging.WARNING, "neuron-port: 400 POST /v1/completions from 127.0.0.1: unknown parameter 'foo'"),
        (logging.INFO, "neuron-port: 499 POST /v1/completions from 127.0.0.1: the client closed the request"),
        (logging.WARNING, "neuron-port: 404 POST /v1/completions from 127.0.0.1"),
        (logging.WARNING, "neuron-port: 400 POST /v1/completions from 127.0.0.1: expected one of: ")]
