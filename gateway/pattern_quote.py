"""Whether a JSON schema ``pattern`` can read the string's closing ``"`` once an inlining compiler has put it between
quotes (session 29, pattern29, S29-pattern29-1; the hole: S28-pattern28-2).

outlines-core (0.2.14; vLLM ``guided_decoding_backend=outlines``, SGLang ``--grammar-backend outlines``) builds one
regular expression for the whole schema and determinises it before the first token, with no timeout. It inlines a
string's ``pattern`` raw: ``"`` + pattern + ``"`` inside a group, after removing a leading ``^`` and a trailing
``$`` only when both are there (``^a$`` -> ``("a")``; ``a$`` -> ``("a$")``; ``^a\\$`` -> ``("a\\")``, whose ``\\``
escapes the closing quote). When the pattern can read ``"`` (``.``, ``\\S``, ``[^@]``), the automaton may be "after
the string" after every position inside it and follows the rest of the expression from each of them: ``^.{1,200}$``
as a required property followed by others kills a replica (3 GiB), ``[^"]{1,200}`` costs 0.03 s.

:func:`pattern_reads_quote` decides it by one linear scan of the text as outlines-core inlines it, failing closed:
anything it does not positively understand counts as reading ``"``. It reads ``"`` when the text has

* ``.``, ``\\D``, ``\\S``, ``\\W``, a literal ``"``, an escape of it (``\\"``, ``\\x22``, ``\\x{22}``, ``\\u0022``,
  ``\\U00000022``, ``\\u{22}``), a class that contains ``"`` (a member, a range over 0x22 such as ``[ -~]``,
  ``\\D`` / ``\\S`` / ``\\W`` inside it) or a negated class that does not (``[^@]``; ``[^"@]`` does not read it);
* an escape it does not know (``\\p{..}``, ``\\P{..}``, octal and back references, ``\\Q``, a trailing ``\\``), a
  nested class, a POSIX class, a class set operation (``&&``, ``--``, ``~~``), an unterminated class, a range whose
  ends are not single characters or run backwards;
* a quantifier (``*``, ``+``, ``?``, ``{``) as its first character: it repeats or drops the opening ``"`` that
  outlines-core put before it (``+a`` -> ``("+a")`` reads three quotes then ``a``; ``?a`` reads ``a`` then one;
  session 30, S30-attack30-3);
* a group it does not know (``(?=``, ``(?!``, ``(?<=``, ``(?P=``; a flag group with ``x``, whose whitespace rules
  change what a class holds), an alternation ``|`` outside every group or unbalanced parentheses: these reach past
  the quotes (``a)|(b`` -> ``("a)|(b")``).

Known safe: literals other than ``"``, ``\\d`` ``\\s`` ``\\w`` (Rust's Unicode classes hold no ``"``), escaped
ASCII punctuation other than ``"``, ``\\n`` ``\\t`` ``\\r`` ``\\f`` ``\\v`` ``\\a``, assertions ``\\b`` ``\\B``
``\\A`` ``\\z`` and ``^`` ``$``, quantifiers, groups ``(``, ``(?:``, ``(?P<name>``, ``(?<name>`` and flag groups of
``i m s U u R`` (case folding maps nothing to ``"``). Cost: O(len(pattern)): runs of plain characters are skipped
by a compiled regular expression (C), the rest looked at one by one (about 0.02-0.1 µs per character).
"""

from __future__ import annotations

import re

__all__ = ["QUOTE_READING_FORMATS", "pattern_reads_quote"]

#: ``format`` values outlines-core 0.2.14 inlines as a regular expression whose classes read ``"``: ``uri``
#: (``[^\\s]*`` loops; tests/support/ordinary_schemas.py's create_contact, 15 optional properties with one ``uri``:
#: killed at 60 s CPU, 1.1 s with ``date`` instead) and ``email`` (its quoted local part and domain literal
#: ``[\\x21-\\x5a...]``: 8 required ``email`` properties killed, 4: 0.56 s; the same 8 as a quote-free pattern 0.04 s).
#: ``date-time``, ``date``, ``time``, ``uuid`` do not read it; outlines-core refuses every other format
QUOTE_READING_FORMATS = frozenset({"uri", "email"})

_QUOTE = 0x22
#: kinds of an escape (:func:`_escape`)
_CHAR, _NO_QUOTE_SET, _QUOTE_SET, _ASSERT, _UNKNOWN = range(5)
_SIMPLE = {"n": 0x0A, "t": 0x09, "r": 0x0D, "f": 0x0C, "v": 0x0B, "a": 0x07}
_HEX = frozenset("0123456789abcdefABCDEF")
_FLAGS = frozenset("imsUuR-")
#: a run of characters outside a class that need no look (literals, quantifiers, anchors): skipped in C
_PLAIN = re.compile(r'[^\\\[().|"]+')
#: a first character that quantifies the opening ``"`` (``{ 2}`` is a counted repetition in Rust's syntax too)
_LEADING = frozenset("*+?{")
_NAME = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_")


