"""Weight-only int8, symmetric per output channel: the scheme NxD Inference ships for Inf2.

NeuronCore-v2 has no int8 matmul, so int8 saves bytes, not arithmetic: the weight is stored as
int8 with one fp32 scale per output channel, and the graph casts it to the activation dtype,
multiplies, and scales the output in fp32 (neuronx-distributed's ``quantization/dequantize.py``
order). Decode reads every weight once per token, so a projection read at one byte instead of two
halves its share of the step.

* :func:`quantize_rows`: ``weight [out, in]`` -> ``(q int8 [out, in], scale fp32 [out])`` with
  ``scale = max|row| / 127`` (1 for an all-zero row) and ``q = round(weight / scale)``, so every
  element is within ``scale / 2`` of ``q * scale``;
* :class:`Int8Linear`: the projection that holds them;
* :func:`quantize_model`: every decoder layer's attention and MLP projections replaced by
  :class:`Int8Linear` (the LM head and the host tables stay as they are);
* :func:`quantize_head`: the LM head too (``--quant-head``), untied from the word table when the
  model ties them: the host keeps the float table it gathers rows from, the device reads an int8 head;
* :func:`apply_quant` / :func:`quant_of`: a scheme applied to a model, and read back from one
  (``"none"``, ``"int8"``, or ``"int8+head"`` for ``--quant int8 --quant-head``), so a scheme is
  chosen once and travels with the model.

The scale stays fp32 whatever the model's dtype: :meth:`Int8Linear._apply` keeps it through
``.to(dtype)``, and :data:`FP32_BUFFERS` names it for the loader's casts.
"""

from __future__ import annotations

import torch
from torch import nn

from neuron_port.errors import AdapterError, ConfigError

QMAX = 127
QUANT_SCHEMES = ("none", "int8", "int8+head")
HEAD_SCHEMES = ("int8+head",)
"""Schemes that store the LM head in int8 as well as the decoder projections."""
FP32_BUFFERS = ("scale",)
"""Buffers of an :class:`Int8Linear` that a dtype cast of the model leaves in fp32."""


