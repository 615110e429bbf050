"""Reading and validating inference request bodies (pipeline step 3).

``read_body`` (gateway/body_read.py, re-exported here) enforces the size cap (from ``Content-Length`` before
reading, and again while reading, so a lying header cannot get past it) and a read
timeout (a client that trickles its body is cut off). ``parse_inference_request``
decodes UTF-8 JSON, validates it with pydantic models of the OpenAI Completions / Chat Completions
schemas, then bounds the nesting of its free-form fields. Only the fields of those models are forwarded
upstream: a top-level field outside them (tenant or routing hints, vLLM extensions) is refused, or dropped
and named in the answer's headers (``limits.unknown_fields``, gateway/unknown_fields.py; never walked:
R6-1); a client-sent ``cache_salt`` is replaced (docs/configuration.md), so what reaches a replica always
passes the schema.
The client's ``user`` is validated but never forwarded: the pipeline sends
nothing or the workload's pseudonym in its place (docs/configuration.md,
``forward_user``).

Cheap bounds come before the costly steps (issue 12): the number of chat
messages (content parts included, R4-1) and of list-``prompt`` elements is checked on the decoded JSON
before schema validation, and the request carries, per sequence, the UTF-8
size of everything that becomes prompt tokens upstream, so the pipeline can
refuse an oversized prompt before tokenizing it.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Literal

from pydantic import BaseModel, ValidationError

from gateway import json_fast
from gateway.body_read import read_body
from gateway.errors import GatewayError
from gateway.request_fast import plain_chat, plain_completion
from gateway.free_form import free_form_refusal
from gateway.response_format import response_format_refusal, tools_refusal
from gateway.request_schema import (MAX_TOKENS_CEILING, NAME_PATTERN, ChatBody, CompletionBody, function_name_error,
                                    schema_error)
from gateway.unknown_fields import (KNOWN_CHAT, KNOWN_COMPLETIONS, PLAIN_CHAT, PLAIN_COMPLETIONS, DroppedFields,
                                    UnknownFields, outside_schema)
from tenancy.bounds import chat_units
from tenancy.tokenizer import TokenizerError, prompt_text

__all__ = ["ChatBody", "CompletionBody", "MAX_TOKENS_CEILING", "InferenceRequest", "read_body", "parse_inference_request", "Endpoint", "JsonObject", "MAX_INT_DIGITS", "upstream_body"]

Endpoint = Literal["chat", "completions"]

#: A decoded JSON object (request and response bodies, ``usage``).
JsonObject = dict[str, Any]
#: Digits of an integer literal anywhere in a body (R4-2; ``seed`` goes up to 2**64 - 1): a longer one
#: answers 400 ``number_too_long`` unconverted (CPython's str->int and int->str are quadratic).
MAX_INT_DIGITS = 20
_NO_OVERRIDES: Mapping[str, int | str | None] = MappingProxyType({})


@dataclass(slots=True)
class InferenceRequest:
    """A validated inference request.

    ``endpoint``: "chat" or "completions"; ``model``: requested model name; ``stream``: SSE answer wanted;
    ``max_tokens``: requested output tokens (``None``: not given; the tenant's cap applies); ``include_usage``: the
    client asked for a usage chunk; ``body``: the schema-checked fields to forward (no ``cache_salt``, no ``user``);
    ``text``: the prompt text to hash into prefix keys — never logged or exported. ``prompts``: the text of each
    sequence (a list ``prompt`` is a batch of ``len(prompts)`` sequences; chat has one); ``extra_text``: a JSON
    rendering of the other fields that become prompt tokens upstream (``tools``, ``tool_choice``,
    ``response_format``, message ``name``/``tool_call_id``/``tool_calls``), counted with the first sequence, never
    hashed; ``prompt_bytes``: UTF-8 bytes per sequence (the first includes ``extra_text`` and the ``stop``
    sequences, which are bounded by bytes only: they are not prompt tokens). ``prompt_logprobs``: ``echo: true``
    with any ``logprobs`` (R4-12), a fact of the parse: a queued request's ``body`` is emptied (session 18, R18-3).
    ``longest_prompt_tokens``: the token count of its longest sequence (the first with ``extra_text``'s), set when
    :meth:`gateway.admission.Admission.prompt_tokens` counted it (None before): kept for the re-decision's
    ``max_prompt_tokens`` check, which has no prompt text (gateway/pep_recheck.py; session 20, fixq-2).
    ``dropped``: the count and answer-header value of the top-level fields dropped outside the schema
    (``limits.unknown_fields: drop``; :mod:`gateway.unknown_fields`), ``(0, "")`` if none.
    """

    endpoint: Endpoint
    model: str
    stream: bool
    max_tokens: int | None
    include_usage: bool
    body: dict[str, Any]
    text: str = field(repr=False)
    prompts: tuple[str, ...] = field(default=(), repr=False)
    extra_text: str = field(default="", repr=False)
    prompt_bytes: tuple[int, ...] = ()
    prompt_logprobs: bool = False
    longest_prompt_tokens: int | None = None
    dropped: DroppedFields = (0, "")

    @property
    def sequences(self) -> int:
        """Sequences the replica runs for this request (elements of a list ``prompt``; else 1)."""
        return max(1, len(self.prompts))

    def forget_prompt_text(self) -> None:
        """Drop ``text`` and each prompt's text once tokenized and hashed (they serve nothing else:
        review R12-2, a queued request should not hold them); :attr:`sequences` keeps its value."""
        self.text = ""
        if self.prompts:
            self.prompts = ("",) * len(self.prompts)


def _depth_ok(parsed: BaseModel, limit: int) -> bool:
    """Whether a validated body's free-form fields (``tools``, ``tool_choice``, ``response_format``, messages'
    ``tool_calls``: the schema bounds the others) nest at most ``limit`` deep (the body is depth 1). Dropped
    fields are never walked (R6-1: 62,000 ignored values cost 26 ms); orjson bounds them at 1024 levels."""
    stack = [(getattr(parsed, k, None), 2) for k in _EXTRA_BODY_FIELDS]
    stack += [(m.tool_calls, 4) for m in getattr(parsed, "messages", ())]
    while stack:
        cur, d = stack.pop()
        if isinstance(cur, dict):
            if d > limit:
                return False
            stack.extend((v, d + 1) for v in cur.values())
        elif isinstance(cur, list):
            if d > limit:
                return False
            stack.extend((v, d + 1) for v in cur)
    return True


_EXTRA_BODY_FIELDS = ("tools", "tool_choice", "response_format")
_EXTRA_MESSAGE_FIELDS = ("name", "tool_call_id", "tool_calls")


def _extra_text(body: dict[str, Any]) -> str:
    """Compact JSON of the chat fields that become prompt tokens besides role and content ("" if none)."""
    extra: dict[str, Any] = {k: body[k] for k in _EXTRA_BODY_FIELDS if k in body}
    per_message = [
        {k: m[k] for k in _EXTRA_MESSAGE_FIELDS if k in m} for m in body.get("messages") or []
    ]
    if any(per_message):
        extra["messages"] = per_message
    if not extra:
        return ""
    return json.dumps(extra, ensure_ascii=False, separators=(",", ":"))


def _stop_bytes(stop: str | list[str] | None) -> int:
    """UTF-8 bytes of the ``stop`` sequences (0 if none); counted in the first sequence's prompt bytes."""
    items = [stop] if isinstance(stop, str) else stop or []
    return sum(len(s.encode("utf-8")) for s in items)


