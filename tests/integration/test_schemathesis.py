"""A bounded schemathesis run against the live server's own OpenAPI schema: no 5xx, ever.

Each operation's hypothesis strategy (schemathesis builds it from the schema the server serves)
drives requests at the running server; the bodies are valid and invalid by the schema's own
rules. Bounded: a few dozen examples per operation.
"""


from __future__ import annotations

import pytest

pytest.importorskip("fastapi")
schemathesis = pytest.importorskip("schemathesis")
from hypothesis import HealthCheck, given, settings  # noqa: E402

EXAMPLES = 30


@pytest.fixture(scope="module")
def live(tiny_e2b_server):
    return tiny_e2b_server, schemathesis.openapi.from_url(tiny_e2b_server.base + "/openapi.json")


def _shorten(case) -> None:
    """Keep each generated request short; the value space is still explored below the caps."""
    if isinstance(case.body, dict):
        for key in ("max_tokens", "max_completion_tokens", "n"):
            if isinstance(case.body.get(key), int) and case.body[key] > 4:
                case.body[key] = 4


def test_no_request_the_schema_allows_gets_a_server_error(live):
    srv, schema = live
    operations = [result.ok() for result in schema.get_all_operations()]
    assert {op.path for op in operations} >= {"/v1/completions", "/v1/chat/completions", "/health", "/metrics"}
    for operation in operations:
        @settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck), database=None)
        @given(case=operation.as_strategy())
        def check(case):
            _shorten(case)
            response = case.call(base_url=srv.base, timeout=120)
            assert response.status_code < 500, f"{case.method} {case.path}: {response.text}"
            if response.status_code >= 400 and case.path.startswith("/v1/"):
                assert response.json()["error"]["message"]

        check()
