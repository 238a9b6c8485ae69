"""The library's errors: one base class a CLI can report without a traceback, and the builtin each one also
is, so a caller's ``except ValueError`` (or ``ImportError``, ``RuntimeError``) keeps catching it."""

import inspect

import pytest

import neuron_port.errors as errors

ERRORS = [cls for _, cls in inspect.getmembers(errors, inspect.isclass) if cls.__module__ == errors.__name__]


def test_every_error_is_a_neuron_port_error():
    assert len(ERRORS) > 10
    assert all(issubclass(cls, errors.NeuronPortError) for cls in ERRORS)


@pytest.mark.parametrize("cls,builtin", [
    (errors.ShardingError, ValueError), (errors.BucketError, ValueError), (errors.ConfigError, ValueError),
    (errors.ArtifactError, ValueError), (errors.MaskFormError, ValueError), (errors.BackendUnavailableError, ImportError),
    (errors.MissingExtraError, ImportError), (errors.ParallelRankError, RuntimeError), (errors.QueueFull, RuntimeError),
    (errors.AdapterError, NotImplementedError),
])
def test_a_callers_builtin_handler_still_catches_it(cls, builtin):
    with pytest.raises(builtin, match="what was found"):
        raise cls("what was found")


def test_a_rejection_carries_what_the_http_error_needs():
    rejected = errors.Rejected(429, "the queue is full", "rate_limit_error", "prompt")
    assert (rejected.status, rejected.message, rejected.kind, rejected.param, str(rejected)) == (
        429, "the queue is full", "rate_limit_error", "prompt", "the queue is full")
    assert errors.Rejected(400, "bad").kind == "invalid_request_error"
