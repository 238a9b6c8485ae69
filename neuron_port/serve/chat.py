"""The server's chat formats: :mod:`neuron_port.chat`, which the commands share (``--chat``)."""

from __future__ import annotations

from neuron_port.chat import ChatFormat, chat_format, tokenizer_config
from neuron_port.families.gemma4 import gemma_chat_prompt  # deprecated here, kept for one release

__all__ = ["tokenizer_config", "ChatFormat", "chat_format", "gemma_chat_prompt"]
