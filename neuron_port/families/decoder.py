"""The common shape of a Hugging Face decoder-only CausalLM, as one adapter base class.

Most decoder families in ``transformers`` share one module tree: ``model.model.layers[i]``
with ``self_attn.{q,k,v,o}_proj`` and ``mlp.{gate,up,down}_proj``, ``model.model.embed_tokens``,
an ``lm_head`` (tied or not), and a config with ``num_attention_heads`` /
``num_key_value_heads`` / ``head_dim``. :class:`DecoderFamily` answers every question the library
asks in those terms; a family adapter subclasses it and overrides only where its model
differs (Gemma-4 overrides a lot; Llama and Qwen3 almost nothing).

Outside ``neuron_port.families`` no module names a Hugging Face attribute: projections are
reached by *role* (``"q"``, ``"k"``, ``"v"``, ``"o"`` for attention; ``"gate"``, ``"up"``,
``"down"`` for the MLP), checkpoint keys come from the ``*_key`` methods, and config facts
from the per-layer readers.

The answers come in three parts, each a class of its own module: :class:`~neuron_port.families.config_facts.ConfigFacts`
(what the config says), :class:`~neuron_port.families.model_modules.ModelModules` (where the modules sit) and
:class:`~neuron_port.families.model_files.ModelFiles` (chat format, buffers, checkpoint keys).
"""

from __future__ import annotations

from neuron_port.families.config_facts import ConfigFacts
from neuron_port.families.model_files import ModelFiles
from neuron_port.families.model_modules import ModelModules


class DecoderFamily(ConfigFacts, ModelModules, ModelFiles):
    """Adapter for the common Hugging Face decoder layout. Subclasses set the class attributes (``name``,
    ``model_types``, ``text_types``, ``config_classes``, ``causal_lm_classes``) and override what differs."""


__all__ = ["DecoderFamily"]
