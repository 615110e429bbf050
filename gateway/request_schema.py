"""The OpenAI Completions / Chat Completions body schemas (pydantic, strict: JSON types are not
coerced; only these fields are ever forwarded upstream). A top-level field outside them is refused or
dropped before validation (``limits.unknown_fields``, gateway/unknown_fields.py); unknown keys nested in a
message, a content part or ``stream_options`` are ignored here (clients echo whole answer messages back).

Used by :func:`gateway.request.parse_inference_request` (which re-exports :class:`CompletionBody`
and :class:`ChatBody`). ``max_tokens`` bounds: 1..:data:`MAX_TOKENS_CEILING`; stop sequences:
:data:`tenancy.bounds.MAX_STOP_SEQUENCES` of at most :data:`tenancy.bounds.MAX_STOP_CHARS` characters.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal, TypeVar, Union

from pydantic import BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, field_validator, model_validator

from tenancy.bounds import MAX_STOP_CHARS, MAX_STOP_SEQUENCES

__all__ = ["ChatBody", "ChatMessage", "CompletionBody", "MAX_TOKENS_CEILING", "NAME_PATTERN", "StreamOptions",
           "TextPart", "function_name_error", "schema_error"]

MAX_TOKENS_CEILING = 1 << 20
#: ``logit_bias`` entries (token id -> bias): our bound (session 23); keys are token ids (decimal, at most
#: :data:`LOGIT_BIAS_ID_DIGITS` digits), values -100..100 (OpenAI's documented range)
MAX_LOGIT_BIAS_ENTRIES = 300
LOGIT_BIAS_ID_DIGITS = 9

#: OpenAI's rule for a function name (API reference, Chat Completions, ``tools[].function.name``: "a-z, A-Z, 0-9,
#: or contain underscores and dashes, with a maximum length of 64"); its API answers 400 ``invalid_value`` "string
#: does not match pattern ^[a-zA-Z0-9_-]+$" for ``messages[].name``, ``tools[].function.name`` and
#: ``messages[].tool_calls[].function.name`` alike (session 24, S23-newcomer-9)
NAME_PATTERN = r"^[a-zA-Z0-9_-]{1,64}$"
_NAME = re.compile(NAME_PATTERN)

_Item = TypeVar("_Item")
#: a list validated up to its first bad item (pydantic's ``Field(fail_fast=True)``): a refused list holds one
#: error, not one per item. pydantic collects them all by default, and ``exc.errors()`` (:func:`schema_error`)
#: built 65,001 dicts, 160-515 ms of CPU on the event loop, for a 195 kB ``stop`` of numbers (S22-review-1)
_List = Annotated[list[_Item], Field(fail_fast=True)]


def _integer(v: Any) -> Any:
    """``v`` unless it is a bool or another non-int (ValueError "must be an integer"); None passes."""
    if isinstance(v, bool) or (v is not None and not isinstance(v, int)):
        raise ValueError("must be an integer")
    return v


class _Base(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)


class StreamOptions(_Base):
    include_usage: bool | None = None


class TextPart(_Base):
    type: Literal["text"]
    text: str


class ChatMessage(_Base):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: Union[str, _List[TextPart], None] = None
    name: str | None = Field(None, pattern=NAME_PATTERN)  # session 24, S23-newcomer-9 (was any of <= 256 chars)
    #: required in a ``tool`` message: checked once per body by :meth:`ChatBody._tool_call_ids` (session 25)
    tool_call_id: str | None = Field(None, max_length=256)
    tool_calls: _List[dict[str, Any]] | None = None

    @model_validator(mode="after")
    def _null_content(self) -> "ChatMessage":
        # OpenAI: content is required except in an assistant message with tool_calls (S22-newcomer-4); a strict
        # engine refuses it after admission (400 upstream_rejected, naming nothing)
        if self.content is None and not (self.role == "assistant" and self.tool_calls):
            raise ValueError("content must not be null or absent (only an assistant message with tool_calls may "
                             "have no content)")
        return self


class _ToolChecked:
    """The session 24 form of the ``tool_call_id`` rule, a per-message validator: the reference
    :meth:`ChatBody._tool_call_ids` falls back to for a body that breaks it, so that the error reported (which
    error of a body with several, its message and location) is that form's. Same class names as the fast
    models (they appear in pydantic's messages)."""

    class ChatMessage(ChatMessage):
        tool_call_id: str | None = Field(None, max_length=256, validate_default=True)

        @field_validator("tool_call_id")
        @classmethod
        def _tool_call_id(cls, v: Any, info: ValidationInfo) -> Any:
            # OpenAI: a tool message's tool_call_id is required (API reference, ChatCompletionToolMessageParam;
            # session 24, S23-newcomer-9): its param names the field. An invalid role is not in info.data: its own
            # error first
            if v is None and info.data.get("role") == "tool":
                raise ValueError("a tool message requires tool_call_id (the id of the tool call it answers)")
            return v


class _Sampling(_Base):
    model: str = Field(min_length=1, max_length=256)
    max_tokens: int | None = Field(None, ge=1, le=MAX_TOKENS_CEILING)
    temperature: float | None = Field(None, ge=0, le=2)
    top_p: float | None = Field(None, ge=0, le=1)
    n: int = Field(1, ge=1, le=1)
    stream: bool = False
    stream_options: StreamOptions | None = None
    stop: Union[str, _List[str], None] = None
    seed: int | None = Field(None, ge=-(1 << 63), le=(1 << 64) - 1)
    presence_penalty: float | None = Field(None, ge=-2, le=2)
    frequency_penalty: float | None = Field(None, ge=-2, le=2)
    user: str | None = Field(None, max_length=256)
    #: OpenAI's token id -> bias map (session 23, S22-newcomer-3): bounded, see :meth:`_logit_bias`
    logit_bias: dict[str, Any] | None = None  # Any: a refused value is named by the field, never by its key
    #: vLLM / SGLang sampling parameters (not OpenAI's; session 23): per-token numbers, no extra sequences
    top_k: int | None = Field(None, ge=-1, le=1 << 20)
    min_p: float | None = Field(None, ge=0, le=1)
    repetition_penalty: float | None = Field(None, gt=0, le=2)

    @field_validator("logit_bias", mode="before")
    @classmethod
    def _logit_bias_size(cls, v: Any) -> Any:
        # the entry bound before pydantic validates each entry: a refused 65,000-entry map cost ~11 ms more
        # than its decode (S24-review-2); the same error as :meth:`_logit_bias` gives for a decoded body
        if type(v) is dict and len(v) > MAX_LOGIT_BIAS_ENTRIES:
            raise ValueError(f"at most {MAX_LOGIT_BIAS_ENTRIES} entries")
        return v

    @field_validator("logit_bias")
    @classmethod
    def _logit_bias(cls, v: Any) -> Any:
        if v is not None:
            if len(v) > MAX_LOGIT_BIAS_ENTRIES:
                raise ValueError(f"at most {MAX_LOGIT_BIAS_ENTRIES} entries")
            if not all(0 < len(k) <= LOGIT_BIAS_ID_DIGITS and k.isascii() and k.isdigit() for k in v):
                raise ValueError(f"keys must be token ids (decimal, at most {LOGIT_BIAS_ID_DIGITS} digits)")
            if not all(type(b) in (int, float) and -100 <= b <= 100 for b in v.values()):
                raise ValueError("each bias must be a number in -100..100")
        return v

    @field_validator("stream_options")
    @classmethod
    def _stream_options(cls, v: Any, info: ValidationInfo) -> Any:
        # OpenAI: 400 "stream_options is only allowed when stream is enabled"; vLLM refuses it too (S22-newcomer-4).
        # A field validator (``stream`` is validated first), so the refusal's param names the field (S23-review-2);
        # an invalid ``stream`` is not in ``info.data``: its own error comes first
        if v is not None and info.data.get("stream", True) is False:
            raise ValueError("stream_options is only allowed when stream is true")
        return v

    @field_validator("stop")
    @classmethod
    def _stop(cls, v: Any) -> Any:
        if isinstance(v, list) and len(v) > MAX_STOP_SEQUENCES:
            raise ValueError(f"at most {MAX_STOP_SEQUENCES} stop sequences")
        if any(len(s) > MAX_STOP_CHARS for s in ([v] if isinstance(v, str) else v or ())):
            raise ValueError(f"each stop sequence may have at most {MAX_STOP_CHARS} characters")
        return v

    @field_validator("max_tokens", "top_k", mode="before")
    @classmethod
    def _strict_int(cls, v: Any) -> Any:
        return _integer(v)

    @field_validator("stream", "n", mode="before")
    @classmethod
    def _null_is_default(cls, v: Any, info: ValidationInfo) -> Any:
        # OpenAI's API types both "boolean or null" / "integer or null", null meaning the default (false / 1);
        # some clients send unset fields as null (session 24, S24-newcomer-5: was 400). Read as the default, so
        # ``stream`` stays a bool (a null stream with stream_options is refused as stream false is)
        if v is None:
            return cls.model_fields[info.field_name].default
        return _integer(v) if info.field_name == "n" else v


class CompletionBody(_Sampling):
    prompt: Union[str, _List[str]]
    echo: bool | None = None
    logprobs: int | None = Field(None, ge=0, le=20)
    #: sequences generated server-side, of which ``n`` are returned: like ``n``, only 1 (each is a sequence the
    #: tenant would have to be charged for; session 23); dropped when 1, as ``n`` is
    best_of: int | None = Field(None, ge=1, le=1)

    @field_validator("best_of", mode="before")
    @classmethod
    def _strict_best_of(cls, v: Any) -> Any:
        return _integer(v)

    @field_validator("prompt")
    @classmethod
    def _prompt(cls, v: Any) -> Any:
        if (isinstance(v, str) and not v) or (isinstance(v, list) and (not v or not any(v))):
            raise ValueError("prompt must not be empty")
        return v


class ChatBody(_Sampling):
    messages: _List[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(None, ge=1, le=MAX_TOKENS_CEILING)
    tools: _List[dict[str, Any]] | None = None
    tool_choice: Union[str, dict[str, Any], None] = None
    response_format: dict[str, Any] | None = None
    logprobs: bool | None = None
    top_logprobs: int | None = Field(None, ge=0, le=20)
    parallel_tool_calls: bool | None = None

    @model_validator(mode="wrap")
    @classmethod
    def _tool_call_ids(cls, data: Any, handler: Any) -> Any:
        # OpenAI: a tool message's tool_call_id is required (S23-newcomer-9). Session 24 checked it with a
        # per-message validator (validate_default: a Python call for every message of every body); here one pass
        # per validated body (session 25, helper cut). A body that breaks it, or a refused body with a raw tool
        # message without one, is validated again by that form (_ToolChecked), which raises its error: the same
        # one (tests/gateway/test_s25_cut_differential.py). Only such a refusal costs a second validation.
        if cls is not ChatBody:
            return handler(data)
        try:
            body = handler(data)
        except ValidationError:
            if _tool_message_without_id(data):
                _ToolCheckedBody.model_validate(data)
            raise
        for m in body.messages:
            if m.tool_call_id is None and m.role == "tool":
                _ToolCheckedBody.model_validate(data)
                raise RuntimeError("the session 24 form accepted a tool message without tool_call_id")
        return body


class _ToolCheckedBody(ChatBody):
    messages: _List[_ToolChecked.ChatMessage] = Field(min_length=1)


_ToolCheckedBody.__name__ = _ToolCheckedBody.__qualname__ = "ChatBody"  # its errors' title, as ChatBody's


def _tool_message_without_id(data: Any) -> bool:
    """Whether decoded body ``data`` has a ``messages`` list holding a ``tool`` message (a dict) whose
    ``tool_call_id`` is absent or null: the only input the per-message rule refuses."""
    messages = data.get("messages") if type(data) is dict else None
    return type(messages) is list and any(
        type(m) is dict and m.get("role") == "tool" and m.get("tool_call_id") is None for m in messages)


def function_name_error(body: ChatBody) -> str | None:
    """The client's path (``tools.3.function.name``, ``tool_choice.function.name``,
    ``messages.2.tool_calls.0.function.name``) of the first function name of a validated chat ``body`` that is
    not a string matching :data:`NAME_PATTERN` (OpenAI's rule), or None. A ``function`` that is not an object is
    left as before (forwarded; the engine answers). O(tools + tool calls); raises nothing (session 24,
    S23-newcomer-9: names of 100,000 characters were forwarded)."""
    for i, tool in enumerate(body.tools or ()):
        if _bad_function(tool):
            return f"tools.{i}.function.name"
    if type(body.tool_choice) is dict and _bad_function(body.tool_choice):
        return "tool_choice.function.name"
    for i, m in enumerate(body.messages):
        for j, call in enumerate(m.tool_calls or ()):
            if _bad_function(call):
                return f"messages.{i}.tool_calls.{j}.function.name"
    return None


def _bad_function(obj: dict[str, Any]) -> bool:
    """Whether ``obj`` (a tool, tool choice or tool call) has a ``function`` object whose ``name`` is absent, not
    a string or outside :data:`NAME_PATTERN`."""
    fn = obj.get("function")
    if type(fn) is not dict:
        return False
    name = fn.get("name")
    return type(name) is not str or _NAME.fullmatch(name) is None


def schema_error(exc: ValidationError) -> tuple[str, str | None]:
    """``(message, param)`` of a refused body: the first error's dotted location (None for the body itself) and
    pydantic's message, which names the field, never its value; ``param`` is that location without union
    branch tags, the path as the client wrote it (session 23, S22-newcomer-5). Of a union (``content``, ``prompt``, ``stop``: one
    error per branch, the string branch first) the branch that got furthest into the value is named: an image
    part in a ``content`` list is refused as that part (``messages.0.content.list[TextPart].1.type: Input should
    be 'text'``), not as "should be a valid string" (session 21, S21-review-3). Raises nothing."""
    errors = exc.errors()
    err = errors[0]
    union = err["loc"][:-1]  # where a union failed, its path: the first error's last element names a branch
    if union:
        for other in errors[1:]:
            if other["loc"][:len(union)] == union and len(other["loc"]) > len(err["loc"]):
                err = other
    loc = ".".join(str(p) for p in err["loc"]) or None
    msg = err["msg"]
    param = ".".join(str(p) for p in err["loc"] if not _branch_tag(p)) or None
    return (f"{loc}: {msg}" if loc else msg), param


def _branch_tag(part: Any) -> bool:
    """Whether a pydantic error location element names a union branch (``str``, ``list[str]``,
    ``list[TextPart]``, ``dict[str,any]``), which is in no client body: the message keeps it, ``param``
    leaves it out (session 23, S22-newcomer-5). The schema has no field of those names, and no typed dict
    whose keys (client text) could be taken for one."""
    return type(part) is str and (part in _SCALAR_TAGS or "[" in part)


_SCALAR_TAGS = frozenset({"str", "int", "float", "bool", "none"})

