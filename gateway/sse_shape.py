"""A stream's delta-event shape: its events read without a JSON parse (issue 14, session 21).

A replica streams hundreds of tokens as events that differ only in the generated text: completions'
``data: {"id":"cmpl-1","object":"text_completion","created":1,"model":"m","choices":[{"index":0,
"text":" a b c","logprobs":null,"finish_reason":null}]}`` and chat's ``"delta":{"content":" a b c"}``.
:class:`gateway.sse.SseScanner` parsed each (orjson, ~10 objects made and freed) only to learn that
it is a JSON object without ``error`` or a ``usage`` object and how many choices carry output. In
process this reads a 16-token delta in ~2.8 µs instead of ~7 (a 32-event stream: 4.2 instead of 6.5 µs
per event); end to end the saving is within the bench's noise (a stubbed scan's ceiling was ~20 % of a
streamed event's gateway CPU; docs/benchmarks.md "Session 21: stream").

:func:`learn_shape` takes one parsed event and splits its data as ``head + text + tail`` where ``text``
is the JSON string token of the varying field (``choices[0].text`` or ``choices[0].delta.content``);
:meth:`EventShape.read` then reads the events ``data: head STRING tail\\n\\n`` at the start of a read
with ``STRING`` a JSON string token without escapes, control bytes or invalid UTF-8: such an event
parses to the learnt object with only that string changed (JSON's grammar: one string token replaced
by another), so the scan's outcome is known without the parse: a JSON object, no ``error``, the same
``usage`` (not an object), the output count of the learnt choice with that text (empty or not).

Why the split is exact (checked once per learnt shape, never assumed): the data is one line (no LF or
CR: on the wire a second line of it would be a field line of its own, not data); ``head`` holds no backslash
and an even number of ``"`` (it ends outside every string) and ends with ``:`` and JSON blanks (the
next token is a value); ``text`` is a complete string token there; and the data with the token
replaced by a sentinel string parses to the learnt object with exactly that field replaced (so the
token is that field's and no other's). Anything else (escapes in the text, a finish reason, a usage
event, another key order) is not matched and goes to the scanner's parse, as before. A shape belongs
to one stream's scanner only (nothing shared between requests or tenants).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Callable

from gateway import json_fast

__all__ = ["EventShape", "learn_shape"]

#: a JSON string token without escapes or control bytes (RFC 8259 §7: those are the only bytes it needs escaped)
_PLAIN_STRING = re.compile(rb'"[^"\\\x00-\x1f]*"')
#: the same token in ASCII only (session 24: such a token needs no UTF-8 check, so no copy of its text)
_PLAIN_ASCII = re.compile(rb'"[\x20\x21\x23-\x5b\x5d-\x7f]*"')
_DATA = b"data: "
_END = b"\n\n"
_BLANKS = b" \t\n\r"  # JSON's whitespace (RFC 8259 §2)
_SENTINEL = "\x00prefixgate-shape\x00"  # holds control bytes: never a plain string token of an event
_MAX_TRIES = 3  # occurrences of the text token tried when learning (from the right)


@dataclass(frozen=True, slots=True)
class EventShape:
    """One learnt event shape: ``head`` (``data: `` and the data before the text token), ``tail`` (the data
    after it and the blank line), ``counts`` (output tokens of the event when its text is empty, and not)."""

    head: bytes
    tail: bytes
    counts: tuple[int, int]

    def read(self, chunk: bytes) -> tuple[int, int, int]:
        """Read the whole events of this shape at the start of ``chunk`` (bytes, LF line ends), up to the
        first that has not this shape (module doc) or is not whole: ``(events, output tokens, bytes read)``,
        the counts the scanner's parse would give for ``chunk[:bytes read]``; ``(0, 0, 0)`` when the first
        event is not one of them (parse it). An event of this shape is one ``data`` line: it ends at the first
        blank line after its start."""
        head, tail, counts = self.head, self.tail, self.counts
        h, t = len(head), len(tail)
        pos = events = tokens = 0
        size = len(chunk)
        while pos < size:
            end = chunk.find(_END, pos) + 2
            if end < 2 or not (chunk.startswith(head, pos) and chunk.endswith(tail, pos, end)):
                break
            start, stop = pos + h, end - t
            if stop - start < 2:
                break
            if _PLAIN_ASCII.fullmatch(chunk, start, stop) is None:  # not plain ASCII: the general check
                if _PLAIN_STRING.fullmatch(chunk, start, stop) is None:
                    break
                try:
                    chunk[start + 1:stop - 1].decode()  # json.loads reads UTF-8 (surrogatepass): strict UTF-8 is within
                except UnicodeDecodeError:
                    break
            tokens += counts[1] if stop - start > 2 else counts[0]
            events += 1
            pos = end
        return events, tokens, pos


def learn_shape(payload: bytes, obj: dict[str, Any], has_output: Callable[[Any], bool]) -> EventShape | None:
    """The shape of a data event (``payload``: its data, whose parse is the dict ``obj``), or None when it
    has none (module doc: one choice whose text or delta content is a string written without escapes,
    no ``error``, no ``usage`` object). ``has_output``: the scanner's rule for one choice (it is called
    on ``obj``'s choice with the text replaced by ``""`` and by ``"x"``). ``obj`` is changed during the
    call and restored before it returns. Never raises for any parse of ``payload``."""
    choices = obj.get("choices")
    if type(choices) is not list or len(choices) != 1 or type(choices[0]) is not dict or "error" in obj:
        return None
    if isinstance(obj.get("usage"), dict) or b"\\" in payload or b"\n" in payload or b"\r" in payload:
        return None  # an escape in the envelope; data of several lines (an event of this shape is one line)
    choice = choices[0]
    holder: dict[str, Any] = choice
    key = "text"
    if type(choice.get("text")) is not str:
        delta = choice.get("delta")
        if type(delta) is not dict or type(delta.get("content")) is not str:
            return None
        holder, key = delta, "content"
    text = holder[key]
    token = b'"' + text.encode("utf-8", "surrogatepass") + b'"'
    if _PLAIN_STRING.fullmatch(token) is None:
        return None
    at = len(payload)
    for _ in range(_MAX_TRIES):
        at = payload.rfind(token, 0, at)
        if at < 0:
            return None
        head, tail = payload[:at], payload[at + len(token):]
        if head.count(b'"') % 2 == 0 and head.rstrip(_BLANKS).endswith(b":") and _is_field(head, tail, obj, holder, key):
            try:
                holder[key] = ""
                empty = has_output(choice)
                holder[key] = "x"
                full = has_output(choice)
            finally:
                holder[key] = text
            return EventShape(_DATA + head, tail + _END, (int(empty), int(full)))
    return None


def _is_field(head: bytes, tail: bytes, obj: dict[str, Any], holder: dict[str, Any], key: str) -> bool:
    """Whether the string token between ``head`` and ``tail`` is ``holder[key]`` of ``obj``: the data with a
    sentinel there parses to ``obj`` with exactly that field set to the sentinel."""
    try:
        probe = json_fast.loads(head + json_fast.dumps(_SENTINEL) + tail)
    except (ValueError, RecursionError):
        return False
    text = holder[key]
    holder[key] = _SENTINEL
    try:
        return bool(probe == obj)
    finally:
        holder[key] = text
