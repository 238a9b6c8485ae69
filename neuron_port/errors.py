"""Errors the library raises on bad input.

Every message says what was expected, what was found and, where there is one, what to do.
All derive from ``NeuronPortError`` so a CLI can report them without a traceback.
"""

from __future__ import annotations


class NeuronPortError(Exception):
    """Base class of every error this library raises on purpose."""


class UnsupportedArchitectureError(NeuronPortError, ValueError):
    """A config or model whose ``model_type`` no family adapter knows."""


class ConfigError(NeuronPortError, ValueError):
    """A config file that is missing, unreadable or malformed."""


class ShardingError(NeuronPortError, ValueError):
    """A tensor-parallel degree that the heads (or MLP) cannot be split by."""


class BucketError(NeuronPortError, ValueError):
    """A prompt or generation that does not fit the static buckets of a port."""


class ParallelRankError(NeuronPortError, RuntimeError):
    """A tensor-parallel worker process died or failed. The message names the rank and where it
    raised (file, line, function, exception); ``rank_traceback`` holds the rank's whole traceback."""

    rank: int | None = None
    rank_traceback: str | None = None


class AdapterError(NeuronPortError, NotImplementedError):
    """A family adapter that lacks a hook the operation needs (the message names the hook)."""


class MaskFormError(AdapterError, ValueError):
    """The text model dropped the graph's masks: the adapter's ``attention_mask_argument`` gives
    them in a form this model ignores (a mapping to a model that takes one tensor, or the reverse)."""


class ArtifactError(NeuronPortError, ValueError):
    """An artifact that is missing, corrupt, edited or built for another environment."""


class BackendUnavailableError(NeuronPortError, ImportError):
    """A backend whose vendor SDK is not installed."""


class MissingExtraError(NeuronPortError, ImportError):
    """An optional extra the command needs is not installed."""


class ModelSourceError(NeuronPortError, ValueError):
    """A model that cannot be had where it was named: a Hugging Face id not cached while offline, gated,
    missing or at a revision that does not exist, or a config with no weights where real ones are needed."""


class PretrainedUnavailableError(NeuronPortError, RuntimeError):
    """A real checkpoint whose package (or the GGUF readers) is not installed."""


class TensorFileError(NeuronPortError, ValueError):
    """A safetensors file that is truncated, malformed or lacks what was asked for."""


class DrafterError(NeuronPortError, ValueError):
    """A speculative-decoding drafter that does not fit its target: another vocabulary, a backbone width other
    than the target's hidden size, or attention shapes other than the target's K/V it reads."""


class PromptError(NeuronPortError, ValueError):
    """A prompt that cannot be built as asked."""


class TemplateError(NeuronPortError, ValueError):
    """A chat template that raised (``raise_exception``) or failed to render."""


class GoldenMismatchError(NeuronPortError, ValueError):
    """A golden whose checkpoint is not the model under test's."""


class ServeError(NeuronPortError, RuntimeError):
    """A server that cannot serve: its model failed to load, or it was given a setting it cannot run with."""


class QueueFull(NeuronPortError, RuntimeError):
    """The server's queue holds as many requests as it may: the request is refused (HTTP 429)."""


class Rejected(NeuronPortError):
    """A request refused before it reaches the engine: status, message, error type, parameter."""

    def __init__(self, status: int, message: str, kind: str = "invalid_request_error", param: str | None = None):
        super().__init__(message)
        self.status, self.message, self.kind, self.param = status, message, kind, param


class ClientGone(NeuronPortError):
    """The client of a whole (not streamed) response closed its connection before the answer was ready."""
