"""``json.loads`` of bytes with orjson's speed where orjson gives the same answer.

:func:`loads` returns exactly what :func:`json.loads` returns and raises
exactly what it raises (hypothesis: tests/gateway/test_s2_json_fast.py).
orjson answers the common case; the documents where it could differ go to
:func:`json.loads`, whose value or error stands:

* anything orjson refuses — invalid JSON, but also what only :mod:`json`
  reads: ``NaN``/``Infinity``, ``1e400``, lone surrogate escapes, a
  byte-order mark, UTF-16/32 bytes;
* a run of 19 or more digits anywhere (orjson reads an integer beyond 64
  bits as a float, :mod:`json` as an int);
* more than :data:`MAX_FAST_NESTING` opening brackets (:mod:`json`'s
  recursion limit then applies as before; orjson nests to 1024 levels).

:func:`loads_checked` with ``max_int_digits`` (session 4, R4-2) refuses an
integer literal of more than that many digits with :class:`IntegerTooLong`
instead of decoding it: CPython's str->int (and a later int->str) is
quadratic in the digits (~20 ms for 240 integers of 4,299 digits). Digit runs
inside strings and float literals (linear to read) are not affected. Since
session 5 (review R4b-2) it looks for long runs outside strings only
(:func:`_digits_outside_strings`): a 21-digit run inside a string sent the
whole body to :mod:`json` with a Python ``parse_int`` call per integer
(60,000 small integers: 0.6 -> 12 ms); an integer literal of more digits outside
strings is refused before anything is decoded (:func:`_integer_literal`), so a
document that :mod:`json` finds broken before that literal now answers
:class:`IntegerTooLong` too.
"""
from __future__ import annotations

import json
import re
from functools import lru_cache
from typing import Any, Callable

import orjson

# the strict-number rule (NaN/Infinity, numbers beyond a double) is policy.json_numbers' (shared with the
# policy admin API, S22-fixops-1); its names stay importable from here
from policy.json_numbers import NonFiniteLiteral, NumberOutOfRange, finite_float, refuse_constant

__all__ = ["MAX_FAST_NESTING", "IntegerTooLong", "NonFiniteLiteral", "NumberOutOfRange", "dumps", "loads", "loads_answer",
           "loads_checked", "loads_object"]

#: At most this many ``[`` plus ``{`` bytes for the orjson path (far below the
#: depth at which :func:`json.loads` raises ``RecursionError``).
MAX_FAST_NESTING = 256
# digits -> "0", every other byte -> ".": a run of 19 digits becomes _LONG_RUN
_DIGITS = bytes(0x30 if 0x30 <= i <= 0x39 else 0x2E for i in range(256))
_LONG_RUN = b"0" * 19
_FAILED = object()  # orjson refused the document
_FLAT = frozenset({str, int, bool, type(None)})  # values of a flat object that cannot hide a misread integer


class IntegerTooLong(ValueError):
    """An integer literal has more digits than the caller's ``max_int_digits`` (its sign aside)."""

    def __init__(self, max_digits: int) -> None:
        super().__init__(f"an integer literal has more than {max_digits} digits")
        self.max_digits = max_digits


def _bounded_int(max_digits: int) -> Callable[[str], int]:
    def parse_int(literal: str) -> int:
        if len(literal) - literal.startswith("-") > max_digits:
            raise IntegerTooLong(max_digits)
        return int(literal)
    return parse_int


def _outside_strings(data: bytes, mapped: bytes) -> bytes | None:
    """``data`` without the contents of its strings (each string becomes one blank), or None.

    ``mapped``: ``data.translate(_DIGITS)``.
    Exact for valid JSON and for the valid prefix of invalid JSON (where :mod:`json` reads): in JSON a
    backslash escapes the next byte and only occurs in strings, so dropping ``\\\\`` pairs, then ``\\"``,
    leaves only the quotes that delimit strings. None (not worth it) when there are more than 4 quotes
    per possible integer: splitting then costs more than :mod:`json`'s ``parse_int`` call per integer saves.
    """
    if b"\\" in data:
        data = data.replace(b"\\\\", b"").replace(b'\\"', b"")
    # integers at most: values (commas and openings) and digits; single-byte counts (a b".0" count is slow)
    ints = min(data.count(b",") + data.count(b"[") + data.count(b"{"), mapped.count(b"0"))
    if data.count(b'"') > 4 * ints + 4:
        return None
    return b" ".join(data.split(b'"')[0::2])


@lru_cache(maxsize=4)
def _integer_literal(digits: int) -> tuple[re.Pattern[bytes], re.Pattern[bytes]]:
    """``(after, leading)``: an integer literal of ``digits`` or more digits where a JSON value starts,
    ``after`` a ``[``, ``,`` or ``:`` (and blanks), ``leading`` at the document start, in a text without
    strings: not a float's part (no ``.``, ``e``, ``E`` after it). Two patterns, not one
    ``(?:\\A|[\\[,:])...``: a pattern that starts with a character set lets ``re`` skip to the bytes of
    that set, where the ``\\A`` alternative made it try the whole pattern at every byte (session 23,
    S23-review-1: ~28 ms per MB of digits, e.g. a float literal of a million digits in an accepted body,
    -> ~6 ms). Used by :func:`_holds_integer_literal`."""
    tail = rb"\s*+-?[0-9]{%d,}+(?![.eE])" % digits
    return re.compile(rb"[\[,:]" + tail), re.compile(tail)


