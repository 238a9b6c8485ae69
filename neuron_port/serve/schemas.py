"""Request bodies of the OpenAI-compatible routes (pydantic), validated before a request is queued."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator


class CommonFields(BaseModel):
    """Fields both completion routes take (vLLM's OpenAI server names, with its extras)."""

    model_config = ConfigDict(extra="ignore")
    model: str
    max_tokens: int | None = Field(default=None)
    temperature: float = Field(default=1.0, ge=0.0, le=2.0)
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    top_k: int = Field(default=-1, ge=-1)
    repetition_penalty: float = Field(default=1.0, gt=0.0)
    stop: str | list[str] | None = None
    seed: int | None = None
    stream: bool = False
    n: int = 1
    ignore_eos: bool = False
    return_token_ids: bool = False

    @field_validator("max_tokens")
    @classmethod
    def _positive(cls, v):
        if v is not None and v < 1:
            raise ValueError(f"max_tokens must be at least 1, found {v}")
        return v

    @field_validator("n")
    @classmethod
    def _one(cls, v):
        if v != 1:
            raise ValueError(f"only n=1 is supported, found {v}")
        return v


class CompletionRequest(CommonFields):
    prompt: str | list[int]


class ChatMessage(BaseModel):
    role: Literal["system", "user", "assistant"]
    content: str


class ChatRequest(CommonFields):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = None


__all__ = ["CommonFields", "CompletionRequest", "ChatMessage", "ChatRequest"]
