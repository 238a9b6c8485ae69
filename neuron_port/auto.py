"""From a model id to generated text in a few lines, with the names transformers users know.

::

    import neuron_port

    model = neuron_port.from_pretrained("HuggingFaceTB/SmolLM2-135M-Instruct")   # hub id, directory or artifact
    print(model.generate("The capital of France is", max_new_tokens=8))           # ' Paris. ...'
    artifact = model.compile("smollm2-artifact")                                  # what `neuron-port compile` writes
    print(neuron_port.from_pretrained(artifact).generate("The capital of France is", max_new_tokens=8))

:func:`from_pretrained` takes what the commands take: a Hugging Face id (through the hub cache), a local model
directory, a compiled artifact directory, or a shipped name with ``tiny=True``. :class:`PortedModel` runs the
library's own two-graph port (on the CPU here; an artifact on the backend it was compiled for) and speaks text:
a prompt string (or token ids) in, the completion's text out, stopping at the model's end of sequence. The
commands and the server are built from the same pieces, with more options.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

from torch import nn

from neuron_port.errors import ModelSourceError, PromptError


@dataclass
class PortedModel:
    """A model ported to the two-graph form, or a compiled artifact, that generates text.

    ``model``: the CausalLM (None for an artifact); ``directory``: where its config, tokenizer and chat template
    are (the model directory or the artifact); ``artifact``: whether ``directory`` is a compiled artifact; the
    prompt buckets and the KV length a model's port is built with (an artifact has its own)."""

    model: nn.Module | None
    directory: Path | None
    artifact: bool = False
    buckets: tuple[int, ...] = (32, 64, 128)
    kv_len: int = 256
    tp: int = 1

    def generate(self, prompt: str | list[int], max_new_tokens: int = 32, chat: bool = False) -> str:
        """The completion of ``prompt`` (text, or token ids) as text; ``chat``: ``prompt`` is one user message put
        through the model's chat template. Greedy; stops at the model's end of sequence (the end of a turn for a
        chat), after ``max_new_tokens``, or at the end of the context."""
        return self._decode(self.generate_ids(prompt, max_new_tokens, chat))

    def generate_ids(self, prompt: str | list[int], max_new_tokens: int = 32, chat: bool = False) -> list[int]:
        """The new token ids of :meth:`generate` (without the prompt)."""
        from neuron_port.generation.generate import generate
        from neuron_port.generation.request import GenerationRequest
        from neuron_port.graph.shapes import PortShape

        ids = self._prompt_ids(prompt, chat)
        request = GenerationRequest.greedy([ids], max_new_tokens, self._stop_ids(chat))
        if self.artifact:
            return list(generate(str(self.directory), request).tokens[0])
        return list(generate(self.model, request, shape=PortShape(self.buckets, self.kv_len), tp=self.tp).tokens[0])

    def compile(self, out: str | Path, backend: str = "cpu", tp: int | None = None) -> Path:
        """A verified artifact of this model in ``out`` (written atomically), as ``neuron-port compile`` writes it:
        ``backend`` ``cpu`` here, ``neuron`` or ``nxd`` on an Inferentia2 host; ``tp`` defaults to this model's."""
        from neuron_port.artifacts.writer import write_artifact
        from neuron_port.graph.shapes import PortShape
        from neuron_port.model.layout import describe
        from neuron_port.model.quant import quant_of
        from neuron_port.model.source import Source
        from neuron_port.parallel.ranks import RankSetup

        if self.artifact or self.model is None:
            raise ModelSourceError(f"{self.directory} is already a compiled artifact")
        if self.directory is None:
            raise ModelSourceError("a model with random weights has no directory to record as its source: compile it "
                                   "with 'neuron-port compile NAME --tiny'")
        source = Source.directory(str(self.directory.resolve()), quant_of(self.model))
        setup = RankSetup.for_layout(describe(self.model), tp or self.tp)
        write_artifact(Path(out), self.model, source, setup, PortShape(self.buckets, self.kv_len), backend=backend,
                       tokenizer_dir=self.directory)  # the tokenizer and chat template go with the graphs
        return Path(out)

    # ---- text in and out -----------------------------------------------------------------------------
    def _prompt_ids(self, prompt: str | list[int], chat: bool) -> list[int]:
        from neuron_port.generation.prompts import text_prompt

        if isinstance(prompt, list):
            if chat:
                raise PromptError("chat=True takes the user's message as text, found token ids")
            return [int(t) for t in prompt]
        if self.directory is None:
            raise PromptError("a model with random weights has no tokenizer: give the prompt as token ids")
        if not chat:
            return text_prompt(str(self.directory), prompt)
        from neuron_port.generation.chat import chat_format_of

        fmt, tokenizer = chat_format_of(str(self.directory))
        if tokenizer is None:
            raise PromptError(f"chat=True needs a tokenizer.json in {self.directory}; it has none")
        return fmt.encode([{"role": "user", "content": prompt}], tokenizer, self._special.bos)

    @cached_property
    def _special(self) -> Any:
        """The model's special ids, read once (from the directory's config.json, or the model's own config)."""
        from neuron_port.families import family_for
        from neuron_port.model.configs import load_config

        config = load_config(self.directory / "config.json") if self.directory is not None else None
        if config is None:
            from neuron_port.families import family_of

            family = family_of(self.model)
            return family.special_ids(family.text_config_of(self.model))
        return family_for(config.model_type).special_ids(config)

    def _stop_ids(self, chat: bool) -> list[int]:
        from neuron_port.generation.chat import generation_stop_ids

        real = self.directory is not None
        return generation_stop_ids(self.directory, self._special.eos, chat, eos_means_end=real)

    def _decode(self, ids: list[int]) -> str:
        from neuron_port.model.tokenizer import decode_completion

        text = None if self.directory is None else decode_completion(str(self.directory), ids, self._stop_ids(False))
        if text is None:
            raise PromptError(f"{self.directory or 'a model with random weights'} has no tokenizer.json: use generate_ids")
        return text


def from_pretrained(name: str | Path, *, tiny: bool = False, revision: str | None = None, dtype: str = "fp32",
                    quant: str = "none", tp: int = 1, buckets: tuple[int, ...] = (32, 64, 128),
                    kv_len: int = 256) -> PortedModel:
    """The model ``name`` names, ready to generate: a Hugging Face id (``revision``: a branch, tag or commit), a local
    model directory, an artifact directory (``neuron-port compile --out``: its graphs, as compiled), or a shipped
    name with ``tiny=True`` (random weights, token ids only). ``dtype`` (``fp32``, ``bf16``), ``quant`` (``none``,
    ``int8``, ``int8+head``), ``tp`` (gloo ranks on the CPU), ``buckets`` and ``kv_len`` shape a model's port."""
    from neuron_port.model.configs import SHIPPED
    from neuron_port.model.hub import resolve_model
    from neuron_port.model.loading import model_from_name, parse_dtype

    name = resolve_model(str(name), revision)
    path = Path(name)
    if (path / "manifest.json").is_file():
        return PortedModel(None, path, artifact=True)
    if path.is_dir():
        return PortedModel(model_from_name(name, dtype=parse_dtype(dtype), quant=quant), path, False, tuple(buckets),
                           kv_len, tp)
    if name in SHIPPED and not tiny:
        raise ModelSourceError(f"{name} is a config, not weights: give a Hugging Face id or a directory, or tiny=True "
                               "for a small random model")
    return PortedModel(model_from_name(name, tiny=tiny, dtype=parse_dtype(dtype), quant=quant), None, False,
                       tuple(buckets), kv_len, tp)


__all__ = ["PortedModel", "from_pretrained"]
