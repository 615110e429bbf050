"""An upper bound of the regular expression an inlining compiler builds from a JSON schema (session 27, expand27:
S27-review27-3), for ``limits.json_schema.max_regex_chars`` in gateway/response_format.py.

outlines-core (``build_regex_from_schema``, src/json_schema/parsing.rs; 0.2.14, as review27 read it) turns a schema
into ONE regular expression, then an automaton, before the first token; the expression grows with the schema's shape,
not its bytes (a 10 KB schema: 3.6 M characters, 163 s of CPU and 782 MB for its ``Index``). xgrammar and llguidance
keep rules and do not expand; the gateway cannot tell which the replica runs, so it counts what outlines-core would
build (fail closed; ``null`` turns the bound off). Its rules, per keyword, first match in this order (``W``: the
whitespace pattern ``[ ]?``, 4 characters; ``e(x)``: the characters built for ``x``):

* ``{}``: the 7 JSON types, ``object`` and ``array`` unconstrained at depth 2: 13,879;
* ``properties``: property ``i`` is ``15 + len(escaped name) + e(value)``; with a required property, each once (plus a
  comma, ``(...)?``); with none required, the alternatives of every first present property: property ``i`` (of
  ``n``) is written ``n - i`` times (quadratic). Counted here with the largest property first (the largest order);
* ``allOf`` / ``anyOf`` / ``oneOf`` / ``prefixItems``: their members once each, plus separators;
* ``enum`` / ``const``: the values' JSON, regex-escaped (counted as Python's ``re.escape``, a superset of Rust's), and a
  list or object value's whitespace patterns beside its structural characters (S27-attack27-3);
* ``$ref``: its target inlined; 4 references nest and the 5th is dropped (``parse_ref``'s ``max_recursion_depth``
  3): :data:`gateway.schema_refs.REF_LEVELS`, the targets found by :func:`gateway.schema_refs.resolve_ref` (a superset
  of the forms outlines-core resolves);
* ``type``: fixed sizes for the scalars (string 43, integer 19, number 49, boolean 12, null 4; formats and digit or
  length bounds at most 448); ``object`` without ``properties``: its ``additionalProperties`` written twice, or when
  absent an unconstrained value whose nested ``object`` and ``array`` go ``depth`` levels down (``depth``, default 2,
  is read from the schema: 4x per level, 1.8 M characters at ``"depth": 6``); ``array``: ``items`` written twice, or
  unconstrained at ``depth``; a list of types: each as if alone;
* anything else (unknown keys only, booleans, other JSON values): nothing (outlines-core refuses it);
* a ``string`` at the expression's start (the root, or reached from it through ``anyOf`` / ``oneOf`` / ``allOf`` /
  ``$ref`` / a list of types) with a counted repetition (``minLength`` / ``maxLength`` ``n``, or a ``pattern`` whose
  ``{m}`` / ``{m,n}`` quantifiers multiply to ``n``): ``8 * 2**n`` more (session 28, attack28, S28-attack28-1).
  outlines-core's ``Index`` of ``{"type": "string", "maxLength": n}`` as the whole schema doubles its CPU and memory
  per unit of ``n`` (a 37- or 5,000-token vocabulary alike: ``n`` 12 0.2 s, 16 4.3 s and 261 MB, 24 more than 3 GB;
  ``"pattern": ".{16}"`` 2.5 s) while its expression stays under 50 characters; the same string as a property, an
  array item or after any other fixed character costs milliseconds at ``maxLength`` 200 and is not charged. The
  default bound (1,000,000) then admits ``n`` 16 and refuses 17.

Assumed: outlines-core's default whitespace pattern (vLLM's outlines backend passes none; a replica given a longer
one, e.g. SGLang's ``--constrained-json-whitespace-pattern``, builds more than counted here: lower the bound).
Each rule above is the exact length outlines-core 0.2.14 builds or more (bench/s27_expand27_estimate.py checks it
against the real compiler); an error that makes outlines-core skip a property (the 5th nested reference) or refuse the
schema counts as if it built. Work: each (node, open references) pair once (at most ``REF_LEVELS + 1`` times the
nodes), no recursion, a sort of each ``properties`` map; it stops once the count passes ``cap``.
"""

from __future__ import annotations

import re
from typing import Any

import orjson

from gateway.schema_refs import REF_LEVELS, resolve_ref
from gateway.tool_schemas import required_schema  # its home since session 31 (tidy31)

__all__ = ["WHITESPACE_CHARS", "regex_chars", "required_schema", "required_tools_chars"]

