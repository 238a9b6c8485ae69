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
    """The text model dropped the host-built masks: the adapter's ``attention_mask_argument`` gives
    them in a form this model ignores (a mapping to a model that takes one tensor, or the reverse)."""
