"""Word and per-layer embeddings gathered on the host and fed to the graphs as activations.

The tables are ``vocab x hidden`` (plus ``vocab x layers*per_layer`` where a family has per-layer
embeddings, PLE, as Gemma-4 does): materialised on a NeuronCore they overflow the compiler and the core's
memory, so they stay on the host. The device graphs receive the gathered, scaled rows.
The slim loader reads only these tensors from safetensors files.
"""

from __future__ import annotations

from pathlib import Path

import torch

from neuron_port.families import family_for, family_of
from neuron_port.model.tensorfile import read_header, read_tensors


def _scale(value: float | None, dtype: torch.dtype) -> torch.Tensor | None:
    # Hugging Face keeps a scale as a float32 buffer, then casts it to the table dtype.
    return None if value is None else torch.tensor(value, dtype=torch.float32).to(dtype)


class HostEmbeddings:
    """Host-side gathers matching Hugging Face's (possibly scaled) embeddings exactly.

    word:  [vocab, hidden], rows times ``word_scale`` (Gemma: sqrt(hidden); Llama: none)
    ple:   [vocab_ple, layers * per_layer] or None, rows times ``ple_scale``
    """

    def __init__(self, word: torch.Tensor, ple: torch.Tensor | None, num_layers: int, per_layer: int,
                 word_scale: float | None = None, ple_scale: float | None = None):
        self.word = word
        self.ple = ple
        self.num_layers = num_layers
        self.per_layer = per_layer
        self.hidden = word.shape[1]
        self.word_scale = _scale(word_scale, word.dtype)
        self.ple_scale = _scale(ple_scale, ple.dtype) if ple is not None else None

    @classmethod
    def for_config(cls, config, word: torch.Tensor, ple: torch.Tensor | None) -> HostEmbeddings:
        """Tables plus the scales and sizes the config's family prescribes."""
        family = family_for(config.model_type)
        word_scale, ple_scale = family.embedding_scales(config)
        return cls(word, ple, family.num_layers(config), family.per_layer_input_size(config), word_scale, ple_scale)

    @classmethod
    def from_model(cls, model: torch.nn.Module) -> HostEmbeddings:
        family = family_of(model)
        ple = family.per_layer_embedding(model)
        return cls.for_config(family.text_config_of(model), family.word_embedding(model).weight.detach(),
                              ple.weight.detach() if ple is not None else None)

    def embed(self, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """ids [batch, seq] -> (inputs_embeds [batch, seq, hidden], per_layer [batch, seq, layers, per_layer]).

        Without PLE the second tensor is ``[batch, seq, layers, 0]`` (graphs ignore it).
        """
        words = torch.nn.functional.embedding(ids, self.word)
        if self.word_scale is not None:
            words = words * self.word_scale
        if self.ple is None:
            return words, words.new_zeros((*ids.shape, self.num_layers, 0))
        per_layer = torch.nn.functional.embedding(ids, self.ple) * self.ple_scale
        return words, per_layer.reshape(*ids.shape, self.num_layers, self.per_layer)

    def nbytes(self) -> int:
        total = self.word.numel() * self.word.element_size()
        if self.ple is not None:
            total += self.ple.numel() * self.ple.element_size()
        return total


def load_host_embeddings(model_dir: str | Path, config) -> HostEmbeddings:
    """Slim loader: materialise only the embedding tensors from a model directory's safetensors.

    Each table is read once into its final tensor (:mod:`neuron_port.model.tensorfile`), so peak
    host memory is the tables' bytes, not twice that.
    """
    family = family_for(config.model_type)
    wanted = {family.word_embedding_key(): "word"}
    if family.per_layer_embedding_key() is not None:
        wanted[family.per_layer_embedding_key()] = "ple"
    found: dict[str, torch.Tensor] = {}
    files = sorted(Path(model_dir).glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no *.safetensors files in {model_dir}")
    for path in files:
        header = read_header(path)
        keys = {key: wanted[norm] for key in header[0] if (norm := family.normalize_key(key)) in wanted}
        for key, tensor in read_tensors(path, keys, header).items():
            found[keys[key]] = tensor
    if "word" not in found:
        raise KeyError(f"{model_dir}: no tensor named {family.word_embedding_key()} (or a wrapper's equivalent)")
    per_layer = family.per_layer_input_size(config)
    if per_layer and "ple" not in found:
        raise KeyError(
            f"{model_dir}: config has per-layer embeddings ({per_layer} per layer) but no tensor "
            f"{family.per_layer_embedding_key()} was found"
        )
    return HostEmbeddings.for_config(config, found["word"], found.get("ple"))


__all__ = ["HostEmbeddings", "load_host_embeddings"]
