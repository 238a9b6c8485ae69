import os

import pytest
import torch
from hypothesis import settings

# Deterministic, bounded property tests.
settings.register_profile("ci", max_examples=60, derandomize=True, deadline=None, print_blob=True)
settings.load_profile("ci")

# Two threads per test process, split among pytest-xdist's workers when the suite runs with -n; the
# processes the tests start (CLI runs, servers, gloo ranks, benchmarks) inherit the same count through
# OMP_NUM_THREADS. Without it each child took every core while the other worker did too, and OpenMP's
# waiting threads made a tiny model's decode ~16x slower on 2 shared cores (6.5 s against 0.39 s for 100
# tokens of the tiny E2B, measured beside a busy process).
_WORKERS = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
_THREADS = max(1, min(2, (os.cpu_count() or 1) // _WORKERS))
torch.set_num_threads(_THREADS)
os.environ.setdefault("OMP_NUM_THREADS", str(_THREADS))


def _neuron_sdk_present() -> bool:
    try:
        import torch_neuronx  # noqa: F401
    except Exception:
        return False
    return True


def _torch_xla_present() -> bool:
    # Found, not imported: XLA reads its flags (device count, dump folder) when its runtime starts,
    # and the backend sets them first.
    import importlib.util

    return importlib.util.find_spec("torch_xla") is not None


def pytest_collection_modifyitems(config, items):
    skips = {}
    if not _neuron_sdk_present():
        skips["neuron"] = pytest.mark.skip(
            reason="needs the AWS Neuron SDK (torch-neuronx from the Neuron repository); not installed"
        )
    if not _torch_xla_present():
        if os.environ.get("NEURON_PORT_REQUIRE_XLA") == "1" and any("xla" in item.keywords for item in items):
            raise pytest.UsageError(
                "NEURON_PORT_REQUIRE_XLA=1 but torch_xla is not importable: the xla tests would all be skipped"
            )
        skips["xla"] = pytest.mark.skip(
            reason="needs torch-xla (pip install torch==2.8.0 torch-xla==2.8.0 in its own "
            "virtualenv; .ci/run makes one); not installed"
        )
    for item in items:
        for marker, skip in skips.items():
            if marker in item.keywords:
                item.add_marker(skip)


REQUIRE_PRETRAINED = "NEURON_PORT_REQUIRE_PRETRAINED"


def pretrained_or_skip(name: str):
    """The local HF directory of real checkpoint ``name`` (neuron_port.model.pretrained), built once per
    cache; skipped with a one-line reason when its packages are absent, unless
    NEURON_PORT_REQUIRE_PRETRAINED=1 (CI), where that is a failure."""
    from neuron_port.model.pretrained import pretrained_dir, unavailable_reason

    reason = unavailable_reason(name)
    if reason:
        if os.environ.get(REQUIRE_PRETRAINED) == "1":
            pytest.fail(f"{REQUIRE_PRETRAINED}=1 but {reason}")
        pytest.skip(reason)
    return pretrained_dir(name)


@pytest.fixture(scope="session")
def smollm2_dir():
    return pretrained_or_skip("smollm2-135m")


@pytest.fixture(scope="session")
def gemma3_dir():
    return pretrained_or_skip("gemma3-270m")


def _state_fingerprint(model) -> str:
    """A digest of every tensor in ``model``'s state (parameters and buffers), to catch a test that edits a
    shared model in place."""
    import hashlib

    digest = hashlib.sha256()
    for name, tensor in sorted(model.state_dict().items()):
        digest.update(name.encode())
        digest.update(tensor.detach().contiguous().view(-1).view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


@pytest.fixture(scope="session")
def tiny_e2b():
    """The tiny Gemma-4 E2B (random weights, seed 0), built once per session and shared by every test that
    reads it. Ports and ranks copy the model they are given; a test that edits this one in place fails the
    session at teardown (its weights are compared with what they were when it was built)."""
    from neuron_port.model.configs import load_config
    from neuron_port.model.loading import build_model

    model = build_model(load_config("gemma-4-e2b", tiny=True), seed=0)
    before = _state_fingerprint(model)
    yield model
    assert _state_fingerprint(model) == before, "a test changed the shared tiny E2B in place: copy it first"


@pytest.fixture(scope="session")
def tiny_e2b_artifact(tmp_path_factory):
    """A verified CPU artifact of the tiny E2B (bucket 32, KV length 64), compiled once per session.
    Tests that edit an artifact copy it first (``helpers.copy_tree``)."""
    from tests.helpers import run_cli

    out = tmp_path_factory.mktemp("artifact") / "e2b"
    result = run_cli("compile", "gemma-4-e2b", "--tiny", "--backend", "cpu", "--buckets", "32", "--kv-lens", "64",
                     "--out", str(out))
    assert result.returncode == 0, result.stderr
    return out
