import os

import pytest
import torch
from hypothesis import settings

# Deterministic, bounded property tests.
settings.register_profile("ci", max_examples=60, derandomize=True, deadline=None, print_blob=True)
settings.load_profile("ci")

torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))


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
