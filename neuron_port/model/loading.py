"""Build and load the real Hugging Face model classes (random weights or a local directory).

Nothing here reaches a model hub: random-weight models are built from a config and a seed,
and real ones are read from a local directory (``config.json`` plus ``*.safetensors``).
Eager attention is forced on the config (and on a wrapper's text part) so the CPU
reference never takes a fused path.
"""

from __future__ import annotations

import json
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from safetensors.torch import save_file
from torch import nn

from neuron_port.errors import ConfigError
from neuron_port.families import family_for, family_of
from neuron_port.model.configs import config_to_dict, load_config
from neuron_port.model.quant import FP32_BUFFERS, Int8Linear, apply_quant, check_scheme, fp32_keys, quant_of
from neuron_port.model.source import Source
from neuron_port.progress import progress

QUANT_KEY = "neuron_port_quant"
"""The ``config.json`` field naming a saved model's weight scheme (absent: ``"none"``)."""

DTYPE_OPTIONS: dict[str, torch.dtype] = {"fp32": torch.float32, "bf16": torch.bfloat16}
"""``--dtype`` names -> torch dtypes: float32 (the CPU reference's) and bfloat16 (what Inferentia2 runs)."""


def parse_dtype(name: str | torch.dtype) -> torch.dtype:
    """``"fp32"``/``"bf16"`` (or ``"float32"``, ``"torch.bfloat16"``, a torch dtype) -> the torch dtype."""
    if isinstance(name, torch.dtype):
        return name
    text = str(name).removeprefix("torch.")
    aliases = {"float32": "fp32", "bfloat16": "bf16"}
    key = aliases.get(text, text)
    if key not in DTYPE_OPTIONS:
        raise ConfigError(f"dtype must be one of {', '.join(DTYPE_OPTIONS)}, found {name!r}")
    return DTYPE_OPTIONS[key]


@contextmanager
def _default_dtype(dtype: torch.dtype):
    """Build modules in ``dtype``, as ``from_pretrained(dtype=...)`` does (tables a module computes
    in an explicit dtype, such as float32 RoPE frequencies, keep it)."""
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(previous)


@torch.no_grad()
def cast_weights(model: nn.Module, dtype: torch.dtype) -> nn.Module:
    """Parameters and persistent floating buffers in ``dtype``, in place (tied parameters stay tied);
    non-persistent tables (RoPE frequencies) keep their precision, as transformers keeps them, and an
    int8 projection's scales stay fp32."""
    for module in model.modules():
        for param in module._parameters.values():
            if param is not None and param.is_floating_point() and param.dtype != dtype:
                param.data = param.data.to(dtype)
        keep = FP32_BUFFERS if isinstance(module, Int8Linear) else ()
        for name, buf in list(module._buffers.items()):
            if (buf is not None and buf.is_floating_point() and name not in module._non_persistent_buffers_set
                    and name not in keep):
                module._buffers[name] = buf.to(dtype)
    return model


def cast_state(state: dict[str, torch.Tensor], dtype: torch.dtype,
               keep: frozenset[str] = frozenset()) -> dict[str, torch.Tensor]:
    """Floating tensors of ``state`` in ``dtype`` (integer ones and the keys in ``keep`` untouched), as
    the loader casts a checkpoint."""
    return {k: v.to(dtype) if v.is_floating_point() and k not in keep else v for k, v in state.items()}


def force_eager(config: Any, implementation: str = "eager") -> None:
    """Set the attention implementation on a config and on its text part."""
    family_for(config.model_type).set_attention_implementation(config, implementation)


def build_model(config: Any, seed: int = 0, dtype: torch.dtype = torch.float32) -> nn.Module:
    """A CausalLM with random weights drawn from ``seed``.

    Per-layer buffers the family declares (Gemma-4's per-layer scalars) get seeded non-default
    values so that a parameter-only load (which resets them) visibly changes the output, and so do
    the projections' biases (Qwen2's q/k/v), which Hugging Face initialises to zero: a port that
    dropped or misplaced a zero bias would compute the same logits.
    """
    family = family_for(config.model_type)
    force_eager(config)
    torch.manual_seed(seed)
    model = family.causal_lm_class(config.model_type)(config)
    family.seed_layer_buffers(model, torch.Generator().manual_seed(seed + 1))
    _seed_biases(model, float(getattr(config, "initializer_range", 0.02)), torch.Generator().manual_seed(seed + 2))
    # Drawn in float32 whatever ``dtype`` is, so a bf16 model is exactly the cast of the float32 one.
    return cast_weights(model, dtype).eval()