def pattern_reads_quote(pattern: str) -> bool:
    """True when ``pattern`` (a JSON schema ``pattern`` string), inlined by outlines-core between ``"``, can read
    ``"`` or reach past the quotes, or uses a construct this scan does not know (fail closed; the rules: module
    docstring); False only when every character the pattern can match is known not to be ``"``. Raises nothing."""
    text = pattern[1:-1] if len(pattern) >= 2 and pattern[0] == "^" and pattern[-1] == "$" else pattern
    n, i, depth = len(text), 0, 0
    if n and text[0] in _LEADING:  # S30-attack30-3: it quantifies the opening quote
        return True
    while i < n:
        if (plain := _PLAIN.match(text, i)) is not None:
            i = plain.end()
            if i >= n:
                break
        c = text[i]
        if c == "\\":
            kind, value, i = _escape(text, i + 1)
            if kind == _QUOTE_SET or kind == _UNKNOWN or (kind == _CHAR and value == _QUOTE):
                return True
            continue
        if c == '"' or c == ".":
            return True
        if c == "[":
            reads, i = _class(text, i + 1)
            if reads:
                return True
            continue
        if c == "(":
            if text.startswith("(?", i):
                i, opens = _group_head(text, i + 2)
                if i < 0:
                    return True
                depth += opens
                continue
            depth += 1
        elif c == ")":
            depth -= 1
            if depth < 0:
                return True
        elif c == "|" and depth == 0:
            return True
        i += 1
    return depth != 0


def _group_head(text: str, i: int) -> tuple[int, int]:
    """After ``(?`` at ``i``: ``(index after the head, groups opened)``; ``(-1, 0)`` for a head not known safe."""
    n = len(text)
    if text.startswith(":", i):
        return i + 1, 1
    if text.startswith("P<", i) or (text.startswith("<", i) and not text.startswith(("<=", "<!"), i)):
        j = i + (2 if text[i] == "P" else 1)
        k = j
        while k < n and text[k] in _NAME:
            k += 1
        return (k + 1, 1) if k > j and k < n and text[k] == ">" else (-1, 0)
    j = i
    while j < n and text[j] in _FLAGS:
        j += 1
    if j == i or j >= n:
        return -1, 0
    if text[j] == ")":
        return j + 1, 0
    if text[j] == ":":
        return j + 1, 1
    return -1, 0


def _escape(text: str, i: int) -> tuple[int, int, int]:
    """The escape whose letter is at ``i`` (after ``\\``): ``(kind, code point or -1, index after it)``."""
    n = len(text)
    if i >= n:  # a trailing backslash escapes the closing quote outlines-core appends
        return _UNKNOWN, -1, n
    c = text[i]
    if c in "xuU":
        if text.startswith("{", i + 1):
            end = text.find("}", i + 2)
            digits = text[i + 2:end] if end > 0 else ""
            nxt = end + 1
        else:
            width = {"x": 2, "u": 4, "U": 8}[c]
            digits = text[i + 1:i + 1 + width]
            digits = digits if len(digits) == width else ""
            nxt = i + 1 + width
        if not digits or len(digits) > 8 or not _HEX.issuperset(digits):
            return _UNKNOWN, -1, n
        return _CHAR, int(digits, 16), nxt
    if c in "dsw":
        return _NO_QUOTE_SET, -1, i + 1
    if c in "DSW":
        return _QUOTE_SET, -1, i + 1
    if c in _SIMPLE:
        return _CHAR, _SIMPLE[c], i + 1
    if c in "bBAz":
        return _ASSERT, -1, i + 1
    if c.isascii() and not c.isalnum() and c.isprintable() and c != " ":
        return _CHAR, ord(c), i + 1  # escaped punctuation: the character itself (``\\"`` is the quote)
    return _UNKNOWN, -1, n


def _class(text: str, i: int) -> tuple[bool, int]:
    """A character class whose body starts at ``i`` (after ``[``): ``(reads the quote, index after ``]``)``; reads
    it for anything not known (fail closed)."""
    n = len(text)
    negated = text.startswith("^", i)
    if negated:
        i += 1
    has_quote, first = False, True
    while True:
        if i >= n:
            return True, n
        c = text[i]
        if c == "]" and not first:
            return (not has_quote if negated else has_quote), i + 1
        first = False
        if c == "[" or (c in "&~-" and text.startswith(c + c, i)):
            return True, n
        if c == "\\":
            kind, low, i = _escape(text, i + 1)
            if kind == _QUOTE_SET:
                has_quote = True
                continue
            if kind == _NO_QUOTE_SET:
                continue
            if kind != _CHAR:
                return True, n
        else:
            low, i = ord(c), i + 1
        if i + 1 < n and text[i] == "-" and text[i + 1] != "]":
            hc = text[i + 1]
            if hc in "[-" or (hc in "&~" and text.startswith(hc + hc, i + 1)):
                return True, n  # a nested class, or ``--`` / ``&&`` / ``~~`` (Rust's set operations)
            if hc == "\\":
                kind, high, i = _escape(text, i + 2)
                if kind != _CHAR:
                    return True, n
            else:
                high, i = ord(hc), i + 2
            if high < low:
                return True, n
            has_quote = has_quote or low <= _QUOTE <= high
        elif low == _QUOTE:
            has_quote = True