#: characters of outlines-core's default whitespace pattern ``[ ]?`` (types.rs ``WHITESPACE``)
WHITESPACE_CHARS = 4
_W = WHITESPACE_CHARS
_STRING, _INTEGER, _NUMBER, _BOOLEAN, _NULL = 43, 19, 49, 12, 4
_SCALAR = {"string": _STRING, "integer": _INTEGER, "number": _NUMBER, "boolean": _BOOLEAN, "null": _NULL}
#: the longest string ``format`` (email), a string with ``minLength``/``maxLength`` (two 20-digit u64), a number or an
#: integer with digit bounds: upper bounds of outlines-core's fixed expressions
_STRING_FORMAT, _STRING_LENGTH, _NUMBER_DIGITS, _INTEGER_DIGITS = 448, 85, 175, 61
_NUMBER_BOUNDS = ("minDigitsInteger", "maxDigitsInteger", "minDigitsFraction", "maxDigitsFraction",
                  "minDigitsExponent", "maxDigitsExponent")
#: an array's fixed characters without / with ``minItems``/``maxItems`` (their quantifier: at most 43)
_ARRAY, _ARRAY_BOUNDED = 30, 69
_EMPTY_CONTAINER = 4 + _W  # ``\{[ ]?\}`` or ``\[[ ]?\]``: ``maxProperties`` / ``maxItems`` 0
_HUGE = 1 << 62
#: a subschema outlines-core drops: a reference nested below :data:`REF_LEVELS` others, or what holds one (its error
#: goes up to the nearest property, which ``parse_properties`` skips)
_FAIL = -1
_KEYWORDS = ("properties", "allOf", "anyOf", "oneOf", "prefixItems", "enum", "const", "$ref", "type")
#: a ``pattern``'s counted quantifiers ``{m}``, ``{m,}``, ``{m,n}`` (their largest number counts)
_QUANTIFIER = re.compile(r"\{(\d+)(?:,(\d*))?\}")
#: characters charged per doubling of a leading string's counted repetition (S28-attack28-1): ``8 * 2**n``
_LEADING_UNIT = 8


def _unconstrained_table() -> list[tuple[int, int]]:
    """``[(object, array)]`` by ``depth``: outlines-core's unconstrained ``object`` (``2V + 134``, ``V`` its value's
    ``anyOf``) and ``array`` (``2J + 30``, ``J`` its items' alternatives), until past :data:`_HUGE`."""
    table: list[tuple[int, int]] = []
    while not table or min(table[-1]) <= _HUGE:
        nested = 2 + sum(table[-1]) if table else 0
        table.append((2 * (113 + nested) + 134, 2 * (131 + nested) + 30))
    return table


_UNCONSTRAINED = _unconstrained_table()
_EMPTY_SCHEMA = 127 + 14 + 6 + sum(_UNCONSTRAINED[2])  # 7 types, each in ``(...)``, joined by ``|``: 13,879


def regex_chars(schema: Any, cap: int) -> int:
    """Upper bound of the characters of the regular expression outlines-core builds from ``schema`` (module
    docstring), at most ``cap + 1`` (``cap + 1``: over ``cap``; the count stops there).

    ``schema``: a decoded JSON value (the schema is the root that local ``$ref`` resolve in); ``cap``: int >= 0.
    A value outlines-core refuses counts 0. Raises nothing (orjson's encoding of an ``enum`` / ``const`` value falls
    back to :mod:`json`)."""
    memo: dict[tuple[int, int], int] = {}
    targets: dict[str, Any] = {}
    stack: list[tuple[Any, int, bool]] = [(schema, 0, False)]
    while stack:
        node, open_refs, ready = stack.pop()
        key = (id(node), open_refs)
        if ready:
            value = _own(schema, node, open_refs, memo, targets)
            if value > cap:  # every node's count is at least each counted child's: the root's is over too
                return cap + 1
            memo[key] = value
            continue
        if key in memo:
            continue
        stack.append((node, open_refs, True))
        stack.extend((child, depth, False) for child, depth in _children(schema, node, open_refs, targets)
                     if (id(child), depth) not in memo)
    return min(max(memo[(id(schema), 0)], 0) + _leading_strings(schema, cap, targets), cap + 1)


def _leading_strings(root: Any, cap: int, targets: dict[str, Any]) -> int:
    """Characters charged for the ``string`` nodes at the start of the expression outlines-core builds from ``root``
    (module docstring, last rule; S28-attack28-1): ``8 * 2**n`` each, ``n`` its counted repetition; at most
    ``cap + 1``. Walks ``anyOf`` / ``oneOf`` / ``allOf`` members, ``$ref`` targets (at most :data:`REF_LEVELS`
    nested) and lists of types from the root, each (node, open references) pair once. Raises nothing."""
    extra = 0
    seen: set[tuple[int, int]] = set()
    stack: list[tuple[Any, int]] = [(root, 0)]
    while stack and extra <= cap:
        node, open_refs = stack.pop()
        if type(node) is not dict or (id(node), open_refs) in seen:
            continue
        seen.add((id(node), open_refs))
        word = _keyword(node)
        if word in ("allOf", "anyOf", "oneOf"):
            if type(node[word]) is list:
                stack.extend((member, open_refs) for member in node[word])
        elif word == "$ref":
            stack.extend(_children(root, node, open_refs, targets))
        elif word == "type":
            types = node["type"]
            if (types == "string" or (type(types) is list and "string" in types)) and (n := _repetition(node)):
                extra += _LEADING_UNIT << n
    return min(extra, cap + 1)