@torch.no_grad()
def _seed_biases(model: nn.Module, std: float, generator: torch.Generator) -> None:
    """Every linear layer's bias drawn from N(0, std), in module order (the weights' own spread)."""
    for module in model.modules():
        if isinstance(module, nn.Linear) and module.bias is not None:
            module.bias.copy_(torch.randn(module.bias.shape, generator=generator) * std)


def model_from_name(name: str, tiny: bool = False, seed: int = 0, dtype: torch.dtype = torch.float32,
                    quant: str = "none", config: Any = None) -> nn.Module:
    """Random weights for a shipped name, or real weights for a local model directory; ``quant``
    (:data:`~neuron_port.model.quant.QUANT_SCHEMES`) quantizes the float32 weights, then the rest is cast
    to ``dtype``, so an int8 projection is the same in every dtype (the quantization of the float32
    weight, as the reference's is). ``config``: the text config of ``name`` (with ``tiny``) when the
    caller has read it already."""
    check_scheme(quant)
    load_dtype = torch.float32 if quant != "none" else dtype
    path = Path(name)
    if path.is_dir() and any(path.glob("*.safetensors")):
        if tiny:
            raise ConfigError(f"--tiny applies to shipped configs and config.json files, not to the model directory "
                              f"{name} (its weights are real: drop --tiny, or give its config.json)")
        model = load_model_dir(path, dtype=load_dtype)
    else:
        model = build_model(config if config is not None else load_config(name, tiny=tiny), seed=seed, dtype=load_dtype)
    if quant == "none":
        return model
    return cast_weights(apply_quant(model, quant), dtype)


def load_source(name: str, tiny: bool = False, seed: int = 0, dtype: torch.dtype = torch.float32,
                quant: str = "none") -> tuple[nn.Module, Source]:
    """The model for ``name`` and the record of where its weights came from
    (:class:`~neuron_port.model.source.Source`: it goes into an artifact's manifest, so a later check can
    rebuild the same CPU reference)."""
    path = Path(name)
    if path.is_dir():
        return model_from_name(name, dtype=dtype, quant=quant), Source.directory(str(path.resolve()), quant)
    return model_from_name(name, tiny=tiny, seed=seed, dtype=dtype, quant=quant), Source.shipped(name, tiny, seed, quant)


