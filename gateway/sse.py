"""Incremental Server-Sent Events scanner for upstream OpenAI streams.

The gateway passes a replica's SSE stream through to the client **byte for
byte**: the scanner reads the events to (a) learn ``usage`` (prompt,
completion and ``prompt_tokens_details.cached_tokens``) from the usage chunk,
(b) drop that chunk when the gateway added ``stream_options.include_usage``
itself, (c) count the output relayed (one token per choice per content delta
event: the ledger's estimate when no usage arrives, see
:mod:`tenancy.ledger`) and (d) notice a broken stream (an event that is not
JSON, an ``error`` object) so the client gets an error event instead of a
silent truncation. It never rewrites what it forwards: the bytes of each
complete event go out exactly as they came, line endings, comments and all;
the one exception (``drop_cached``, session 12, review R12-1) is an event whose
``usage`` holds ``prompt_tokens_details.cached_tokens``: it goes out written
again without it, as ``data: {...}`` and a blank line
(:func:`gateway.usage_privacy.event_without_cached`), while :attr:`SseScanner.usage`
keeps the true value for the gateway. Lines a client has no use for are not forwarded either (session
13, review R12b-7): a field other than ``data``, ``event``, ``id`` and ``retry`` (which SSE clients
ignore, raw readers do not: a replica could put a usage object there) and, with ``drop_cached``, a
comment or field naming ``cached`` (any case) or holding a ``\\u`` escape (a key spelt
``"cached\\u005ftokens"``: session 14, review RV2-1): such an event goes out written again, its
``event``/``id``/``retry`` lines that are kept, then its ``data`` lines (``data: ...``), then a blank
line (session 14, RV2-5: the event type and id survive), and one without either not at all; an event
whose usage is written again keeps its ``event``/``id``/``retry`` lines the same way. With
``drop_cached``, a data event whose bytes name ``"cached_tokens"`` or hold a ``\\u`` escape (a duplicated
``usage`` key whose first value holds the counter: the parse keeps the last, some clients the first;
session 15, R14-2: a copy below the top level) goes out written again from its parse without any
``cached_tokens`` key (:func:`gateway.usage_privacy.event_for_drop`, RV2-1). A tenant cannot
produce either (model output reaches the stream inside a JSON string of a ``data`` line, where a line
break is escaped); only a replica can, and the replica is trusted with the answer, not with what the
gateway promises tenants about ``cached_tokens``.

Parsing follows the WHATWG HTML standard, "Server-sent events", §9.2.6
"Interpreting an event stream": lines end with CRLF, a lone LF or a lone CR
(a CR that ends one chunk and an LF that starts the next are one CRLF); a
line starting with ``:`` is a comment; ``field:value`` drops one space after
the colon, if there is one (``data:{`` and ``data: {`` are the same); the
``data`` lines of an event are joined with LF; a blank line dispatches the
event; an event with no ``data`` line dispatches nothing; a UTF-8 BOM at the
very start of the stream is ignored.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from gateway import json_fast
from gateway.sse_events import ends_choice as _ends_choice, has_output as _has_output
from gateway.sse_shape import EventShape, learn_shape
from gateway.usage_privacy import event_for_drop, may_name_cached

__all__ = ["DONE", "SseProtocolError", "SseScanner"]

DONE = b"data: [DONE]\n\n"
_EOL = re.compile(rb"\r\n|\r|\n")
_BOM = b"\xef\xbb\xbf"
#: the fields a client may use besides ``data`` (WHATWG §9.2.6); any other field line is not forwarded
_PLAIN_FIELDS = frozenset((b"event", b"id", b"retry"))
_CACHED = b"cached"  # any case: a line is lowered first (RV2-1)
#: delta-event shapes one stream may learn (a stream whose events never match stops trying; session 21)
_MAX_LEARNS = 3
_TOO_LARGE = "upstream event too large"
_ESCAPE = b"\\u"  # a JSON escape: the line's bytes need not spell its keys (RV2-1)


def _names_counter(line: bytes) -> bool:
    """Whether a non-data line may carry ``cached_tokens`` to a raw reader: it holds ``cached`` in any
    case or a ``\\u`` escape (review RV2-1; such lines are rare: keep-alives and event ids do not)."""
    return _CACHED in line.lower() or _ESCAPE in line


class SseProtocolError(Exception):
    """The upstream stream is not valid OpenAI SSE (bad JSON, error event, oversize event, or, for a
    ``drop_cached`` tenant, an event to be written again that cannot be: a lone surrogate, S21-stream-1).

    ``forward``: the complete, valid events of the same :meth:`SseScanner.feed`
    call that came before the bad one (forward them, then the error).
    """

    forward: bytes = b""


@dataclass(slots=True)
class SseScanner:
    """Feed upstream bytes, get back the bytes to forward (unchanged).

    ``keep_usage_chunk``: forward the usage-only chunk (the client asked for
    it). ``drop_cached``: forward usage without ``prompt_tokens_details.cached_tokens``
    (module doc). ``max_event_bytes``: an event larger than this is a protocol error.
    After the stream, ``usage`` holds the last usage object seen (or None),
    ``done`` whether ``[DONE]`` arrived, ``events`` the count of data events
    and ``output_tokens`` the output relayed (estimate: one per choice with
    non-empty ``text``, ``delta.content``, ``delta.reasoning_content`` or
    ``delta.tool_calls`` per forwarded event). ``shapes``: from its second data event on, learn the
    stream's delta-event shape and read the whole events of that shape at the start of a read without a
    JSON parse (:mod:`gateway.sse_shape`, session 21: same forwarded bytes, state, counts, usage and
    errors; a read naming ``cached_tokens`` or holding ``\\u`` is parsed as before for ``drop_cached``;
    False: every event is parsed, the reference tests/gateway/test_s21_sse_shape.py compares with).
    """

    keep_usage_chunk: bool = True
    drop_cached: bool = False
    max_event_bytes: int = 1 << 20
    usage: dict[str, Any] | None = None
    done: bool = False
    events: int = 0
    output_tokens: int = 0
    _buf: bytearray = field(default_factory=bytearray)  # raw bytes of the event being read
    _pos: int = 0  # parse position in _buf (lines before it are read)
    _data: list[bytes] = field(default_factory=list)  # data lines of the current event
    _cr_end: bool = False  # the last byte read was a CR that ended a line: an LF next belongs to it
    _cr_dispatched: int = 0  # that CR ended an event: 1 kept (forward the LF), 2 dropped (drop it)
    _started: bool = False
    _special: bool = False  # the current event holds a field line other than data, or a withheld line
    _withhold: bool = False  # the current event holds a line that is not forwarded (module doc, R12b-7)
    _fields: list[bytes] = field(default_factory=list)  # its event/id/retry lines kept (RV2-5)
    shapes: bool = True
    _shape: EventShape | None = None  # the learnt delta-event shape (gateway/sse_shape.py)
    _learns: int = _MAX_LEARNS  # shapes still to learn on this stream (each costs a parse of a probe)

    def feed(self, chunk: bytes) -> bytes:
        """Consume ``chunk``; return the complete events to forward (possibly b""), unchanged.

        Raises :class:`SseProtocolError` on an invalid event.
        """
        if (self._started and not self._buf and not self._cr_end and not self._data and type(chunk) is bytes
                and b"\r" not in chunk):
            shape = self._shape
            if shape is not None and not (self.drop_cached and may_name_cached(chunk)):
                events, tokens, read = shape.read(chunk)  # session 21: delta events of the learnt shape, unparsed
                if read:
                    self.events += events
                    self.output_tokens += tokens
                    if read == len(chunk):
                        return chunk
                    return self._feed_lf(chunk, read)  # the rest parsed, as if the whole read were (S21-shapereview-1)
            return self._feed_lf(chunk)  # the common case: whole LF-only events (session 9)
        if self._shape is not None and self._buf and not self._cr_end and type(chunk) is bytes and b"\r" not in chunk:
            return self._feed_split(chunk)  # session 28: an event split across reads, then whole events
        return self._feed_general(chunk)

    def _feed_split(self, chunk: bytes) -> bytes:
        """:meth:`feed` of an LF-only ``chunk`` that continues the event buffered from the last read, once a shape
        is learnt (session 28): the chunk up to that event's blank line is read as before (:meth:`_feed_general`),
        the rest, which starts at an event boundary with nothing pending, by :meth:`feed` (its whole delta events
        by the learnt shape, without a parse). Same forwarded bytes, counts, usage and errors as
        :meth:`_feed_general` of the whole chunk, and the same state after an error (the chunk buffered, nothing
        consumed; tests/gateway/test_s21_sse_shape.py and test_s21_shapereview.py compare with ``shapes=False``).
        Before, one split event sent every event of every later read of the stream to the parse until a read
        ended at a boundary."""
        buf = self._buf
        if buf[-1:] == b"\n" and chunk[:1] == b"\n":
            end = 1  # the buffered lines end with LF: this LF is the blank line
        else:
            end = chunk.find(b"\n\n") + 2
            if end < 2:
                return self._feed_general(chunk)  # the split event goes on
        if chunk.find(b"\n\n", end) < 0:
            return self._feed_general(chunk)  # no whole event after the split one: nothing for the shape to read
        before, pos = bytes(buf), self._pos
        try:
            out = self._feed_general(chunk[:end])
        except SseProtocolError:
            self._buf, self._pos = bytearray(before + chunk), pos  # as one general read of the chunk leaves it
            raise
        if self._buf or self._data or self._cr_end:  # not at an event boundary (cannot happen: defensive)
            return out + self._feed_general(chunk[end:])
        try:
            return out + self.feed(chunk[end:])
        except SseProtocolError as exc:
            exc.forward = out + exc.forward
            if str(exc) != _TOO_LARGE:  # a bad event: the whole chunk buffered (else its tail is, as read)
                self._buf, self._pos = bytearray(before + chunk), pos
            raise

    def _feed_general(self, chunk: bytes) -> bytes:
        """:meth:`feed` for any chunk in any state (line ends CRLF, LF or CR; a CR split from its LF;
        the BOM; a partial line or event buffered)."""
        out: list[bytes] = []
        if self._cr_end and chunk:
            self._cr_end = False
            if chunk[:1] == b"\n":  # the second half of a CRLF split across chunks
                chunk = chunk[1:]
                if self._cr_dispatched == 1:
                    out.append(b"\n")
                elif self._cr_dispatched == 0:
                    self._buf += b"\n"
                    self._pos += 1
            self._cr_dispatched = 0
        if not self._started and chunk:
            if len(self._buf) + len(chunk) < 3 and _BOM.startswith(bytes(self._buf) + chunk):
                self._buf += chunk  # could still be a BOM: wait for more
                return b"".join(out)
            self._started = True
            self._buf += chunk
            if self._buf.startswith(_BOM):
                self._pos = 3
        else:
            self._buf += chunk
        buf = self._buf
        start = 0  # start of the current event's raw bytes in buf
        pos = self._pos
        while True:
            m = _EOL.search(buf, pos)
            if m is None:
                break
            line = bytes(buf[pos:m.start()])
            end = m.end()
            if m.group() == b"\r" and end == len(buf):
                self._cr_end = True  # an LF may follow in the next chunk
            if line:
                self._field(line)
                pos = end
                continue
            pos = end
            try:
                keep = self._dispatch()
            except SseProtocolError as exc:
                exc.forward = b"".join(out)
                raise
            if keep:
                out.append(bytes(buf[start:end]) if keep is True else keep)
            if self._cr_end:
                self._cr_dispatched = 1 if keep is True else 2  # a rewritten event's CRLF: its own ending
            start = end
        if start:
            del buf[:start]
            pos -= start
        self._pos = pos
        if len(buf) > self.max_event_bytes:
            raise _too_large(out)
        return b"".join(out)

    def _feed_lf(self, chunk: bytes, read: int = 0) -> bytes:
        """:meth:`feed` of a ``chunk`` without CR when nothing is pending (no partial line or event, no CR
        just read, the BOM check done): its lines end with LF only, so they are ``chunk.split(b"\n")``
        (no regular expression, no copy per line); same fields, dispatches, forwarded bytes, errors and
        state as the general path (tests/gateway/test_s9_sse_lf.py compares them). ``read``: the length of
        the whole events at its start already read by the learnt shape (counted, forwarded as received);
        the rest is read here, and an error's ``forward`` and the buffer are those of the whole chunk
        (session 21, S21-shapereview-1: the shape path's own handling buffered the read events on an
        oversize event).

        Session 16 (S15-3): with ``drop_cached``, every event dispatched here has its data lines in
        ``chunk`` (nothing was pending), and an event's data is its lines' values joined with LF, which
        is in neither ``"cached_tokens"`` nor ``\\u``: when ``chunk`` holds neither
        (:func:`gateway.usage_privacy.may_name_cached`, searched once), no event of it does, and their
        own two searches (:func:`gateway.usage_privacy.event_for_drop`) are skipped (same outcome)."""
        out: list[bytes] = [chunk[:read]] if read else []
        lines = (chunk[read:] if read else chunk).split(b"\n")
        start = pos = read
        clean: bool | None = None  # drop_cached: the chunk names no counter (searched once, at its first event)
        for line in lines[:-1]:  # the last piece has no LF: the start of a line still being read
            pos += len(line) + 1
            if line:
                if line[:1] != b":":  # not a comment (as _field)
                    name, sep, value = line.partition(b":")
                    if name == b"data":
                        self._data.append(value[1:] if sep and value[:1] == b" " else value)
                    else:
                        self._other(name, line)
                elif self.drop_cached and _names_counter(line):
                    self._special = self._withhold = True
                continue
            if clean is None:
                clean = self.drop_cached and not may_name_cached(chunk)
            try:
                keep = self._dispatch(clean)
            except SseProtocolError as exc:
                exc.forward = b"".join(out)
                self._buf += chunk  # as the general path leaves it: the chunk buffered, nothing consumed
                raise
            if keep:
                out.append(chunk[start:pos] if keep is True else keep)
            start = pos
        if start < len(chunk):  # a partial event (or line) stays buffered, its complete lines read
            self._buf += chunk[start:] if start else chunk
            self._pos = pos - start
            if len(self._buf) > self.max_event_bytes:
                raise _too_large(out)
        return out[0] if len(out) == 1 else b"".join(out)

    def finish(self) -> bytes:
        """Check the end of the stream; return the last bytes to forward (whitespace after
        the last event, as received). Raises :class:`SseProtocolError` if incomplete."""
        if self._buf.strip() or self._data:
            raise SseProtocolError("upstream stream ended inside an event")
        if not self.done:
            raise SseProtocolError("upstream stream ended without [DONE]")
        rest, self._buf = bytes(self._buf), bytearray()
        return rest

    def _field(self, line: bytes) -> None:
        if line[:1] == b":":  # comment
            if self.drop_cached and _names_counter(line):
                self._special = self._withhold = True
            return
        name, sep, value = line.partition(b":")
        if sep and value[:1] == b" ":
            value = value[1:]
        if name == b"data":
            self._data.append(value)
        else:
            self._other(name, line)

    def _other(self, name: bytes, line: bytes) -> None:
        """A field line other than ``data`` (``name``: its field name): kept for the event's dispatch when
        it is ``event``/``id``/``retry`` and does not name the counter (``drop_cached``), else withheld."""
        self._special = True
        if name in _PLAIN_FIELDS and not (self.drop_cached and _names_counter(line)):
            self._fields.append(line)
        else:
            self._withhold = True

    def _dispatch(self, clean: bool = False) -> bool | bytes:
        """End of an event: check it; return whether to forward it (True: as received), or the
        bytes to forward instead (its usage without ``cached_tokens``: ``drop_cached``; its data lines
        alone: a withheld line, module doc). ``clean``: the caller found that the event's data names no
        ``"cached_tokens"`` and holds no ``\\u`` (:meth:`_feed_lf`), so it is not searched again."""
        if self._special:
            return self._dispatch_special()
        if not self._data:
            return True  # comments / retry / id / event lines only
        payload = b"\n".join(self._data)
        self._data = []
        if not payload:
            return True  # an empty data buffer dispatches nothing (WHATWG §9.2.6)
        if payload == b"[DONE]":
            self.done = True
            return True
        self.events += 1
        try:
            obj = json_fast.loads(payload)  # = json.loads(payload), orjson's speed (one parse per event)
        except ValueError:
            raise SseProtocolError("upstream sent an event that is not JSON") from None
        if not isinstance(obj, dict):
            raise SseProtocolError("upstream sent an event that is not a JSON object")
        if "error" in obj:
            raise SseProtocolError("upstream sent an error event")
        choices = obj.get("choices")
        usage = obj.get("usage")
        if isinstance(usage, dict):
            self.usage = usage
            if not choices and not self.keep_usage_chunk:
                return False
        if self.drop_cached and not clean:  # R14-2: whatever its top-level keys (a nested copy)
            try:
                rewritten = event_for_drop(payload, obj, usage)  # R12-1; RV2-1: a duplicated / escaped key
            except (RecursionError, ValueError, TypeError):  # S21-stream-1: a lone surrogate (as S15-6's plain path)
                raise SseProtocolError("upstream sent an event that cannot be written again") from None
            if rewritten is not None:
                if isinstance(choices, list):
                    self.output_tokens += sum(1 for c in choices if _has_output(c))
                return rewritten
        if isinstance(choices, list):
            self.output_tokens += sum(1 for c in choices if _has_output(c))
            # session 21: learnt from the second data event on; session 24: not from an event ending its choice
            # (one choice, finish_reason set: its stream has no more delta events of that shape to read)
            if self._learns and self.events > 1 and self.shapes and not _ends_choice(choices):
                self._learns -= 1
                self._shape = learn_shape(payload, obj, _has_output) or self._shape
        return True

    def _dispatch_special(self) -> bool | bytes:
        """:meth:`_dispatch` of an event holding a field line other than ``data`` or a withheld line
        (review R12b-7): as received when nothing is withheld and its data is not written again; else its
        kept ``event``/``id``/``retry`` lines (RV2-5) before its data lines (``data: ...`` each, the same
        data for a client) or what :meth:`_dispatch` writes instead, then a blank line; False (nothing
        forwarded) when neither is left."""
        withheld, fields, lines = self._withhold, self._fields, self._data
        self._special = self._withhold = False
        if fields:
            self._fields = []
        if not lines:
            if not withheld:
                return True  # comments / retry / id / event lines only
            return b"".join([f + b"\n" for f in fields]) + b"\n" if fields else False
        keep = self._dispatch()
        if keep is True:
            if not withheld:
                return True
            keep = b"".join([b"data: " + d + b"\n" for d in lines]) + b"\n"
        elif keep is False or not fields:
            return keep
        return b"".join([f + b"\n" for f in fields]) + keep


def _too_large(out: list[bytes]) -> SseProtocolError:
    """The error for an event past ``max_event_bytes``; its ``forward``: the read's events before it (``out``,
    checked and dispatched; S21-shapereview-2: they were dropped)."""
    exc = SseProtocolError(_TOO_LARGE)
    exc.forward = b"".join(out)
    return exc
