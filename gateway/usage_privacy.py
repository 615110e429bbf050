"""What a tenant's answers may tell it about the shared KV cache (session 12, review R12-1).

``usage.prompt_tokens_details.cached_tokens`` counts the prompt tokens a replica found in its
prefix cache. The per-tenant ``cache_salt`` keeps another tenant's blocks from ever being a *hit*,
but tenants still share each replica's KV *capacity*: a tenant that fills a replica with its own
blocks, lets a victim run and re-sends its oldest prompt reads, in this exact counter, how many of
its blocks the victim's prompt evicted (prime+probe; docs/tenancy.md, T1). Per tenant,
``usage_cached_tokens`` (``tenancy.usage_cached_tokens`` by default: ``drop``) decides whether the
counter reaches the client:

* ``drop`` (default, fail closed): the answer's top-level ``usage.prompt_tokens_details`` loses its
  ``cached_tokens`` (and the whole ``prompt_tokens_details`` when nothing else is left in it, which
  is what vLLM answers without ``--enable-prompt-tokens-details``), in plain JSON answers and in a
  stream's usage chunk;
* ``pass``: the replica's answer goes out unchanged.

The gateway's own readers (ledger, audit ``delivered_prefix_tokens``, concentration alerts, routing
calibration) read the replica's usage as parsed, before this: they keep the true value.

Cost (issue 14): an answer without the field costs two dictionary lookups. A plain answer with it
loses exactly the bytes of ``prompt_tokens_details`` when they are vLLM's shape, compact or with
whitespace between the tokens (found from the end, :func:`_exact_cut`; session 16, A15-1), else has
only its usage object replaced (found from the end, checked against the parsed usage:
:func:`_usage_span`), else, when neither is certain, is written again whole
(:func:`plain_without_cached`); a stream's usage chunk (one small event per stream) is written again
(:func:`event_for_drop`). Everything else stays byte for byte (docs/benchmarks.md, fixr12).

Session 14, review RV2-1: those byte guards read literal keys. JSON lets a key be spelt with ``\\uXXXX``
escapes (``"cached\\u005ftokens"`` is ``cached_tokens`` to every parser) and a key be repeated (the parse
keeps the last value, some clients the first). So an answer or event holding a ``\\u`` escape, or whose
bytes name ``"cached_tokens"`` while its parse shows no counter, is written again from its parse
(:func:`may_name_cached`: two byte searches, the cost on answers without either). Replicas write
non-ASCII text as UTF-8 (vLLM, SGLang): an escape is rare, and the rewrite is charged like any other.

Session 15, review R14-2: a counter below something other than the top-level ``usage`` (a per-choice
``choices[i].usage``, any nesting) reached a ``drop`` tenant as the replica sent it. Now, whatever the
top-level keys, an answer or event whose bytes may name the counter (:func:`may_name_cached`) and that the
fast paths do not leave without it is written again from its parse with *every* ``cached_tokens`` key
removed at any depth (:func:`without_counter`). Written again rather than refused (502): the rest of the
answer is valid and the tenant asked for it; the gateway's readers keep the parsed value as before; and
a refusal would turn a harmless future replica shape (per-choice usage) into an outage for every ``drop``
tenant. The rewrite is charged like any other (gateway/answer_cost.py ``metered_rewrite``).
"""

from __future__ import annotations

import re
from typing import Any

import orjson

from gateway.json_fast import dumps

__all__ = ["PASS", "DROP", "drops_cached", "usage_without_cached", "plain_without_cached", "event_without_cached",
           "may_name_cached", "event_for_drop", "without_counter", "written_without_counter"]

PASS = "pass"
DROP = "drop"

_KEY = b'"usage"'
_CACHED_KEY = b'"cached_tokens"'
#: the counter's and its parent's names in a parse (R14-2: removed at any depth)
_COUNTER = "cached_tokens"
_DETAILS_NAME = "prompt_tokens_details"
#: a JSON ``\\uXXXX`` escape: where it occurs, a key's bytes need not be its name (review RV2-1)
_ESCAPE = b"\\u"
_DETAILS_KEY = b'"prompt_tokens_details"'
_COMMA_DETAILS = b',"prompt_tokens_details":{"cached_tokens":'
#: the same pair as Python's ``json.dumps`` and aiohttp's ``json_response`` write it (``", "``, ``": "``;
#: the simulated replicas): searched as one literal too (session 28, cut28), before the token-by-token read
_SPACED_DETAILS = b', "prompt_tokens_details": {"cached_tokens": '
#: RFC 8259 section 2: insignificant whitespace (space, tab, LF, CR), as byte values
_WS = b" \t\n\r"
#: ``"prompt_tokens_details": {"cached_tokens": N}`` with any whitespace between the tokens (A15-1)
_PAIR = re.compile(rb'"prompt_tokens_details"[ \t\r\n]*:[ \t\r\n]*\{[ \t\r\n]*("cached_tokens")[ \t\r\n]*:'
                   rb'[ \t\r\n]*-?[0-9]+[ \t\r\n]*\}')
