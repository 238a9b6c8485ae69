"""A model named by its Hugging Face id, resolved to a local directory through ``huggingface_hub``.

Everything the hub client already does is left to it: its cache (``HF_HOME`` / ``HF_HUB_CACHE``), offline
mode (``HF_HUB_OFFLINE=1``: the cached snapshot or an error, no network), the token (``HF_TOKEN`` or a
``hf auth login``), the revision. Only what a port needs is fetched (:data:`HUB_FILES`: the config,
the safetensors weights, the tokenizer and chat template). A name that is a local path or a shipped name is
not a hub id and is returned as it is.
"""

from __future__ import annotations

import re
from pathlib import Path

from neuron_port.errors import ModelSourceError
from neuron_port.model.configs import SHIPPED

HUB_FILES = [
    "config.json", "generation_config.json", "*.safetensors", "*.safetensors.index.json",
    "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "tokenizer.model", "chat_template.jinja",
    "chat_template.json", "preprocessor_config.json", "processor_config.json",
]
"""What a port reads of a hub repository (no PyTorch ``.bin``, GGUF or ONNX copies of the weights)."""

_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


def is_hub_id(name: str) -> bool:
    """Whether ``name`` reads as ``owner/repo`` and is neither a local path nor a shipped name."""
    return name not in SHIPPED and not Path(name).exists() and bool(_HUB_ID.match(name))


def hub_snapshot(repo_id: str, revision: str | None = None) -> Path:
    """The local directory of ``repo_id``'s snapshot at ``revision`` (default: ``main``), fetched into the
    hub cache unless it is there already (or ``HF_HUB_OFFLINE=1``: the cache only). Errors are one
    :class:`~neuron_port.errors.ModelSourceError` line saying what to do."""
    from huggingface_hub import constants, snapshot_download
    from huggingface_hub.errors import (
        GatedRepoError,
        HfHubHTTPError,
        LocalEntryNotFoundError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    at = f"{repo_id}@{revision or 'main'}"
    try:
        return Path(snapshot_download(repo_id, revision=revision, allow_patterns=HUB_FILES))
    except GatedRepoError:
        raise ModelSourceError(f"{at} is gated: accept its licence on huggingface.co, then set HF_TOKEN (or run "
                               "'hf auth login')") from None
    except RevisionNotFoundError:
        raise ModelSourceError(f"{at}: no such revision (a branch, tag or commit of the repository)") from None
    except RepositoryNotFoundError:
        raise ModelSourceError(f"{repo_id}: no such model on the Hugging Face hub (or it is private: set HF_TOKEN); "
                               f"a local path or a shipped name works too") from None
    except LocalEntryNotFoundError:
        offline = "HF_HUB_OFFLINE=1 is set" if constants.HF_HUB_OFFLINE else "the hub could not be reached"
        raise ModelSourceError(f"{at} is not in the Hugging Face cache ({constants.HF_HUB_CACHE}) and {offline}: "
                               f"download it where there is network ('hf download {repo_id}') and copy the cache, "
                               "or give a local directory") from None
    except HfHubHTTPError as exc:
        raise ModelSourceError(f"{at}: the hub answered {exc.response.status_code if exc.response is not None else '?'} "
                               f"({str(exc).splitlines()[0]})") from None


def resolve_model(name: str, revision: str | None = None) -> str:
    """``name`` as the library's loaders take it: a hub id becomes its snapshot directory; a local path or a
    shipped name stays as it is (``revision`` applies to hub ids only, and is refused for anything else)."""
    if is_hub_id(name):
        return str(hub_snapshot(name, revision))
    if revision is not None:
        raise ModelSourceError(f"--revision {revision} applies to a Hugging Face model id (owner/name), not to {name!r}")
    return name


__all__ = ["HUB_FILES", "is_hub_id", "hub_snapshot", "resolve_model"]
