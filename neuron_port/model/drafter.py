"""Gemma-4 drafters as models: made with random weights (tests, ``--tiny``) or loaded from a directory.

The drafter is transformers' own ``Gemma4AssistantForCausalLM`` (or the 12B's ``Gemma4UnifiedAssistantForCausalLM``),
checked against its target (:func:`~neuron_port.families.gemma4_drafter.check_drafter`) before anything runs it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from torch import nn

from neuron_port.errors import DrafterError
from neuron_port.families import family_for
from neuron_port.families.gemma4_drafter import (
    check_drafter,
    drafter_classes,
    seed_drafter_buffers,
    tiny_drafter_config,
    use_eager_attention,
)


def build_drafter(target_config: Any, seed: int = 0, ordered: bool = False) -> nn.Module:
    """A tiny drafter for ``target_config`` with random weights drawn from ``seed`` (its layer scalars and, with
    ``ordered``, its centroid head's token order drawn too: transformers initialises them to defaults)."""
    family = family_for(target_config.model_type)
    config = tiny_drafter_config(target_config, family.config_to_dict(target_config), ordered=ordered)
    use_eager_attention(config)
    torch.manual_seed(seed)
    _, model_class = drafter_classes(config.model_type)
    drafter = model_class(config)
    seed_drafter_buffers(drafter, torch.Generator().manual_seed(seed + 1))
    check_drafter(target_config, config)
    return drafter.eval()


def load_drafter(directory: str | Path, target_config: Any) -> nn.Module:
    """The drafter in ``directory`` (``config.json`` and safetensors, as transformers saves it), checked against
    ``target_config``."""
    where = Path(directory)
    config_file = where / "config.json"
    if not config_file.is_file():
        raise DrafterError(f"a drafter directory holds a config.json; {where} has none")
    kind = json.loads(config_file.read_text()).get("model_type")
    config_class, model_class = drafter_classes(str(kind))
    config = config_class.from_pretrained(where)
    check_drafter(target_config, config)
    use_eager_attention(config)
    return model_class.from_pretrained(where, config=config, dtype=torch.float32).eval()


__all__ = ["build_drafter", "load_drafter"]
