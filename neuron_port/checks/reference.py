"""The oracle: a model directory loaded by Hugging Face itself, never by this library.

Every check of a port against a real checkpoint (``port --check``, ``generate --check``, the
fresh-process check, ``doctor``) compares with the model :func:`hf_reference_model` returns:
transformers' own ``from_pretrained`` of the directory, eager attention, on CPU. The library's
loader (:func:`neuron_port.model.loading.load_model_dir`) is checked against it
(:mod:`neuron_port.checks.loader_check`), so a loader bug shows as a loader finding instead of being
shared by the port and its oracle.
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from neuron_port.artifacts.manifest import weights_fingerprint
from neuron_port.artifacts.record import Manifest
from neuron_port.errors import ArtifactError, ConfigError
from neuron_port.families import family_for
from neuron_port.model.configs import load_config_dict
from neuron_port.model.loading import cast_state, checkpoint_state
from neuron_port.model.quant import apply_quant, fp32_keys
from neuron_port.model.source import Source


def _refuse_missing(missing: list[str], directory: Path, cls: type) -> None:
    """transformers initialises what a checkpoint lacks at random and only logs it: an oracle with
    random tensors would agree with nothing, or with a port that shares the gap. Refuse instead."""
    if missing:
        raise ConfigError(f"transformers' {cls.__name__}.from_pretrained of {directory} found no checkpoint tensor for "
                          f"{len(missing)} parameters (e.g. {sorted(missing)[:3]}): refusing a reference with random weights")


def hf_reference_model(model_dir: str | Path, dtype: torch.dtype = torch.float32) -> nn.Module:
    """``from_pretrained`` of ``model_dir`` with the family's CausalLM class (eager attention, ``dtype``).

    A multimodal checkpoint is loaded whole by transformers (the class its config names), and its
    text tensors move, as loaded, into the text CausalLM that transformers builds from the text
    config (the family adapter names which keys are text). A checkpoint that leaves any parameter
    to random initialisation is refused."""
    import json

    import transformers

    directory = Path(model_dir)
    text = load_config_dict(directory)
    family = family_for(text["model_type"])
    cls = family.causal_lm_class(text["model_type"])
    raw = json.loads((directory / "config.json").read_text())
    try:
        if raw.get("model_type") == text["model_type"]:
            model, info = cls.from_pretrained(str(directory), dtype=dtype, attn_implementation="eager",
                                              output_loading_info=True)
            _refuse_missing(info["missing_keys"], directory, cls)
        else:
            wrapper_cls = getattr(transformers, (raw.get("architectures") or [""])[0], None)
            if wrapper_cls is None:
                raise ConfigError(f"{directory}/config.json names no transformers class in 'architectures' "
                                  f"(found {raw.get('architectures')!r}) for its {raw.get('model_type')} checkpoint")
            wrapper, info = wrapper_cls.from_pretrained(str(directory), dtype=dtype, attn_implementation="eager",
                                                        output_loading_info=True)
            _refuse_missing(info["missing_keys"], directory, wrapper_cls)
            state = {new: v for k, v in wrapper.state_dict().items() if (new := family.normalize_key(k)) is not None}
            del wrapper
            config = family.make_config(text)
            family.set_attention_implementation(config, "eager")
            model = cls(config).to(dtype)
            missing, _ = model.load_state_dict(state, strict=False)
            model.tie_weights()  # a tied head is the word embedding: not missing
            tied_head = family.lm_head_key() if family.tied_embeddings(config) else None
            params = dict(model.named_parameters())
            _refuse_missing([m for m in missing if m in params and m != tied_head], directory, cls)
    except ConfigError:
        raise
    except (OSError, ValueError) as exc:
        raise ConfigError(f"transformers could not load {directory} as {cls.__name__}: {exc}") from None
    family.set_attention_implementation(model.config, "eager")
    return model.eval()


def reference_for_source(name: str | Path, tiny: bool = False, seed: int = 0, quant: str = "none") -> nn.Module:
    """The float32 CPU reference of a model source: ``from_pretrained`` of a directory, or the
    shipped config's Hugging Face class with the seeded random weights (built by transformers'
    own constructor: no loading involved). ``quant="int8"`` (or ``"int8+head"``): that model
    quantized the same way (:func:`neuron_port.model.quant.apply_quant`), the oracle of an int8 port, which must
    compute what it computes (the quantization error is measured against the float32 one)."""
    from neuron_port.model.configs import load_config
    from neuron_port.model.loading import build_model

    if Path(name).is_dir():
        model = hf_reference_model(name)
    else:
        model = build_model(load_config(str(name), tiny=tiny), seed=seed)
    return apply_quant(model, quant)


def reference_model(manifest: Manifest) -> nn.Module:
    """Rebuild the float32 CPU reference from the artifact's recorded source (a directory through
    Hugging Face's own ``from_pretrained``, never this library's loader; quantized as the source
    records), proven to be the same
    weights: its state cast to the artifact's dtype has the manifest's weights fingerprint."""
    model = _source_model(manifest.source, manifest.source.quant)
    found = weights_fingerprint(cast_state(checkpoint_state(model, clone=False), manifest.dtype, keep=fp32_keys(model)))
    if found != manifest.weights_fingerprint:
        raise ArtifactError(
            f"the CPU reference rebuilt from {manifest.source.to_json()} is not the artifact's checkpoint: weights "
            f"fingerprint expected {manifest.weights_fingerprint}, found {found}; refusing to compare against the "
            f"wrong oracle"
        )
    return model


def unquantized_reference_model(manifest: Manifest) -> nn.Module:
    """The float32 model a quantized artifact's weights were quantized from (its recorded source, not
    quantized): what the ``quant-drift`` check measures the quantization against. Call it after
    :func:`reference_model`, which proves the quantized weights are the artifact's: quantizing is
    deterministic, so this is the model they came from."""
    return _source_model(manifest.source, "none")


def _source_model(source: Source, quant: str) -> nn.Module:
    if source.kind == "shipped":
        return reference_for_source(source.name, tiny=source.tiny, seed=source.seed, quant=quant)
    if not Path(source.path).is_dir():
        raise ArtifactError(f"the reference checkpoint {source.path} recorded in the manifest is not available here")
    return reference_for_source(source.path, quant=quant)


__all__ = ["hf_reference_model", "reference_for_source", "reference_model"]
