"""Layer ``generation``: turning a port's logits into text.

Host softcap and greedy pick (``logits``), sampling, prompts and chat formats, one opened model (its
config, family, tokenizer, chat format and stop ids read once: ``opened``), the one request
and result types (``request``), one row's decoding state (``request_state``), the one scheduler
(continuous batching over slots, ``slots``; a whole request run through it, ``offline``) and the one
``generate(source, request)`` for a model, a port or an artifact (``generate``).
It sits above ``artifacts`` because ``generate`` reads them.
"""

from __future__ import annotations

from neuron_port.generation.generate import generate
from neuron_port.generation.offline import run_request
from neuron_port.generation.opened import OpenedModel
from neuron_port.generation.request import GenerationParams, GenerationRequest, GenerationResult
from neuron_port.generation.request_state import PromptScores, TokenEvent
from neuron_port.generation.slots import SlotBatch

__all__ = ["generate", "run_request", "OpenedModel", "SlotBatch", "GenerationRequest", "GenerationParams", "GenerationResult",
           "TokenEvent", "PromptScores"]
