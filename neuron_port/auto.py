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
from pathlib import Path

from torch import nn

from neuron_port.errors import ModelSourceError, PromptError
from neuron_port.generation.opened import OpenedModel


@dataclass
class PortedModel:
    """A model ported to the two-graph form, or a compiled artifact, that generates text.

    ``model``: the CausalLM (None for an artifact); ``opened``: what the model is (config, family, its directory's
    tokenizer, chat template and stop ids: :class:`~neuron_port.generation.opened.OpenedModel`, read once); the
    prompt buckets and the KV length a model's port is built with (an artifact has its own)."""

    model: nn.Module | None
    opened: OpenedModel
    buckets: tuple[int, ...] = (32, 64, 128)
    kv_len: int = 256
    tp: int = 1

    @property
    def directory(self) -> Path | None:
        """Where its config, tokenizer and chat template are: the model directory or the artifact (None for random
        weights)."""
        return self.opened.directory

    @property
    def artifact(self) -> bool:
        """Whether this is a compiled artifact."""
        return self.opened.artifact

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
        if isinstance(prompt, list):
            if chat:
                raise PromptError("chat=True takes the user's message as text, found token ids")
            return [int(t) for t in prompt]
        if self.directory is None:
            raise PromptError("a model with random weights has no tokenizer: give the prompt as token ids")
        return self.opened.chat_prompt(prompt) if chat else self.opened.text_prompt(prompt)

    def _stop_ids(self, chat: bool) -> list[int]:
        return self.opened.stop_ids(chat)

    def _decode(self, ids: list[int]) -> str:
        text = self.opened.decode(ids, self._stop_ids(False))
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
    if name in SHIPPED and not tiny:
        raise ModelSourceError(f"{name} is a config, not weights: give a Hugging Face id or a directory, or tiny=True "
                               "for a small random model")
    opened = OpenedModel.open(name, tiny=tiny and not Path(name).is_dir())
    if opened.artifact:
        return PortedModel(None, opened)
    model = model_from_name(name, tiny=opened.tiny, dtype=parse_dtype(dtype), quant=quant, config=opened.config)
    return PortedModel(model, opened, tuple(buckets), kv_len, tp)


__all__ = ["PortedModel", "from_pretrained"]
