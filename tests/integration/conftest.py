import pytest

from tests.helpers import ServerProcess


@pytest.fixture(scope="session")
def tiny_e2b_server():
    """``neuron-port serve gemma-4-e2b --tiny`` (4 slots, a queue of 64, bodies up to 1 MB) on a free
    127.0.0.1 port, started once per session for the server tests and stopped after the last."""
    server = ServerProcess("gemma-4-e2b", "--tiny", "--max-batch", "4", "--max-queue", "64", "--max-body-bytes", "1000000")
    yield server
    server.stop()
