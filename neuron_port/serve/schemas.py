"""Request bodies of the OpenAI-compatible routes (pydantic), validated before a request is queued.

Every field the server takes is declared here; any other field is a 400 that names it (a field
OpenAI defines but this server does not implement — ``suffix``, ``best_of``, ``tools``,
``response_format``, ``echo`` on chat and the like — says so). Names follow OpenAI, with vLLM's extras (``top_k``,
``repetition_penalty``, ``ignore_eos``, ``return_token_ids``, ``stream_options.continuous_usage_stats``).
docs/serving.md lists what guidellm, aiperf, lm-evaluation-harness and the openai client send.
"""

from __future__ import annotations

import re
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

MAX_CHOICES = 8
MAX_LOGPROBS = 20
MAX_LOGIT_BIAS = 300  # entries, as OpenAI allows
SEED_RANGE = (0, 2**64 - 1)  # what torch's generator seeds take

NOT_IMPLEMENTED = ("echo", "suffix", "best_of", "tools", "tool_choice", "functions", "function_call",
                   "response_format", "parallel_tool_calls", "prediction", "audio", "modalities", "store",
                   "metadata", "service_tier", "reasoning_effort", "web_search_options")


class StreamOptions(BaseModel):
    """``include_usage``: a last chunk with the usage; ``continuous_usage_stats`` (vLLM's extension, which
    guidellm always sends): with ``include_usage``, every chunk also carries the usage so far."""

    model_config = ConfigDict(extra="forbid")
    include_usage: bool = False
    continuous_usage_stats: bool = False
    # OpenAI's random padding of stream events against length side channels (the openai client sends it when asked):
    # taken and not applied, the server is meant for a trusted network (say so when that changes)
    include_obfuscation: bool = False

    def usage_chunks(self) -> str:
        """Which chunks carry the usage: ``none``, the ``last`` one, or ``every`` one (vLLM's rule: continuous
        usage only with ``include_usage``)."""
        if not self.include_usage:
            return "none"
        return "every" if self.continuous_usage_stats else "last"


class CommonFields(BaseModel):
    """Fields both completion routes take."""

    model_config = ConfigDict(extra="forbid")
    model: str
    max_tokens: int | None = Field(default=None, ge=1)
    temperature: float = Field(default=1.0, ge=0.0, le=2.0)
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    top_k: int = Field(default=-1, ge=-1)
    repetition_penalty: float = Field(default=1.0, gt=0.0)
    presence_penalty: float = Field(default=0.0, ge=-2.0, le=2.0)
    frequency_penalty: float = Field(default=0.0, ge=-2.0, le=2.0)
    logit_bias: dict[str, float] | None = None
    stop: str | list[str] | None = None
    seed: int | None = Field(default=None, ge=SEED_RANGE[0], le=SEED_RANGE[1])
    stream: bool = False
    stream_options: StreamOptions | None = None
    n: int = Field(default=1, ge=1, le=MAX_CHOICES)
    user: str | None = None  # accepted and unused, as OpenAI's is
    ignore_eos: bool = False
    return_token_ids: bool = False

    @field_validator("logit_bias")
    @classmethod
    def _bias(cls, v):
        if v is None:
            return v
        if len(v) > MAX_LOGIT_BIAS:
            raise ValueError(f"at most {MAX_LOGIT_BIAS} logit_bias entries, found {len(v)}")
        for key, bias in v.items():
            if not re.fullmatch(r"[0-9]{1,9}", key):
                raise ValueError(f"logit_bias keys are token ids (ASCII digits), found {key!r}")
            if not -100.0 <= bias <= 100.0:
                raise ValueError(f"logit_bias values must be in [-100, 100], found {bias} for {key}")
        if len({int(key) for key in v}) != len(v):
            raise ValueError("logit_bias names one token id twice (as different strings)")
        return v

    @model_validator(mode="after")
    def _stream_options_need_a_stream(self):
        if self.stream_options is not None and not self.stream:
            raise ValueError("stream_options is only allowed with stream: true")
        return self

    @field_validator("stop")
    @classmethod
    def _stops(cls, v):
        stops = [v] if isinstance(v, str) else list(v or [])
        if len(stops) > 4:
            raise ValueError(f"at most 4 stop sequences, found {len(stops)}")
        if any(not s for s in stops):
            raise ValueError("stop sequences must not be empty")
        return v


class CompletionRequest(CommonFields):
    # Every form the OpenAI API allows: a string, a list of strings, a list of token ids, or a list of
    # id lists (lm-evaluation-harness's default); each prompt gets its own ``n`` choices.
    prompt: str | list[int] | list[str] | list[list[int]]
    logprobs: int | None = Field(default=None, ge=0, le=MAX_LOGPROBS)
    # echo: the prompt before the completion, with its tokens' log-probabilities when logprobs asks;
    # max_tokens 0 (with echo) scores the prompt alone, as lm-evaluation-harness's log-likelihoods do
    echo: bool = False
    max_tokens: int | None = Field(default=None, ge=0)

    @model_validator(mode="after")
    def _echo_rules(self):
        if self.max_tokens == 0 and not self.echo:
            raise ValueError("max_tokens 0 scores the prompt alone and needs echo: true")
        if self.echo and self.stream:
            raise ValueError("echo is not served with stream: true; ask without streaming")
        return self


class TextPart(BaseModel):
    model_config = ConfigDict(extra="forbid")
    type: Literal["text"]
    text: str


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="forbid")
    role: Literal["system", "developer", "user", "assistant"]
    content: str | list[TextPart]
    name: str | None = None

    def text(self) -> str:
        """The message's text: the string, or its text parts joined."""
        return self.content if isinstance(self.content, str) else "".join(p.text for p in self.content)


class ChatRequest(CommonFields):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    logprobs: bool = False
    top_logprobs: int | None = Field(default=None, ge=0, le=MAX_LOGPROBS)

    @model_validator(mode="after")
    def _top_logprobs_need_logprobs(self):
        if self.top_logprobs is not None and not self.logprobs:
            raise ValueError("top_logprobs needs logprobs: true")
        return self


__all__ = ["MAX_CHOICES", "MAX_LOGPROBS", "MAX_LOGIT_BIAS", "SEED_RANGE", "NOT_IMPLEMENTED", "StreamOptions", "CommonFields",
           "CompletionRequest", "TextPart", "ChatMessage", "ChatRequest"]