_COMMA_AFTER = re.compile(rb"[ \t\r\n]*,[ \t\r\n]*")
_AFTER_KEY = re.compile(rb"[ \t\r\n]*:[ \t\r\n]*\{")
#: closing braces tried when looking for the end of the usage object (usage nests one object deep)
_MAX_CLOSERS = 8


def drops_cached(tenant_setting: str | None, default: str) -> bool:
    """Whether a tenant's answers lose ``cached_tokens``: its own ``usage_cached_tokens`` (None: the
    ``tenancy`` ``default``); anything but ``pass`` drops (fail closed)."""
    return (tenant_setting or default) != PASS


def usage_without_cached(usage: dict[str, Any]) -> dict[str, Any] | None:
    """``usage`` without ``prompt_tokens_details.cached_tokens`` (a new dict; ``prompt_tokens_details``
    left out when it held nothing else), or None when there is nothing to drop (no such key)."""
    details = usage.get("prompt_tokens_details")
    if type(details) is not dict or "cached_tokens" not in details:
        return None
    rest = {k: v for k, v in details.items() if k != "cached_tokens"}
    if not rest:
        return {k: v for k, v in usage.items() if k != "prompt_tokens_details"}
    return {k: rest if k == "prompt_tokens_details" else v for k, v in usage.items()}


def _usage_span(data: bytes, usage: dict[str, Any]) -> tuple[int, int] | None:
    """(start, end) of the top-level usage object's bytes in the JSON object ``data`` whose parsed
    ``usage`` is ``usage``; None when not found with certainty.

    The last ``"usage"`` key (OpenAI/vLLM answers end with it) is taken: its quote must not be escaped
    (a string's content can hold ``\\"usage"``), a ``{`` must follow its colon, the object's end is the
    first ``}`` that balances the braces, and the slice must parse to exactly ``usage`` (a brace inside
    a string, another object named usage: not equal, None)."""
    i = data.rfind(_KEY)
    if i <= 0 or data[i - 1] == 0x5C:  # a backslash before: inside a string (or too odd to be sure)
        return None
    m = _AFTER_KEY.match(data, i + len(_KEY))
    if m is None:
        return None
    start = m.end() - 1
    pos = start
    for _ in range(_MAX_CLOSERS):
        end = data.find(b"}", pos + 1)
        if end < 0:
            return None
        end += 1
        piece = data[start:end]
        if piece.count(b"{") == piece.count(b"}"):
            try:
                return (start, end) if orjson.loads(piece) == usage else None
            except orjson.JSONDecodeError:
                return None
        pos = end - 1
    return None


def _exact_cut(data: bytes, details: dict[str, Any]) -> bytes | None:
    """The fast path for the shape vLLM, SGLang and the simulators write (``prompt_tokens_details``
    holding ``cached_tokens`` alone, after another usage field or before one; compact or with RFC 8259
    insignificant whitespace, space, tab, LF or CR, between the tokens: Python's ``json.dumps`` and aiohttp's
    ``json_response`` write ``": "`` and ``", "``; session 16, A15-1): ``data`` without the pair
    ``"prompt_tokens_details": {"cached_tokens": N}`` holding the last ``"cached_tokens"`` and the comma
    before it (or after it, when the pair comes first in its object), or None when the bytes there are
    not exactly that shape (the caller writes the usage or the answer again).

    vLLM's compact form after another member (``,"prompt_tokens_details":{"cached_tokens":N}``) is
    searched first, as one literal (session 13's cut), then the spaced writers' form
    (``, "prompt_tokens_details": {"cached_tokens": N}``, one literal too: session 28, cut28; the same bytes
    out as the token-by-token read below); any other spacing or order is read token by token.
    Such bytes are the replica's own structure, never a string's content: the pair's first quote follows
    a ``,`` or ``{`` (whitespace between), so it is not escaped, and a quote that closed a string could not
    be followed by ``p``; from there the grammar reads one key and its one-key object. The cut removes
    that pair and its separator from its object (the rest stays valid JSON), so the result parses to the
    parse without that key when no other ``"prompt_tokens_details"`` precedes it (a duplicate in the same
    object would become the parse's value: such an answer is not cut). The caller's check that no
    ``"cached_tokens"`` is left in the result rejects a cut of any other copy than the last one or a
    second occurrence (session 13), so there is no separate uniqueness search."""
    n = details.get(_COUNTER)
    if len(details) != 1 or type(n) is not int:
        return None
    tail = str(n).encode() + b"}"  # vLLM's compact bytes first: one search (bytes %-formatting costs ~1 us)
    piece = _COMMA_DETAILS + tail
    j = data.rfind(piece)
    if j >= 0:
        return data[:j] + data[j + len(piece):] if data.find(_DETAILS_KEY) == j + 1 else None
    piece = _SPACED_DETAILS + tail  # session 28 (cut28): the spaced writers' bytes, one search too
    j = data.rfind(piece)
    if j >= 0 and data.find(_DETAILS_KEY) == j + 2:  # else (an earlier key of that name): read below, not cut
        return data[:j] + data[j + len(piece):]
    i = data.rfind(_CACHED_KEY)
    j = data.rfind(_DETAILS_KEY, 0, i)
    if j <= 0:
        return None
    m = _PAIR.match(data, j)
    if m is None or m.start(1) != i:  # whitespace only between the two keys
        return None
    if data.find(_DETAILS_KEY) != j:  # an earlier key of that name (a duplicate would take over: not cut)
        return None
    k = j - 1
    while data[k] in _WS and k > 0:  # back over whitespace (usually none or one byte)
        k -= 1
    before = data[k]
    if before == 0x2C:  # ",": the pair follows another member
        return data[:k] + data[m.end():]
    if before == 0x7B:  # "{": the pair is the first member, a comma must follow it
        after = _COMMA_AFTER.match(data, m.end())
        if after is not None:
            return data[:j] + data[after.end():]
    return None


