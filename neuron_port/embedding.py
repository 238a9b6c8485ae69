"""Word and per-layer embeddings gathered on the host and fed to the graphs as activations.

The tables are ``vocab x hidden`` (and ``vocab x layers*per_layer`` for Gemma-4's per-layer
embeddings, PLE): materialised on a NeuronCore they overflow the compiler and the core's
memory, so they stay on the host. The device graphs receive the gathered, scaled rows.
The slim loader reads only these tensors from safetensors files.
"""

from __future__ import annotations

from pathlib import Path

import torch
from safetensors import safe_open

from neuron_port.families import family_for


class HostEmbeddings:
    """Host-side gathers matching Hugging Face's scaled embeddings exactly.

    word:  [vocab, hidden] (scaled by sqrt(hidden) in the table's dtype)
    ple:   [vocab_ple, layers * per_layer] or None (scaled by sqrt(per_layer))
    """

    def __init__(self, word: torch.Tensor, ple: torch.Tensor | None, num_layers: int, per_layer: int):
        self.word = word
        self.ple = ple
        self.num_layers = num_layers
        self.per_layer = per_layer
        self.hidden = word.shape[1]
        # Hugging Face keeps the scale as a float32 buffer, then casts it to the table dtype.
        self.word_scale = torch.tensor(self.hidden**0.5, dtype=torch.float32).to(word.dtype)
        self.ple_scale = torch.tensor(per_layer**0.5, dtype=torch.float32).to(ple.dtype) if ple is not None else None

    @classmethod
    def from_model(cls, model: torch.nn.Module) -> "HostEmbeddings":
        family = family_for(model.config.model_type)
        config = family.text_config_of(model)
        ple = family.per_layer_embedding(model)
        return cls(
            family.word_embedding(model).weight.detach(),
            ple.weight.detach() if ple is not None else None,
            int(config.num_hidden_layers),
            family.per_layer_input_size(config),
        )

    def embed(self, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """ids [batch, seq] -> (inputs_embeds [batch, seq, hidden], per_layer [batch, seq, layers, per_layer]).

        Without PLE the second tensor is ``[batch, seq, layers, 0]`` (graphs ignore it).
        """
        words = torch.nn.functional.embedding(ids, self.word) * self.word_scale
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
    """Slim loader: materialise only the embedding tensors from a model directory's safetensors."""
    family = family_for(config.model_type)
    wanted = {family.word_embedding_key(): "word", family.per_layer_embedding_key(): "ple"}
    found: dict[str, torch.Tensor] = {}
    files = sorted(Path(model_dir).glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no *.safetensors files in {model_dir}")
    for path in files:
        with safe_open(str(path), framework="pt") as fh:
            for key in fh.keys():
                norm = family.normalize_key(key)
                if norm in wanted:
                    found[wanted[norm]] = fh.get_tensor(key)
    if "word" not in found:
        raise KeyError(f"{model_dir}: no tensor named {family.word_embedding_key()} (or a wrapper's equivalent)")
    per_layer = family.per_layer_input_size(config)
    if per_layer and "ple" not in found:
        raise KeyError(
            f"{model_dir}: config has per-layer embeddings ({per_layer} per layer) but no tensor "
            f"{family.per_layer_embedding_key()} was found"
        )
    return HostEmbeddings(found["word"], found.get("ple"), int(config.num_hidden_layers), per_layer)


__all__ = ["HostEmbeddings", "load_host_embeddings"]