def json_items_bound(raw: bytes) -> int:
    """Upper bound on the JSON values in ``raw``: ``{`` + ``[`` + ``,`` bytes + 1.

    Every value after the first is preceded by a comma or opens its
    container; bytes inside strings only raise the count. Runs in C, before any decoding: the bytes a
    ``bytes.translate`` deleting those three removes, one pass (session 24, S23-review-3: three
    ``bytes.count`` passes cost ~3.5-4.3 ms per MB here, one translate ~0.7-1.4 ms; the same number).
    """
    return len(raw) - len(raw.translate(None, b",{[")) + 1


def _unforwardable(obj: Any) -> str | None:
    """Why ``obj`` (a validated body) cannot be forwarded as JSON, or None.

    ``"lone surrogate"``: a string (key or value) holds a lone UTF-16
    surrogate (from a JSON ``\\uD800``-style escape; it has no UTF-8 form).
    ``"non-finite number"``: ``NaN``, ``Infinity`` or an overflowing float
    (``1e999``) in a free-form field (tools, response_format, …); they are not
    JSON (RFC 8259 §6) and an encoder would send them as ``null``. Schema
    fields have already refused both with their own names."""
    stack = [obj]
    while stack:
        o = stack.pop()
        if isinstance(o, str):
            if not o.isascii():
                try:
                    o.encode("utf-8")
                except UnicodeEncodeError:
                    return "lone surrogate"
        elif isinstance(o, float):
            if not math.isfinite(o):
                return "non-finite number"
        elif isinstance(o, dict):
            stack.extend(o.keys())
            stack.extend(o.values())
        elif isinstance(o, list):
            stack.extend(o)
    return None