def _holds_integer_literal(outside: bytes, pos: int, digits: int) -> bool:
    """Whether ``outside`` (a text without strings) holds, at or after ``pos``, an integer literal of
    ``digits`` or more digits where a JSON value starts (:func:`_integer_literal`): what the one pattern
    ``(?:\\A|[\\[,:])\\s*+-?[0-9]{digits,}+(?![.eE])`` found with ``.search(outside, pos)`` before
    session 23 (``\\A``: the start of ``outside``, not ``pos``; property test:
    tests/gateway/test_s23_review_integer_scan.py). Exact for valid JSON and for the valid prefix of
    invalid JSON. Raises nothing."""
    after, leading = _integer_literal(digits)
    return (pos == 0 and leading.match(outside) is not None) or after.search(outside, pos) is not None


def _holds_long_integer(outside: bytes, outside_map: bytes, digits: int) -> bool:
    """Whether ``outside`` (a text without strings, :func:`_outside_strings`; ``outside_map``: its
    ``translate(_DIGITS)``) holds an integer literal of ``digits`` or more digits, looked for from the value
    holding the first run of that many digits (none before it can hold one; s5). Raises nothing."""
    if (first := outside_map.find(b"0" * digits)) < 0:
        return False
    start = max(outside.rfind(b"[", 0, first), outside.rfind(b",", 0, first), outside.rfind(b":", 0, first))
    return _holds_integer_literal(outside, max(0, start), digits)


def loads_checked(data: bytes, text: str | None = None, *, max_int_digits: int | None = None,
                  max_depth: int | None = None, strict_numbers: bool = False) -> tuple[Any, bool]:
    """``(loads(data, text), fast)``: ``fast`` is True when orjson decoded the document.

    A ``fast`` value holds no lone surrogate (orjson refuses the escapes), no ``NaN`` or
    infinite float (orjson refuses ``NaN``/``Infinity`` and numbers that overflow a double)
    and no integer of 19 digits or more (those documents go to :mod:`json`): a caller may
    skip its own check for them (tests/gateway/test_s4_json_checked.py). A document orjson read whose
    runs of 19 or more digits outside strings are all parts of float literals (no integer literal of
    19 digits or more: :func:`_holds_long_integer`) is orjson's value too (session 23, S23-review-1:
    decoding it again with :mod:`json` cost ~15-40 ms for a 1 MB body; orjson rounds a float literal
    of any length as CPython does: tests/gateway/test_s23_review_integer_scan.py). Raises as :func:`loads`,
    and with ``max_int_digits`` (>= 19) :class:`IntegerTooLong` for an integer literal of more
    digits, before converting it (s5: found in the body without its strings, before decoding; only a
    body with more than 4 quotes per possible integer still goes to :mod:`json` with a Python call
    per integer; tests/gateway/test_s4_parse_bounds.py, test_s5_parse_bounds_b.py). ``max_depth`` (at most
    :data:`MAX_FAST_NESTING`): the caller refuses values nested deeper, so orjson may read a
    document of many brackets (R4-1: 21,000 content parts, ~20 ms with :mod:`json`); only a
    document nested deeper than ``max_depth`` can then decode where :mod:`json` would raise.
    ``strict_numbers`` (session 21, S21-newcomer-5): the :mod:`json` path raises
    :class:`NonFiniteLiteral` at a ``NaN``/``Infinity``/``-Infinity`` token (orjson already refuses
    them, so the fast path is unchanged; the same text inside a string is text and stays accepted),
    and (session 22, S21-fixnew-2) its subclass :class:`NumberOutOfRange` at a number literal that
    overflows a double (orjson refuses those too, so only a document orjson did not read, e.g. one
    with a lone surrogate escape, goes through :mod:`json` with a Python ``parse_float`` per float
    literal: ~0.08 µs each; one that orjson read but holds a long digit run does not).
    """
    mapped = outside = outside_map = None
    orjson_read = False  # orjson refuses every number beyond a double: a document it read holds none
    fast_ok = max_depth is not None and max_depth <= MAX_FAST_NESTING
    if fast_ok or len(data) <= MAX_FAST_NESTING or data.count(b"[") + data.count(b"{") <= MAX_FAST_NESTING:
        try:
            value = orjson.loads(data)
        except orjson.JSONDecodeError:
            value = _FAILED
        orjson_read = value is not _FAILED
        # s7: a flat object of strings, ints, bools and nulls (the plainest request body) holds no
        # float, so no integer orjson read as one (beyond 64 bits: more than 20 digits): json's value
        if (type(value) is dict and (max_int_digits is None or max_int_digits >= 20)
                and _FLAT.issuperset(map(type, value.values()))):  # session 15: C only, no generator
            return value, True
        mapped = data.translate(_DIGITS)
        # s5 (review R4b-2): a long digit run inside a string (an id, a number in a prompt) is text
        if _LONG_RUN in mapped and (outside := _outside_strings(data, mapped)) is not None:
            outside_map = outside.translate(_DIGITS)
        # S23-review-1: long runs outside strings that are all floats' digits (no integer literal of 19 digits or
        # more): orjson's value is json's (it rounds a float literal of any length as CPython does), unread again
        if value is not _FAILED and (_LONG_RUN not in mapped
                                     or (outside_map is not None and _LONG_RUN not in outside_map)
                                     or (outside is not None and outside_map is not None
                                         and not _holds_long_integer(outside, outside_map, len(_LONG_RUN)))):
            return value, True
    src = data if text is None else text
    constant = refuse_constant if strict_numbers else None
    floats = finite_float if strict_numbers and not orjson_read else None  # a long digit run's body: no cost
    if max_int_digits is not None:
        if mapped is None:
            mapped = data.translate(_DIGITS)
        too_long = b"0" * (max_int_digits + 1)
        if too_long in mapped:
            if outside is None or outside_map is None:  # not split: json, checking each integer
                return json.loads(src, parse_int=_bounded_int(max_int_digits), parse_constant=constant,
                                  parse_float=floats), False
            if _holds_long_integer(outside, outside_map, max_int_digits + 1):
                raise IntegerTooLong(max_int_digits)  # s5: unread (json would have read up to it first)
    return json.loads(src, parse_constant=constant, parse_float=floats), False


