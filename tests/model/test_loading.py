"""The library's loader gives transformers' own from_pretrained model, for every shipped family."""


from __future__ import annotations

import pytest
import torch

from neuron_port import load_config
from neuron_port.checks.loader_check import loader_mismatches
from neuron_port.checks.reference import hf_reference_model
from neuron_port.model.configs import SHIPPED
from neuron_port.model.loading import build_model, load_model_dir
from neuron_port.model.localdir import write_model_dir


@pytest.mark.parametrize("name", SHIPPED)
def test_the_loader_gives_from_pretrained_s_model_for_every_family(name, tmp_path):
    write_model_dir(build_model(load_config(name, tiny=True), seed=3), tmp_path)
    reference = hf_reference_model(tmp_path)
    assert loader_mismatches(load_model_dir(tmp_path), reference) == []
    # and in bf16: exactly the cast of transformers' float32 tensors, and transformers' own bf16 model,
    # dtypes included (float32 RoPE tables stay float32, as from_pretrained(dtype=bf16) keeps them)
    bf16 = load_model_dir(tmp_path, dtype=torch.bfloat16)
    assert loader_mismatches(bf16, reference) == []
    assert loader_mismatches(bf16, hf_reference_model(tmp_path, dtype=torch.bfloat16), cast=False) == []
    assert loader_mismatches(bf16.to(torch.bfloat16), reference, cast=False)  # casting every buffer is not the same