def parse_inference_request(raw: bytes, endpoint: Endpoint, max_depth: int = 32, *,
                            max_messages: int | None = None, max_batch_prompts: int | None = None,
                            max_json_items: int | None = None, max_tools: int | None = None,
                            max_free_values: int | None = None,
                            unknown_fields: UnknownFields = "refuse", json_schema: Any = None,
                            json_schema_tenant: Mapping[str, int | str | None] = _NO_OVERRIDES,
                            tenant_id: str = "") -> InferenceRequest:
    """Decode and validate an OpenAI request body for ``endpoint``.

    Raises :class:`GatewayError` 400 with code ``invalid_json`` (not UTF-8, not JSON, a ``NaN``/``Infinity``/
    ``-Infinity`` token anywhere (RFC 8259 §6; S21-newcomer-5), not an object, nested deeper than ``max_depth``),
    ``too_many_messages`` (more chat messages than ``max_messages``), ``too_many_content_parts`` (messages, each
    counted once per part of a list ``content`` and once per tool call, above ``max_messages``), ``number_too_long``
    (an integer literal of more than :data:`MAX_INT_DIGITS` digits anywhere, refused before conversion),
    ``batch_too_large`` (a list ``prompt`` of more than ``max_batch_prompts`` elements), ``too_many_tools`` /
    ``too_many_json_items`` (gateway/free_form.py: ``max_tools``, ``max_free_values``), ``json_schema_too_complex``
    (gateway/response_format.py: a chat ``response_format`` or a ``tools[].function.parameters`` over
    ``limits.json_schema``, with the tenant's ``json_schema_tenant`` overrides; None: not checked; ``tenant_id``: the
    key of the tenant's cached pattern counts, session 30) — all counted before schema validation —, ``too_many_json_items``
    (:func:`json_items_bound` above ``max_json_items``, counted before decoding) or
    ``invalid_request`` (schema violation; the message names the field, never
    its value), ``unsupported_parameter`` (``unknown_fields`` ``refuse``: a top-level field outside the schema,
    checked first after decoding; ``drop``: such fields are dropped unread and counted in
    :attr:`InferenceRequest.dropped`; gateway/unknown_fields.py). ``max_depth`` bounds the forwarded free-form
    fields (R6-1). Validation is strict: JSON types are not coerced (``"stream": "yes"``, ``"max_tokens": "12"``
    or ``12.0`` are refused, as OpenAI does), so the forwarded body is exactly what the schema says.
    """
    # the bound is at most len(raw) + 1: a body that short needs no count (issue 14)
    if max_json_items is not None and len(raw) >= max_json_items and json_items_bound(raw) > max_json_items:
        raise GatewayError(400, "too_many_json_items",
                           f"request body holds more than {max_json_items} JSON values")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise GatewayError(400, "invalid_json", "request body is not valid UTF-8") from None
    try:
        # = json.loads(text), faster; ``checked``: orjson read it (no lone surrogate, no non-finite number)
        data, checked = json_fast.loads_checked(raw, text, max_int_digits=MAX_INT_DIGITS, max_depth=max_depth,
                                                strict_numbers=True)
    except json_fast.IntegerTooLong:
        raise GatewayError(400, "number_too_long",
                           f"request body holds an integer of more than {MAX_INT_DIGITS} digits") from None
    except RecursionError:
        raise GatewayError(400, "invalid_json", "request body is nested too deeply") from None
    except json_fast.NonFiniteLiteral as exc:  # S21-newcomer-5: NaN/Infinity; S21-fixnew-2: 1e400 (NumberOutOfRange)
        # client_text: a NumberOutOfRange message quotes the literal (client text): never in the shared body cache
        raise GatewayError(400, "invalid_json", f"request body is not valid JSON: {exc}", client_text=True) from None
    except ValueError:
        raise GatewayError(400, "invalid_json", "request body is not valid JSON") from None
    if not isinstance(data, dict):
        raise GatewayError(400, "invalid_json", "request body must be a JSON object")
    # S22-newcomer-3: fields outside the schema; one set test for the plainest bodies (their keys only), which
    # also spares request_fast its own test of other schema fields (session 23)
    plain = (PLAIN_CHAT if endpoint == "chat" else PLAIN_COMPLETIONS).issuperset(data)
    if plain:
        dropped: DroppedFields = (0, "")
    else:
        known = KNOWN_CHAT if endpoint == "chat" else KNOWN_COMPLETIONS
        dropped = (0, "") if known.issuperset(data) else outside_schema(data, known, unknown_fields)
    messages, prompt = data.get("messages"), data.get("prompt")
    if endpoint == "chat" and max_messages is not None and isinstance(messages, list) and len(messages) > max_messages:
        raise GatewayError(400, "too_many_messages",
                           f"messages has {len(messages)} entries; this tenant's limit is {max_messages}",
                           param="messages", client_text=True)
    if endpoint == "chat" and max_messages is not None and isinstance(messages, list):
        # R4-1, R4b-2: content parts and tool calls count too (tenancy.bounds.chat_units); before the depth walk
        if (units := chat_units(messages)) > max_messages:
            raise GatewayError(400, "too_many_content_parts", f"messages hold {units} messages, content parts and "
                               f"tool calls together; this tenant's limit is {max_messages}",
                               param="messages", client_text=True)
    if (endpoint == "completions" and max_batch_prompts is not None and isinstance(prompt, list)
            and len(prompt) > max_batch_prompts):
        raise GatewayError(400, "batch_too_large",
                           f"prompt is a batch of {len(prompt)} prompts; this tenant's limit is {max_batch_prompts}",
                           param="prompt", client_text=True)
    if endpoint == "chat" and (refused := free_form_refusal(data, max_tools, max_free_values, len(raw))):
        raise refused  # S22-review-4: before the schema, the nesting walk, model_dump and the rendering
    if (endpoint == "chat" and json_schema is not None and "response_format" in data and (refused := (
            response_format_refusal(data["response_format"], json_schema, json_schema_tenant, len(raw), tenant_id)))):
        raise refused  # S23-fields-2: the replica's grammar compile, bounded before it is forwarded
    if (endpoint == "chat" and json_schema is not None and "tools" in data and (refused := (
            tools_refusal(data["tools"], json_schema, json_schema_tenant, len(raw), data.get("tool_choice"),
                          tenant_id)))):
        raise refused  # S24-fields-1, S25-review-3: each tool's parameters schema is compiled too
    fast = None if not checked else plain_chat(data, plain) if endpoint == "chat" else plain_completion(data, plain)
    if fast is not None:  # the commonest body, as the schema reads it (gateway/request_fast.py, issue 14)
        body, model, stream, max_tokens = fast, fast["model"], fast["stream"], fast.get("max_tokens")
        include_usage = bool(fast.get("stream_options", {}).get("include_usage"))
        if endpoint == "completions":  # one non-empty str prompt, no stop, no extra text (session 8):
            p = fast["prompt"]  # what the general path below gives; orjson read it: no lone surrogate
            return InferenceRequest(endpoint, model, stream, max_tokens, include_usage, body, p, (p,), "",
                                    (len(p.encode("utf-8")),), dropped=dropped)
    else:
        body, model, stream, max_tokens, include_usage = _validated(raw, data, endpoint, max_depth, checked)
    try:
        ptext = prompt_text(endpoint, body)
        if endpoint == "chat":
            prompts: tuple[str, ...] = (ptext,)
            extra = _extra_text(body)
        else:
            p = body["prompt"]
            prompts = (p,) if isinstance(p, str) else tuple(p)
            extra = ""
        # JSON escapes can carry lone surrogates, which no tokenizer can encode
        sizes = [len(t.encode("utf-8")) for t in prompts]
        sizes[0] += len(extra.encode("utf-8")) + _stop_bytes(body.get("stop"))
    except TokenizerError as exc:
        raise GatewayError(400, "invalid_request", str(exc)) from None
    except UnicodeEncodeError:
        raise GatewayError(400, "invalid_request", "the prompt contains invalid Unicode (a lone surrogate)") from None
    return InferenceRequest(
        endpoint=endpoint,
        model=model,
        stream=stream,
        max_tokens=max_tokens,
        include_usage=include_usage,
        body=body,
        text=ptext,
        prompts=prompts,
        extra_text=extra,
        prompt_bytes=tuple(sizes),
        prompt_logprobs=body.get("echo") is True and body.get("logprobs") is not None,
        dropped=dropped,
    )


