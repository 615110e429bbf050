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
"""
from __future__ import annotations

import json
from typing import Any

import orjson

__all__ = ["MAX_FAST_NESTING", "loads", "loads_checked"]

#: At most this many ``[`` plus ``{`` bytes for the orjson path (far below the
#: depth at which :func:`json.loads` raises ``RecursionError``).
MAX_FAST_NESTING = 256
# digits -> "0", every other byte -> ".": a run of 19 digits becomes _LONG_RUN
_DIGITS = bytes(0x30 if 0x30 <= i <= 0x39 else 0x2E for i in range(256))
_LONG_RUN = b"0" * 19


def loads_checked(data: bytes, text: str | None = None) -> tuple[Any, bool]:
    """``(loads(data, text), fast)``: ``fast`` is True when orjson decoded the document.

    A ``fast`` value holds no lone surrogate (orjson refuses the escapes), no ``NaN`` or
    infinite float (orjson refuses ``NaN``/``Infinity`` and numbers that overflow a double)
    and no integer of 19 digits or more (those documents go to :mod:`json`): a caller may
    skip its own check for them (tests/gateway/test_s4_json_checked.py). Raises as :func:`loads`.
    """
    if (data.count(b"[") + data.count(b"{") <= MAX_FAST_NESTING
            and _LONG_RUN not in data.translate(_DIGITS)):
        try:
            return orjson.loads(data), True
        except orjson.JSONDecodeError:
            pass
    return json.loads(data if text is None else text), False


def loads(data: bytes, text: str | None = None) -> Any:
    """Decode one JSON document exactly as ``json.loads(data)`` does (see the module doc);
    with ``text`` (the caller's UTF-8 decoding of ``data``), exactly as ``json.loads(text)``
    (which refuses a byte-order mark and never guesses UTF-16/32).

    Raises what :func:`json.loads` raises (``json.JSONDecodeError``,
    ``UnicodeDecodeError``, ``RecursionError``, ...).
    """
    if (data.count(b"[") + data.count(b"{") <= MAX_FAST_NESTING
            and _LONG_RUN not in data.translate(_DIGITS)):
        try:
            return orjson.loads(data)
        except orjson.JSONDecodeError:
            pass
    return json.loads(data if text is None else text)