def quantize_rows(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``weight [out, in]`` -> ``(q int8 [out, in], scale fp32 [out])``, symmetric per output channel."""
    if weight.dim() != 2:
        raise ValueError(f"a projection weight is [out, in], found shape {tuple(weight.shape)}")
    w = weight.detach().float()
    peak = w.abs().amax(dim=1)
    scale = torch.where(peak > 0, peak / QMAX, torch.ones_like(peak))
    q = torch.clamp(torch.round(w / scale[:, None]), -QMAX, QMAX).to(torch.int8)
    return q, scale


class Int8Linear(nn.Module):
    """``y = (x @ q.to(x.dtype).T) * scale + bias``: int8 weight ``q [out, in]``, fp32 ``scale [out]``.

    x: [..., in] -> y: [..., out] in x's dtype. The weight and scale are buffers (not parameters):
    nothing trains them, and a checkpoint names them ``weight`` and ``scale`` as NxD's does.
    """

    def __init__(self, q: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor | None = None):
        super().__init__()
        if q.dtype != torch.int8 or scale.shape != (q.shape[0],):
            raise ValueError(f"expected an int8 weight [out, in] and a scale [out], found {q.dtype} "
                             f"{tuple(q.shape)} and {tuple(scale.shape)}")
        self.in_features, self.out_features = q.shape[1], q.shape[0]
        self.register_buffer("weight", q)
        self.register_buffer("scale", scale.float())
        self.bias = None if bias is None else nn.Parameter(bias.detach().clone(), requires_grad=False)

    @classmethod
    def from_linear(cls, linear: nn.Linear) -> Int8Linear:
        q, scale = quantize_rows(linear.weight)
        return cls(q, scale, linear.bias)

    def dequantized(self) -> torch.Tensor:
        """``q * scale`` in fp32: the weight this projection computes with, [out, in]."""
        return self.weight.float() * self.scale[:, None]

    def _apply(self, fn, recurse: bool = True):
        """Moves follow the model; dtype casts leave the int8 weight (integer) and the fp32 scale alone."""
        scale = self._buffers["scale"]
        out = super()._apply(fn, recurse)
        moved = self._buffers["scale"]
        if moved.dtype != torch.float32:
            self._buffers["scale"] = scale.to(moved.device)
        return out

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, int8 weight, fp32 scale"

    def scaled_matmul(self, x: torch.Tensor) -> torch.Tensor:
        """``(x @ q.to(x.dtype)^T) * scale`` (the scaling in fp32), in x's dtype, without the bias."""
        y = torch.matmul(x, self.weight.to(x.dtype).t())
        return (y.float() * self.scale).to(x.dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.scaled_matmul(x)
        return y if self.bias is None else y + self.bias.to(x.dtype)


def quantize_model(model: nn.Module) -> int:
    """Replace every decoder layer's attention and MLP projection (an ``nn.Linear``) with an
    :class:`Int8Linear`, in place; returns how many were replaced. Families whose projections are
    fused (Phi-3's ``qkv_proj``) are refused: their roles are views, not modules."""
    from neuron_port.families import family_of
    from neuron_port.model.layout import describe

    layout = describe(model)
    family = layout.family
    replaced = 0
    for spec, layer in zip(layout.layers, family.decoder_layers(model), strict=True):
        attention, mlp = family.layer_projections(layer, spec.index)
        targets = {id(m) for m in [*attention.values(), *mlp.values()] if m is not None}
        if any(not isinstance(m, nn.Linear) for m in [*attention.values(), *mlp.values()] if m is not None):
            raise AdapterError(f"{family_of(model).name}: fused projections cannot be quantized one role at a time yet "
                               "(--quant int8 takes families with one module per projection)")
        for parent in layer.modules():
            for name, child in list(parent.named_children()):
                if id(child) in targets:
                    setattr(parent, name, Int8Linear.from_linear(child))
                    replaced += 1
    return replaced


def quantize_head(model: nn.Module) -> Int8Linear:
    """Replace the CausalLM's LM head with an :class:`Int8Linear` of its weight, in place, and return it.

    A head tied to the word table is untied first: the word table stays float (the host gathers its
    rows), the head becomes its own int8 matrix, and the config no longer ties them
    (:meth:`~neuron_port.families.decoder.DecoderFamily.untie_embeddings`), so neither a save nor
    transformers' ``tie_weights`` ties them again. The projections must be int8 already
    (:func:`quantize_model`): ``int8+head`` is a scheme, a float model with an int8 head is not. Refused,
    with nothing changed, where the head is not a plain projection that is the CausalLM's own child, or
    where the family's adapter changes the head's weight
    (:meth:`~neuron_port.families.decoder.DecoderFamily.lm_head_weight` overridden, Granite's folded
    scale): quantizing the module would drop what the adapter adds."""
    if not any(isinstance(m, Int8Linear) for m in model.modules()):
        raise ValueError("--quant-head quantizes the LM head beside int8 projections: quantize the projections "
                         "first (quantize_model, or apply_quant(model, 'int8+head'))")
    family, name, head = _head_slot(model)
    family.untie_embeddings(model)
    quantized = Int8Linear.from_linear(head)
    setattr(model, name, quantized)
    return quantized


def _head_slot(model: nn.Module) -> tuple:
    """(family, attribute name of the head on ``model``, the head) when ``--quant-head`` can replace the
    head; the reason it cannot otherwise (see :func:`quantize_head`). Changes nothing."""
    from neuron_port.families import family_of
    from neuron_port.families.decoder import DecoderFamily

    family = family_of(model)
    head = family.head_module(model)
    if not isinstance(head, nn.Linear):
        raise AdapterError(f"{family.name}: --quant-head needs an nn.Linear LM head, found "
                           f"{type(head).__name__ if head is not None else 'none'}")
    if type(family).lm_head_weight is not DecoderFamily.lm_head_weight:
        raise AdapterError(f"{family.name}: its adapter changes the LM head's weight (lm_head_weight), so --quant-head "
                           "would drop that change; quantize the projections only (--quant int8)")
    for name, child in model.named_children():
        if child is head:
            return family, name, head
    raise AdapterError(f"{family.name}: the LM head is not a direct child of {type(model).__name__}; --quant-head "
                       "cannot replace it")


def fp32_keys(model: nn.Module) -> frozenset[str]:
    """State-dict keys that stay fp32 whatever the model's dtype: every int8 projection's scales."""
    return frozenset(f"{name}.{buf}" for name, m in model.named_modules() if isinstance(m, Int8Linear)
                     for buf in FP32_BUFFERS)


def check_scheme(scheme: str) -> str:
    """``scheme`` if it is one of :data:`QUANT_SCHEMES`; a clear error otherwise."""
    if scheme not in QUANT_SCHEMES:
        raise ConfigError(f"quant must be one of {', '.join(QUANT_SCHEMES)}, found {scheme!r}")
    return scheme


def apply_quant(model: nn.Module, scheme: str) -> nn.Module:
    """``model`` with ``scheme`` applied in place (``"none"``: unchanged; ``"int8"``: :func:`quantize_model`;
    ``"int8+head"``: that and :func:`quantize_head`). A model already quantized is refused: quantizing
    twice would requantize the dequantized rows."""
    if check_scheme(scheme) == "none":
        return model
    if quant_of(model) != "none":
        raise ValueError(f"the model is already quantized ({quant_of(model)}); apply --quant once")
    if scheme in HEAD_SCHEMES:
        _head_slot(model)  # refused before any projection changes
    quantize_model(model)
    if scheme in HEAD_SCHEMES:
        quantize_head(model)
    return model


def quant_of(model: nn.Module) -> str:
    """The scheme ``model``'s weights are stored in: ``"int8"`` when any projection is an
    :class:`Int8Linear`, ``"int8+head"`` when its LM head is one too, ``"none"`` otherwise."""
    from neuron_port.families import family_of

    head = family_of(model).head_module(model)
    if not any(isinstance(m, Int8Linear) and m is not head for m in model.modules()):
        return "none"
    return "int8+head" if isinstance(head, Int8Linear) else "int8"


def scheme_from_flags(quant: str, quant_head: bool) -> str:
    """The scheme of the command-line flags ``--quant`` and ``--quant-head`` (which needs ``--quant int8``)."""
    check_scheme(quant)
    if not quant_head:
        return quant
    if quant != "int8":
        raise ConfigError(f"--quant-head stores the LM head in int8 beside the projections: it needs --quant int8, "
                          f"found --quant {quant}")
    return "int8+head"


def scheme_flags(scheme: str) -> str:
    """The command-line flags that name ``scheme`` (``"int8+head"``: ``--quant int8 --quant-head``)."""
    return "--quant int8 --quant-head" if check_scheme(scheme) in HEAD_SCHEMES else f"--quant {scheme}"


__all__ = ["QMAX", "QUANT_SCHEMES", "HEAD_SCHEMES", "FP32_BUFFERS", "quantize_rows", "Int8Linear", "quantize_model",
           "quantize_head", "fp32_keys", "check_scheme", "apply_quant", "quant_of", "scheme_from_flags", "scheme_flags"]