def _validated(raw: bytes, data: dict[str, Any], endpoint: Endpoint, max_depth: int,
               checked: bool) -> tuple[dict[str, Any], str, bool, int | None, bool]:
    """Schema validation of a decoded body (pydantic, strict; unknown fields dropped unread):
    ``(body to forward, model, stream, max_tokens, include_usage)``. Raises :class:`GatewayError`
    400 ``invalid_request`` (schema; invalid Unicode or a non-finite number where ``checked`` is False)
    or ``invalid_json`` (nested deeper than ``max_depth``)."""
    model_cls = ChatBody if endpoint == "chat" else CompletionBody
    try:  # strict; unknown fields are dropped unread (extra="ignore")
        parsed = model_cls.model_validate(data)
    except ValidationError as exc:
        msg, loc = schema_error(exc)
        raise GatewayError(400, "invalid_request", msg, param=loc) from None
    if endpoint == "chat" and (where := function_name_error(parsed)) is not None:  # type: ignore[arg-type]
        raise GatewayError(400, "invalid_request", f"{where}: a function name must match {NAME_PATTERN} (OpenAI's "
                           "rule)", param=where, client_text=True)  # session 24, S23-newcomer-9
    # at most max_depth brackets in the whole body (strings too): nothing nests deeper, no walk (issue 14); counted
    # by one translate, not two bytes.count passes (session 24, S23-review-3: the same number, ~2x less CPU)
    if len(raw) - len(raw.translate(None, b"[{")) > max_depth and not _depth_ok(parsed, max_depth):
        raise GatewayError(400, "invalid_json", f"request body is nested deeper than {max_depth}")
    body = parsed.model_dump(exclude_none=True, exclude_unset=False)
    if body.get("n") == 1:
        body.pop("n")
    if body.get("best_of") == 1:  # as n: 1 is every engine's default (session 23)
        body.pop("best_of")
    body.pop("user", None)  # never forwarded as sent (the pipeline may put a pseudonym in its place)
    # checked here, so nothing fails after admission (orjson already refused both: gateway/json_fast.py)
    problem = None if checked else _unforwardable(body)
    if problem == "lone surrogate":
        raise GatewayError(400, "invalid_request", "the request contains invalid Unicode (a lone surrogate)")
    if problem is not None:
        raise GatewayError(400, "invalid_request", "the request holds a number that is not finite "
                           "(NaN, Infinity or out of range)")
    max_tokens = parsed.max_tokens
    if endpoint == "chat":
        mct = getattr(parsed, "max_completion_tokens", None)
        if mct is not None:
            max_tokens = mct if max_tokens is None else min(max_tokens, mct)
        body.pop("max_completion_tokens", None)
    include_usage = bool(parsed.stream_options and parsed.stream_options.include_usage)
    return body, parsed.model, parsed.stream, max_tokens, include_usage


def upstream_body(req: InferenceRequest, max_tokens: int, user: str | None) -> JsonObject:
    """The body sent upstream (a new dict; ``req.body`` is not changed): the client's, with the clamped
    ``max_tokens`` (tokens), the gateway's ``user`` (or none) and, when streaming, usage in the last chunk."""
    body = dict(req.body)
    body["max_tokens"] = max_tokens
    if user is not None:
        body["user"] = user
    if req.stream:
        body["stream_options"] = {"include_usage": True}
    return body
