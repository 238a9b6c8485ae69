"""Gemma-4 drafters as models: a tiny one for a target, saved by transformers and loaded back checked."""

from __future__ import annotations

import pytest
import torch

from neuron_port.errors import DrafterError
from neuron_port.model.configs import load_config
from neuron_port.model.drafter import build_drafter, load_drafter


def test_a_saved_drafter_loads_back_checked_against_its_target(tmp_path):
    config = load_config("gemma-4-e2b", tiny=True)
    drafter = build_drafter(config, seed=1, ordered=True)
    assert drafter.config.backbone_hidden_size == config.hidden_size
    assert sorted(drafter.masked_embedding.token_ordering.tolist()) == list(range(config.vocab_size))  # drawn, not zeros
    drafter.save_pretrained(tmp_path / "drafter")
    loaded = load_drafter(tmp_path / "drafter", config)
    for (name, mine), (_, theirs) in zip(drafter.state_dict().items(), loaded.state_dict().items(), strict=True):
        assert torch.equal(mine, theirs), name
    with pytest.raises(DrafterError, match="holds a config.json"):
        load_drafter(tmp_path, config)
    with pytest.raises(DrafterError, match="takes a gemma4_unified_assistant drafter, found 'gemma4_assistant'"):
        load_drafter(tmp_path / "drafter", load_config("gemma-4-12b", tiny=True))
