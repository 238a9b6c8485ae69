"""Helium (Kyutai): the common decoder shape, whose text model takes one 4-D mask."""

from neuron_port.families import DecoderFamily


class HeliumFamily(DecoderFamily):
    name = "helium"
    text_types = model_types = ("helium",)
    config_classes = {"helium": ("transformers", "HeliumConfig")}
    causal_lm_classes = {"helium": ("transformers", "HeliumForCausalLM")}
    # No tiny variant: describe, plan and lint must still work (lint says what it could not trace).

    def attention_mask_argument(self, masks):
        return masks["full"]