def read_checkpoint(model_dir: str | Path, family=None) -> dict[str, torch.Tensor]:
    """Every text tensor of a directory's safetensors files, keys as the text CausalLM names them.

    ``family`` defaults to the adapter of the directory's ``config.json``.
    """
    if family is None:
        family = family_for(load_config(model_dir).model_type)
    files = sorted(Path(model_dir).glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no *.safetensors files in {model_dir}")
    state: dict[str, torch.Tensor] = {}
    for path in progress(files, desc="reading weights", unit="file"):
        with safe_open(str(path), framework="pt") as fh:
            for key in fh.keys():
                norm = family.normalize_key(key) if family is not None else key
                if norm is not None:
                    state[norm] = fh.get_tensor(key)
    return state


def nonpersistent_buffer_owners(model: nn.Module) -> dict[str, nn.Module]:
    """Modules that own a non-persistent buffer (RoPE tables, embedding scales), by module name.

    No checkpoint holds these buffers, so a model built on the meta device and ``to_empty``-ed
    has uninitialised memory in them until something computes them again."""
    persistent = set(model.state_dict())
    owners: dict[str, nn.Module] = {}
    for name, module in model.named_modules():
        for attr, buf in module.named_buffers(recurse=False):
            if buf is not None and (f"{name}.{attr}" if name else attr) not in persistent:
                owners[name] = module
    return owners


def _buffers_on_cpu(model: nn.Module) -> dict[str, nn.Module]:
    """Give every buffer of a meta-device model CPU memory (parameters stay on meta); returns the
    modules that own a buffer, by name."""
    owners = {}
    for name, module in model.named_modules():
        for attr, buf in list(module._buffers.items()):
            if buf is not None and buf.is_meta:
                module._buffers[attr] = torch.empty_like(buf, device="cpu")
                owners[name] = module
    return owners


@torch.no_grad()
def init_nonpersistent_buffers(model: nn.Module, config: Any, owners: dict[str, nn.Module] | None = None) -> list[str]:
    """Compute buffers again, for any family: transformers' own rule.

    ``from_pretrained`` builds on the meta device too and then runs the model's ``_init_weights``
    on each module whose tensors were not loaded; this does the same for each module in ``owners``
    (default: those owning a non-persistent buffer; their parameters are the checkpoint's
    afterwards), then lets the family adapter finish (:meth:`DecoderFamily.reinit_nonpersistent`).
    Returns the modules' names."""
    owners = nonpersistent_buffer_owners(model) if owners is None else owners
    init = getattr(model, "_init_weights", None)
    if init is not None:
        for module in owners.values():
            init(module)
    family_of(model).reinit_nonpersistent(model, config)
    return sorted(owners)


def load_model_dir(model_dir: str | Path, dtype: torch.dtype = torch.float32) -> nn.Module:
    """A CausalLM from a local directory, built without random initialisation or a second copy of
    the weights: parameters on the meta device, every buffer computed as transformers computes it,
    then every parameter and persistent buffer taken from the checkpoint as read (``assign``).
    :mod:`neuron_port.checks.loader_check` proves the result equals ``from_pretrained``'s."""
    config = load_config(model_dir)
    family = family_for(config.model_type)
    force_eager(config)
    causal_lm = family.causal_lm_class(config.model_type)  # imported outside the device mode (torch 2.8)
    with torch.device("meta"), _default_dtype(dtype):
        model = causal_lm(config)
    init_nonpersistent_buffers(model, config, owners=_buffers_on_cpu(model))
    apply_quant(model, getattr(config, QUANT_KEY, "none"))  # an int8 directory: Int8Linear shells, on meta
    state = read_checkpoint(model_dir, family)
    head_key = family.lm_head_key()
    if head_key not in state and family.tied_embeddings(config) and family.word_embedding_key() in state:
        state[head_key] = state[family.word_embedding_key()]
    persistent = set(model.state_dict())
    model.load_state_dict(cast_state({k: v for k, v in state.items() if k in persistent}, dtype, keep=fp32_keys(model)),
                          strict=False, assign=True)
    model.tie_weights()
    missing = sorted(n for n, t in [*model.named_parameters(), *model.named_buffers()] if t.is_meta)
    if missing:  # buffers too: an int8 projection's weight and scale are buffers
        raise KeyError(f"{model_dir}: checkpoint lacks tensors {missing[:5]}")
    return model.eval()


def checkpoint_state(model: nn.Module, clone: bool = True) -> dict[str, torch.Tensor]:
    """The model's state dict as a checkpoint holds it: a tied LM head is stored once (as the
    word embedding), an untied one kept."""
    family = family_of(model)
    tied = family.tied_embeddings(family.text_config_of(model))
    head = family.lm_head_key()
    return {k: (v.detach().contiguous().clone() if clone else v.detach().contiguous())
            for k, v in model.state_dict().items() if not (tied and k == head)}


def save_model_dir(model: nn.Module, out_dir: str | Path) -> Path:
    """Write ``config.json`` and ``model.safetensors`` (buffers included) for a text CausalLM; an int8
    model's config names its scheme (:data:`QUANT_KEY`) and its checkpoint holds int8 weights and fp32 scales."""
    family = family_of(model)
    config = family.text_config_of(model)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    state = checkpoint_state(model)
    save_file(state, str(out / "model.safetensors"))
    fields = config_to_dict(config)
    if quant_of(model) != "none":
        fields[QUANT_KEY] = quant_of(model)  # the loader rebuilds int8 projections from it
    (out / "config.json").write_text(json.dumps(fields, indent=2))
    return out


__all__ = [
    "QUANT_KEY",
    "DTYPE_OPTIONS",
    "parse_dtype",
    "cast_weights",
    "cast_state",
    "force_eager",
    "nonpersistent_buffer_owners",
    "init_nonpersistent_buffers",
    "build_model",
    "checkpoint_state",
    "model_from_name",
    "load_source",
    "read_checkpoint",
    "load_model_dir",
    "save_model_dir",
]