def loads(data: bytes, text: str | None = None) -> Any:
    """Decode one JSON document exactly as ``json.loads(data)`` does (see the module doc);
    with ``text`` (the caller's UTF-8 decoding of ``data``), exactly as ``json.loads(text)``
    (which refuses a byte-order mark and never guesses UTF-16/32).

    Raises what :func:`json.loads` raises (``json.JSONDecodeError``,
    ``UnicodeDecodeError``, ``RecursionError``, ...).
    """
    if ((len(data) <= MAX_FAST_NESTING or data.count(b"[") + data.count(b"{") <= MAX_FAST_NESTING)
            and _LONG_RUN not in data.translate(_DIGITS)):
        try:
            return orjson.loads(data)
        except orjson.JSONDecodeError:
            pass
    return json.loads(data if text is None else text)


def loads_object(data: bytes) -> dict[str, Any]:
    """:func:`loads` of a document that must be a JSON object (an SSE event, a replica's error body).

    Raises what :func:`loads` raises, and ValueError ("not a JSON object") for a valid
    document of another type.
    """
    obj = loads(data)
    if not isinstance(obj, dict):
        raise ValueError("not a JSON object")
    return obj


def loads_answer(data: bytes) -> dict[str, Any]:
    """A replica's plain answer ``data`` (bytes), parsed only to check that it is a JSON object and read
    its ``usage``: orjson first, whatever the answer's bracket count; :mod:`json` only for what orjson
    refuses (``NaN``/``-Infinity`` log-probabilities, which some engines write; invalid JSON raises its error).

    Not :func:`loads`: the answer is forwarded unchanged, so the two parsers need not agree on its value,
    only on its validity. Review R10-4 (session 10): a ``top_logprobs: 20`` answer of 4,096 tokens holds
    ~176,000 brackets (~90,000 objects but a depth of 6), which :func:`loads`' bracket guard sent to
    :mod:`json` (~104 ms on the event loop instead of ~84 ms with orjson); its CPU is also charged to the
    tenant (:meth:`gateway.cpu_budget.CpuMeter.check_answer`). orjson refuses nesting beyond 1,024 levels;
    such a document then goes to :mod:`json`, whose ``RecursionError`` the caller answers as an invalid
    answer (502). Raises ValueError ("not a JSON object") for a valid document of another type.
    """
    try:
        obj = orjson.loads(data)
    except orjson.JSONDecodeError:
        obj = json.loads(data)
    if not isinstance(obj, dict):
        raise ValueError("not a JSON object")
    return obj


def dumps(value: Any) -> bytes:
    """UTF-8 JSON bytes of ``value``: orjson's, or :mod:`json`'s for what orjson refuses.

    What the parse accepts must serialize again: an integer beyond 64 bits (up to
    ``max_int_digits`` digits pass :func:`loads_checked`) makes ``orjson.dumps`` raise
    ``TypeError``; :mod:`json` writes it (review RV2-2, session 13: a tool schema's
    ``"maximum": 99999999999999999999`` was a 500 and a logged traceback per request).
    Raises ``TypeError``/``ValueError`` only for what neither can write.
    """
    try:
        return orjson.dumps(value)
    except TypeError:
        return json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode()