def _repetition(node: dict[str, Any]) -> int:
    """A string schema's counted repetition as outlines-core builds it: the larger of ``minLength`` / ``maxLength``
    (u64 integers; others build ``{0,}``), else the product of its ``pattern``'s quantifier bounds (each its
    largest number, at least 1), else 0. Capped at 63."""
    if "maxLength" in node or "minLength" in node:
        return min(max(_upper(node, "minLength") or 0, _upper(node, "maxLength") or 0), 63)
    pattern = node.get("pattern")
    if type(pattern) is not str:
        return 0
    product = 1
    for low, high in _QUANTIFIER.findall(pattern):  # 19 digits at most: no long int parse
        product = min(product * max(int(low[:19]), int(high[:19] or 0), 1), 1 << 63)
    return min(product if product > 1 else 0, 63)


def required_tools_chars(tools: list[tuple[Any, int]]) -> int:
    """Upper bound of outlines-core's expression for vLLM's ``tool_choice: "required"`` schema (``{"type": "array",
    "minItems": 1, "items": {"type": "object", "anyOf": [{"properties": {"name": {"type": "string", "enum": [name]},
    "parameters": parameters}, "required": ["name", "parameters"]}, ...]}}``: the ``anyOf`` written twice), from
    ``tools``: ``(name, regex_chars of its parameters)`` per tool (a name that is not a string counts as its JSON).
    Raises nothing."""
    members = sum(n + 2 * (3 * _W + 3) + 14 + 2 * (_W + 1) + 4 + _W + len(re.escape(_json([name])))
                  for name, n in tools)
    return _ARRAY_BOUNDED + 2 * (1 + len(tools) + members)


def _keyword(node: dict[str, Any]) -> str | None:
    """The keyword outlines-core's ``to_regex`` dispatches ``node`` on (its order), or None (refused)."""
    for word in _KEYWORDS:
        if word in node:
            return word
    return None


def _children(root: Any, node: Any, open_refs: int, targets: dict[str, Any]) -> list[tuple[Any, int]]:
    """The ``(subschema, open references)`` whose counts ``node``'s count adds (each with weight >= 1); ``targets``:
    the references resolved so far in this count, by text."""
    if type(node) is not dict or not node:
        return []
    word = _keyword(node)
    if word == "properties":
        props = node["properties"]
        return [(v, open_refs) for v in props.values()] if type(props) is dict else []
    if word in ("allOf", "anyOf", "oneOf", "prefixItems"):
        items = node[word]
        return [(v, open_refs) for v in items] if type(items) is list else []
    if word == "$ref":
        ref = node["$ref"]
        if type(ref) is not str or open_refs >= REF_LEVELS or type(root) is not dict:
            return []
        if ref not in targets:  # each reference text resolved once per count
            targets[ref] = resolve_ref(root, ref)
        target = targets[ref]
        return [] if target is None else [(target, open_refs + 1)]
    if word == "type":
        types = node["type"]
        names = [types] if type(types) is str else [t for t in types if type(t) is str] if type(types) is list else []
        out = []
        ap = node.get("additionalProperties")
        if "object" in names and ap is not None and ap is not True and _upper(node, "maxProperties") != 0:
            out.append((ap, open_refs))
        if "array" in names and "items" in node and _upper(node, "maxItems") != 0:
            out.append((node["items"], open_refs))
        return out
    return []


def _upper(node: dict[str, Any], name: str) -> int | None:
    """``node[name]`` when it is a JSON unsigned integer (serde's ``as_u64``), else None."""
    value = node.get(name)
    return value if type(value) is int and value >= 0 else None


