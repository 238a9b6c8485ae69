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


def pytest_collection_modifyitems(config, items):
    if _neuron_sdk_present():
        return
    skip = pytest.mark.skip(reason="needs the AWS Neuron SDK (torch-neuronx from the Neuron repository); not installed")
    for item in items:
        if "neuron" in item.keywords:
            item.add_marker(skip)
