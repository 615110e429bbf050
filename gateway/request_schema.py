"""The OpenAI Completions / Chat Completions body schemas (pydantic, strict: JSON types are not
coerced; unknown fields are ignored, so only these fields are ever forwarded upstream).

Used by :func:`gateway.request.parse_inference_request` (which re-exports :class:`CompletionBody`
and :class:`ChatBody`). ``max_tokens`` bounds: 1..:data:`MAX_TOKENS_CEILING`; stop sequences:
:data:`tenancy.bounds.MAX_STOP_SEQUENCES` of at most :data:`tenancy.bounds.MAX_STOP_CHARS` characters.
"""

from __future__ import annotations

from typing import Any, Literal, Union

from pydantic import BaseModel, ConfigDict, Field, field_validator

from tenancy.bounds import MAX_STOP_CHARS, MAX_STOP_SEQUENCES

__all__ = ["ChatBody", "ChatMessage", "CompletionBody", "MAX_TOKENS_CEILING", "StreamOptions", "TextPart"]

MAX_TOKENS_CEILING = 1 << 20


class _Base(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)


class StreamOptions(_Base):
    include_usage: bool | None = None


class TextPart(_Base):
    type: Literal["text"]
    text: str


class ChatMessage(_Base):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: Union[str, list[TextPart], None] = None
    name: str | None = Field(None, max_length=256)
    tool_call_id: str | None = Field(None, max_length=256)
    tool_calls: list[dict[str, Any]] | None = None


class _Sampling(_Base):
    model: str = Field(min_length=1, max_length=256)
    max_tokens: int | None = Field(None, ge=1, le=MAX_TOKENS_CEILING)
    temperature: float | None = Field(None, ge=0, le=2)
    top_p: float | None = Field(None, ge=0, le=1)
    n: int = Field(1, ge=1, le=1)
    stream: bool = False
    stream_options: StreamOptions | None = None
    stop: Union[str, list[str], None] = None
    seed: int | None = Field(None, ge=-(1 << 63), le=(1 << 64) - 1)
    presence_penalty: float | None = Field(None, ge=-2, le=2)
    frequency_penalty: float | None = Field(None, ge=-2, le=2)
    user: str | None = Field(None, max_length=256)

    @field_validator("stop")
    @classmethod
    def _stop(cls, v: Any) -> Any:
        if isinstance(v, list) and len(v) > MAX_STOP_SEQUENCES:
            raise ValueError(f"at most {MAX_STOP_SEQUENCES} stop sequences")
        if any(len(s) > MAX_STOP_CHARS for s in ([v] if isinstance(v, str) else v or ())):
            raise ValueError(f"each stop sequence may have at most {MAX_STOP_CHARS} characters")
        return v

    @field_validator("max_tokens", "n", mode="before")
    @classmethod
    def _strict_int(cls, v: Any) -> Any:
        if isinstance(v, bool) or (v is not None and not isinstance(v, int)):
            raise ValueError("must be an integer")
        return v


class CompletionBody(_Sampling):
    prompt: Union[str, list[str]]
    echo: bool | None = None
    logprobs: int | None = Field(None, ge=0, le=20)

    @field_validator("prompt")
    @classmethod
    def _prompt(cls, v: Any) -> Any:
        if (isinstance(v, str) and not v) or (isinstance(v, list) and (not v or not any(v))):
            raise ValueError("prompt must not be empty")
        return v


class ChatBody(_Sampling):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(None, ge=1, le=MAX_TOKENS_CEILING)
    tools: list[dict[str, Any]] | None = None
    tool_choice: Union[str, dict[str, Any], None] = None
    response_format: dict[str, Any] | None = None
    logprobs: bool | None = None
    top_logprobs: int | None = Field(None, ge=0, le=20)