def _own(root: Any, node: Any, open_refs: int, memo: dict[tuple[int, int], int], targets: dict[str, Any]) -> int:
    """``node``'s count from its children's (in ``memo``), uncapped."""
    if type(node) is not dict:
        return 0
    if not node:
        return _EMPTY_SCHEMA
    word = _keyword(node)
    if word == "$ref" and open_refs >= REF_LEVELS:
        return _FAIL
    kids = [memo[(id(c), d)] for c, d in _children(root, node, open_refs, targets)]
    if word == "properties":
        return _properties(node, kids)
    if _FAIL in kids:  # the limit's error goes up to the nearest property, which is dropped
        return _FAIL
    if word == "allOf":
        return 2 + sum(kids)
    if word == "anyOf":  # ``(a|b)``; an empty list builds ``()`` (S27-attack27-4)
        return 1 + max(len(kids), 1) + sum(kids)
    if word == "oneOf":
        return 1 + max(5 * len(kids), 1) + sum(kids)
    if word == "prefixItems":
        return 4 + 2 * _W + sum(kids) + max(len(kids) - 1, 0) * (2 * _W + 1)
    if word in ("enum", "const"):
        return _literal(node[word])
    if word == "$ref":
        return sum(kids)
    if word == "type":
        types = node["type"]
        if type(types) is str:
            return _type(node, types, kids)
        if type(types) is list:
            return 1 + sum(_type(node, t, kids) + 5 for t in types if type(t) is str)
    return 0


def _properties(node: dict[str, Any], kids: list[int]) -> int:
    """``parse_properties``: ``kids`` the counts of the property values, in the map's order."""
    props = node["properties"]
    if type(props) is not dict:
        return 0
    required = node.get("required")
    names = set(r for r in required if type(r) is str) if type(required) is list else set()
    subs = [3 * _W + 3 + len(re.escape(name)) + kid for name, kid in zip(props, kids) if kid != _FAIL]
    n = len(subs)
    if names.intersection(props):  # each once; a comma on all but the last required, ``(...)?`` on the optional
        optional = sum(1 for name, kid in zip(props, kids) if name not in names and kid != _FAIL)
        return 4 + _W + sum(subs) + (_W + 1) * n + 3 * optional
    subs.sort(reverse=True)  # the largest order: property i of n written n - i times
    return 7 + _W + max(n - 1, 0) + sum((n - i) * s for i, s in enumerate(subs)) + (_W + 4) * (n * (n - 1) // 2)


def _type(node: dict[str, Any], name: str, kids: list[int]) -> int:
    """``parse_type_string`` of ``name`` for ``node``; ``kids``: the counts of its ``additionalProperties`` and / or
    ``items`` (as :func:`_children` lists them)."""
    if name in ("string",):
        if "maxLength" in node or "minLength" in node:
            return _STRING_LENGTH
        if type(pattern := node.get("pattern")) is str:
            return len(pattern) + 4
        return _STRING_FORMAT if type(node.get("format")) is str else _STRING
    if name == "number":
        return _NUMBER_DIGITS if any(k in node for k in _NUMBER_BOUNDS) else _NUMBER
    if name == "integer":
        return _INTEGER_DIGITS if "minDigits" in node or "maxDigits" in node else _INTEGER
    if name in _SCALAR:
        return _SCALAR[name]
    depth = _upper(node, "depth")
    depth = 2 if depth is None else depth
    nested = _UNCONSTRAINED[depth] if depth < len(_UNCONSTRAINED) else (_HUGE, _HUGE)
    ap = node.get("additionalProperties")
    if name == "object":
        if _upper(node, "maxProperties") == 0:
            return _EMPTY_CONTAINER
        if ap is None or ap is True:
            return nested[0]
        return 2 * (52 + kids[0]) + 30  # the key-value pattern (string key, value) twice
    if name == "array":
        if _upper(node, "maxItems") == 0:
            return _EMPTY_CONTAINER
        fixed = _ARRAY_BOUNDED if "minItems" in node or "maxItems" in node else _ARRAY
        if "items" in node:
            return fixed + 2 * kids[-1]
        return nested[1] - _ARRAY + fixed
    return 0


def _literal(value: Any) -> int:
    """An ``enum`` / ``const`` value's characters: its JSON regex-escaped, and for a list or object value (which
    outlines-core 0.2.14 builds, with its whitespace pattern beside every ``,`` ``:`` ``[`` ``]`` ``{`` ``}``: session
    27, attack27, S27-attack27-3) two whitespace patterns per such character of its JSON (an upper bound: one inside
    a string counts too)."""
    text = _json(value)
    size = len(re.escape(text))
    if type(value) is list or type(value) is dict:  # an ``enum``'s own list too: its commas become ``|`` (over)
        size += 2 * _W * sum(map(text.count, ",:[]{}"))
    return size


def _json(value: Any) -> str:
    """``value`` as compact JSON text (orjson; :mod:`json` for what orjson does not encode)."""
    try:
        return orjson.dumps(value).decode()
    except (TypeError, orjson.JSONEncodeError):
        import json

        try:
            return json.dumps(value, ensure_ascii=False, separators=(",", ":"))
        except (RecursionError, ValueError):
            return ""