def plain_without_cached(data: bytes, obj: dict[str, Any], usage: Any) -> bytes:
    """A plain answer's bytes without ``cached_tokens`` (``data``: the replica's JSON object, ``obj``
    its parse, ``usage``: ``obj["usage"]``, any JSON value). ``data`` itself when there is nothing to
    drop; else the same bytes with only the usage object written again, or, when that object cannot be
    located with certainty (:func:`_usage_span`), the whole answer written again (orjson; never the
    counter).

    Session 14, review RV2-1: the byte guards read literal keys, so an answer holding a ``\\u`` escape
    (a key spelt ``"cached\\u005ftokens"`` reads as ``cached_tokens`` to every JSON parser) is written
    again whole; so is one whose parse shows no counter while its bytes still name it (an earlier
    duplicated ``usage`` or ``prompt_tokens_details`` key: a parser keeping the first value would read
    it). The caller passes such answers here too (:func:`may_name_cached`), whatever their top-level keys
    (session 15, R14-2): every rewrite from the parse removes the counter at any depth
    (:func:`written_without_counter`), so a per-choice or otherwise nested copy does not go out either."""
    details = usage.get("prompt_tokens_details") if type(usage) is dict else None
    i = data.find(b"\\")  # _has_escape(data), inline (session 17: one call less per answer)
    escaped = i >= 0 and data.find(_ESCAPE, i) >= 0
    if type(details) is not dict or "cached_tokens" not in details:
        if escaped or data.rfind(_CACHED_KEY) >= 0:  # RV2-1: a copy the parse does not show
            return written_without_counter(obj)  # R14-2: or one below the top level
        return data
    if escaped:  # RV2-1: a key the byte guards cannot read; the parse decides
        return dumps(without_counter(obj))
    out = _exact_cut(data, details)
    # R12b-4: a cut or span can miss the object a client reads (a nested usage copy after the real one,
    # a duplicated top-level key, a second compact occurrence): with the key still in the bytes, the next
    # way is tried, the last one writing the whole answer again
    if out is not None and out.rfind(_CACHED_KEY) < 0:  # rfind: ~2x `in` on answers (CPython 3.11)
        return out  # session 13: the common vLLM shape needs no new usage dict (~1 us of 2.6); A15-1: spaced too
    new = usage_without_cached(usage)
    assert new is not None
    span = _usage_span(data, usage)
    if span is not None:
        start, end = span
        out = b"".join((data[:start], dumps(new), data[end:]))
        if out.rfind(_CACHED_KEY) < 0:
            return out
    return dumps(without_counter(obj))  # R14-2: a copy below the top level goes too


def may_name_cached(data: bytes) -> bool:
    """Whether the JSON bytes ``data`` may hold a key a parser reads as ``cached_tokens`` beyond what
    their parse shows: they name ``"cached_tokens"`` or hold a ``\\u`` escape (two byte searches; review
    RV2-1). False: every key is spelt literally and none is the counter."""
    if data.rfind(_CACHED_KEY) >= 0:
        return True
    i = data.find(b"\\")  # _has_escape(data), inline (session 18: one call less per plain answer)
    return i >= 0 and data.find(_ESCAPE, i) >= 0


