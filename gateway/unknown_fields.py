"""Top-level body fields outside the request schema: refused or dropped, never silently (session 23).

A client that sends a field the schema (gateway/request_schema.py) does not model, say vLLM's ``guided_json``
or ``chat_template_kwargs``, used to get a 200 without the field's effect and no sign of it (S22-newcomer-3).
``limits.unknown_fields`` chooses what happens instead:

* ``refuse`` (the default): 400 ``unsupported_parameter`` before schema validation, as OpenAI answers
  ("Unrecognized request argument supplied: X"); ``param`` names the first such field, the message at most
  :data:`MAX_NAMED` of them; the audit event carries the code and the count, never a name (a name is client
  text and may carry prompt text);
* ``drop``: the request goes on without them (as vLLM does, with a warning in its log); the answer's
  :data:`DROPPED_COUNT_HEADER` says how many were dropped and :data:`DROPPED_HEADER` names the first ones,
  within :data:`MAX_HEADER_NAME_BYTES`.

Every name the client sees is bounded (:data:`MAX_NAME_CHARS` characters of the name) and escaped (JSON
string escapes, ASCII only: a control character, a quote, a backslash, a comma or a non-ASCII character
cannot break a header or a list). :data:`GATEWAY_OWNED` fields are not unknown: the gateway sets them itself
(``cache_salt``: the tenant's own salt replaces the client's; docs/configuration.md).
Only the top level is checked: keys nested in a message or a content part are ignored as before (clients
send whole answer messages back, with ``refusal``, ``annotations``...).
"""

from __future__ import annotations

import json
from typing import Any, Literal

from gateway.errors import GatewayError
from gateway.request_fast import FAST_CHAT_KEYS, FAST_KEYS
from gateway.request_schema import ChatBody, CompletionBody

__all__ = ["UnknownFields", "GATEWAY_OWNED", "KNOWN_CHAT", "KNOWN_COMPLETIONS", "PLAIN_CHAT", "PLAIN_COMPLETIONS", "MAX_NAMED", "MAX_NAME_CHARS", "MAX_LABEL_CHARS",
           "MAX_HEADER_NAME_BYTES", "DROPPED_HEADER", "DROPPED_COUNT_HEADER", "DroppedFields", "outside_schema",
           "field_label", "dropped_headers"]

UnknownFields = Literal["refuse", "drop"]
#: fields the gateway sets itself: accepted in both modes, the client's value replaced
GATEWAY_OWNED = frozenset({"cache_salt"})
KNOWN_CHAT = frozenset(ChatBody.model_fields) | GATEWAY_OWNED
KNOWN_COMPLETIONS = frozenset(CompletionBody.model_fields) | GATEWAY_OWNED
#: the keys of the plainest bodies (gateway/request_fast.py) plus :data:`GATEWAY_OWNED`: a body whose keys are all
#: here has neither an unknown field nor another schema field, found with one set test (session 23: the check
#: above costs the plain request nothing more than request_fast's own test did)
PLAIN_CHAT = FAST_CHAT_KEYS | GATEWAY_OWNED
PLAIN_COMPLETIONS = FAST_KEYS | GATEWAY_OWNED
#: names in one refusal message (the rest counted)
MAX_NAMED = 8
#: characters of one name shown (a longer name is cut and marked with ``...``), before escaping
MAX_NAME_CHARS = 64
#: escaped characters of one name at most (a ``\\uXXXX`` escape per character of :data:`MAX_NAME_CHARS`)
MAX_LABEL_CHARS = 6 * MAX_NAME_CHARS
#: bytes of the names in :data:`DROPPED_HEADER` (one label is at most MAX_LABEL_CHARS + 3 bytes: the first always fits)
MAX_HEADER_NAME_BYTES = 512
DROPPED_HEADER = "X-PrefixGate-Dropped-Fields"
DROPPED_COUNT_HEADER = "X-PrefixGate-Dropped-Fields-Count"

#: ``(count, header value)`` of a request's dropped fields; ``(0, "")``: none
DroppedFields = tuple[int, str]


def outside_schema(data: dict[str, Any], known: frozenset[str], mode: UnknownFields) -> DroppedFields:
    """What to do with ``data``'s top-level keys outside ``known`` (:data:`KNOWN_CHAT` or
    :data:`KNOWN_COMPLETIONS`), called once some key is outside it.

    ``mode`` ``refuse``: raises :class:`GatewayError` 400 ``unsupported_parameter`` (``param``: the first such
    field's :func:`field_label`; message: at most :data:`MAX_NAMED` labels and how many more; record
    ``reason``: the count only). ``drop``: returns ``(count, header value)``: the value lists labels, comma
    separated, while they fit in :data:`MAX_HEADER_NAME_BYTES`. The fields themselves are never read here.
    Keys keep the body's order (a dict's). O(keys)."""
    names = [k for k in data if k not in known]
    count = len(names)
    if mode == "drop":
        return count, _header_names(names)
    labels = [field_label(n) for n in names[:MAX_NAMED]]
    more = f" (and {count - MAX_NAMED} more)" if count > MAX_NAMED else ""
    noun = "argument" if count == 1 else "arguments"
    message = (f"Unrecognized request {noun} supplied: {', '.join(labels)}{more}; this gateway forwards only the "
               f"fields of its request schema (docs/configuration.md, limits.unknown_fields)")
    raise GatewayError(400, "unsupported_parameter", message, param=labels[0],
                       record={"reason": f"{count} field(s) outside the request schema"}, client_text=True)


def field_label(name: str) -> str:
    """``name`` (a client's JSON key) as shown to the client: its first :data:`MAX_NAME_CHARS` characters
    (``...`` marks a cut), JSON-escaped to ASCII (``\\uXXXX`` for control, non-ASCII and lone surrogate
    characters; ``\\"``, ``\\\\``), with ``,`` as ``\\u002c`` and DEL as ``\\u007f``, cut further while the
    escaped form is longer than :data:`MAX_LABEL_CHARS` (characters beyond U+FFFF escape to 12 each); the empty
    key as ``""``: printable ASCII, never empty, at most :data:`MAX_LABEL_CHARS` + 3 characters."""
    if not name:
        return '""'  # the empty key, visible (a quote inside a name is always escaped)
    cut = name[:MAX_NAME_CHARS]
    label = _escaped(cut)
    while len(label) > MAX_LABEL_CHARS:  # a character beyond U+FFFF escapes to 12 (a UTF-16 surrogate pair)
        cut = cut[:-1]
        label = _escaped(cut)
    return label + "..." if len(cut) < len(name) else label


def _escaped(text: str) -> str:
    """``text`` JSON-escaped to printable ASCII without ``,`` (see :func:`field_label`)."""
    return json.dumps(text, ensure_ascii=True)[1:-1].replace(",", "\\u002c").replace("\x7f", "\\u007f")


def _header_names(names: list[str]) -> str:
    """Labels of ``names`` joined by ``,`` while they fit in :data:`MAX_HEADER_NAME_BYTES` (the first always)."""
    out: list[str] = []
    size = 0
    for n in names[:MAX_NAMED]:
        label = field_label(n)
        size += len(label) + (1 if out else 0)
        if out and size > MAX_HEADER_NAME_BYTES:
            break
        out.append(label)
    return ",".join(out)


def dropped_headers(dropped: DroppedFields) -> list[tuple[str, str]]:
    """The answer headers of a request whose fields were dropped (``[]`` if none): the count, then the names."""
    count, names = dropped
    if not count:
        return []
    return [(DROPPED_COUNT_HEADER, str(count)), (DROPPED_HEADER, names)]
