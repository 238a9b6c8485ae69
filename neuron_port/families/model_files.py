"""What a decoder family says about a model's files: one of the three parts of
:class:`~neuron_port.families.decoder.DecoderFamily`.

Its own chat format (for tokenizer files without a template), the per-layer buffers a checkpoint must carry,
and the keys of its checkpoint tensors.
"""

from __future__ import annotations

import torch
from torch import nn


class ModelFiles:
    """The file questions of a family adapter (``_ATTN``: the attention projections' attribute names, set
    by :class:`~neuron_port.families.model_modules.ModelModules`)."""

    _ATTN: dict[str, str]

    # ---- chat format ----------------------------------------------------------------------------
    # Token strings that end an assistant turn (resolved to ids through the model's tokenizer).
    chat_stop_tokens: tuple[str, ...] = ()

    def chat_prompt(self, messages: list[dict[str, str]]) -> str | None:
        """The family's own chat format, for tokenizer files that carry no ``chat_template``:
        ``messages`` (``role``, ``content``) rendered up to the assistant's turn, without BOS.
        None when the family has no default format."""
        return None

    # ---- per-layer buffers --------------------------------------------------------------------
    def layer_buffer_names(self) -> tuple[str, ...]:
        """Per-layer persistent buffers whose loss silently breaks the model (none by default)."""
        return ()

    def buffer_defaults(self) -> dict[str, float]:
        """Value a fresh module gives each of :meth:`layer_buffer_names` (what a params-only load leaves)."""
        return {}

    def seed_layer_buffers(self, model: nn.Module, generator: torch.Generator) -> None:
        """Give random-weight models non-default buffer values (so a reset is visible)."""

    # ---- checkpoints --------------------------------------------------------------------------
    def normalize_key(self, key: str) -> str | None:
        """A checkpoint key as the text CausalLM names it; None for tensors it does not use."""
        return key

    def word_embedding_key(self) -> str:
        return "model.embed_tokens.weight"

    def per_layer_embedding_key(self) -> str | None:
        return None

    def lm_head_key(self) -> str:
        return "lm_head.weight"

    def projection_key(self, index: int, role: str) -> str:
        """Checkpoint key of layer ``index``'s attention projection weight for ``role``."""
        return f"model.layers.{index}.self_attn.{self._ATTN[role]}.weight"

    def layer_buffer_key(self, index: int, name: str) -> str:
        return f"model.layers.{index}.{name}"


__all__ = ["ModelFiles"]