def _has_escape(data: bytes) -> bool:
    """Whether ``data`` holds ``\\u``: a memchr for a backslash first (~0.2 us a 1 kB answer, most
    answers have none), the two-byte search from there only when one is found."""
    i = data.find(b"\\")
    return i >= 0 and data.find(_ESCAPE, i) >= 0


def event_without_cached(obj: dict[str, Any], usage: dict[str, Any]) -> bytes | None:
    """A stream event (parsed ``obj`` with ``usage``) written again without its top-level usage's
    ``cached_tokens``, as ``data: {...}\\n\\n``; None when there is nothing to drop there. Top level only:
    the stream scanner calls :func:`event_for_drop`, which removes the counter at any depth (R14-2)."""
    new = usage_without_cached(usage)
    if new is None:
        return None
    return b"data: " + dumps({**obj, "usage": new}) + b"\n\n"


def event_for_drop(payload: bytes, obj: dict[str, Any], usage: Any = None) -> bytes | None:
    """What a stream data event (``payload``: its data, ``obj``: its parse) becomes for a ``drop`` tenant,
    as ``data: {...}\\n\\n``; None: forward it as received (its bytes name no ``"cached_tokens"`` and hold
    no ``\\u`` escape, so no key of it is the counter: :func:`may_name_cached`, two byte searches). Else
    the event written again from its parse without any ``cached_tokens`` key
    (:func:`written_without_counter`): a top-level usage's counter (R12-1), a duplicated ``usage`` whose
    first value holds it or an escaped key (RV2-1), a copy below the top level (session 15, R14-2).
    Session 28 (cut28, issue 14): an event of one data line (``payload`` without LF; a line holds no CR)
    goes through :func:`plain_without_cached` instead, as a plain answer: the replica's usage chunk loses
    exactly the counter's pair (the literal cuts, ~1 µs instead of two writes), every other case is
    written again from its parse as before; either way one line, parsing to the same object.
    ``usage`` (``obj["usage"]``) is not needed: kept for callers written before R14-2."""
    if payload.rfind(_CACHED_KEY) < 0 and not _has_escape(payload):
        return None
    if payload.find(b"\n") < 0:  # one data line (no CR in a line): a cut of it stays one line (session 28, cut28)
        return b"data: " + plain_without_cached(payload, obj, obj.get("usage")) + b"\n\n"
    return b"data: " + written_without_counter(obj) + b"\n\n"


def without_counter(obj: dict[str, Any]) -> dict[str, Any]:
    """A copy of the JSON object ``obj`` (a parse: dicts, lists, scalars) without any ``cached_tokens`` key
    at any depth, and without a ``prompt_tokens_details`` object that held nothing but that key (vLLM's
    shape without ``--enable-prompt-tokens-details``, as :func:`usage_without_cached` at the top level).
    Every other key, value and order is kept. Iterative (no recursion limit: a parse may nest 1,024
    levels, orjson's bound); copies every container, O(size of ``obj``). Session 15, review R14-2."""
    out: dict[str, Any] = {}
    stack: list[tuple[Any, Any]] = [(obj, out)]
    while stack:
        src, dst = stack.pop()
        if type(src) is dict:
            for k, v in src.items():
                if k == _COUNTER:
                    continue
                t = type(v)
                if t is dict:
                    if k == _DETAILS_NAME and len(v) == 1 and _COUNTER in v:
                        continue
                    d: dict[str, Any] = {}
                    dst[k] = d
                    stack.append((v, d))
                elif t is list:
                    lst: list[Any] = []
                    dst[k] = lst
                    stack.append((v, lst))
                else:
                    dst[k] = v
        else:
            for v in src:
                t = type(v)
                if t is dict or t is list:
                    c: Any = {} if t is dict else []
                    dst.append(c)
                    stack.append((v, c))
                else:
                    dst.append(v)
    return out


def written_without_counter(obj: dict[str, Any]) -> bytes:
    """``obj`` (a parse) as JSON bytes (:func:`gateway.json_fast.dumps`) without any ``cached_tokens`` key
    (:func:`without_counter`). The parse is written first; only when those bytes name
    ``"cached_tokens"`` (a key: the writers spell keys literally; or a string equal to it) is the copy
    made and written: a rewrite of an answer that holds no counter (an escape alone) costs one write.
    Raises what :func:`gateway.json_fast.dumps` raises. Session 15, review R14-2."""
    out = dumps(obj)
    if out.rfind(_CACHED_KEY) < 0:
        return out
    return dumps(without_counter(obj))
