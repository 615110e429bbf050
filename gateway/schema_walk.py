"""The one-pass bounds walk of a JSON schema (``limits.json_schema``; the bounds, their units and sources:
gateway/response_format.py), and the 400 it answers. Split out of gateway/response_format.py in session 30
(attack30), which had reached the 400-line module limit; behaviour unchanged but for S30-attack30-2 (a reference is
also resolved inside vLLM's ``tool_choice: "required"`` schema of all tools, ``shared``).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from gateway.errors import GatewayError
from gateway.pattern_quote import QUOTE_READING_FORMATS, pattern_reads_quote
from gateway.schema_patterns import (ITEM_KEYS, REF_COPIES_NODES, alternatives_cost, item_copies, pattern_cost,
                                     subtree_states)
from gateway.schema_refs import resolve_ref, unwalked_targets
from gateway.schema_refusal import MAX_PARAM_CHARS, Node, path_node, refused
from gateway.schema_refusal import path_param as param_of

__all__ = ["MAX_PARAM_CHARS", "Node", "Shared", "largest_count", "param_of", "path_node", "refused", "walk_bounds"]

#: the counted-repetition keywords :data:`JSON_SCHEMA_BOUNDS` ``max_item_count`` bounds (session 29)
_COUNTS = frozenset({"minItems", "maxItems", "minProperties", "maxProperties", "minContains", "maxContains"})

#: keywords whose object maps names to subschemas: the map itself is no schema level
_NAME_MAPS = frozenset({"properties", "$defs", "definitions", "patternProperties", "dependentSchemas"})
#: keywords whose value is data (an instance), never a schema: its keys are not keywords
_DATA = frozenset({"enum", "const", "default", "examples"})
#: keys whose object a compiler takes as a schema root of its own (a ``structural_tag``'s; S29-final29-6)
_SUBROOTS = frozenset({"schema", "json_schema"})
_SCHEMA, _MAP, _VALUE = 0, 1, 2  # what a walked value is
_CONTAINERS = frozenset({dict, list})


def walk_bounds(roots: list[tuple[Any, tuple[str, ...]]], bound: dict[str, Any], what: str, subject: str,
                quoted: list[Node], shared: Callable[[], Shared] | None = None,
                copies: int | list[int] = 1) -> GatewayError | None:
    """Walk each schema of ``roots`` (``(schema, path)``, the last first) with shared counts and refuse the first
    bound they pass (see the module docstring); ``what`` names them in the audit reason, ``subject`` in the message.

    Work: O(1) per JSON container below ``root`` (session 25, S25-review-2: each pushed value links to its parent's
    path node, ``(parent, key)``, instead of copying the whole path tuple, which made the walk values x depth: 57
    ms of CPU for a 61 KiB schema of 31,000 zeros 250 lists deep); scalars are never pushed (their checks are made
    at their key); the path is spelled out only for a refusal (:func:`param_of`). With ``quote_reading_patterns``
    ``"refuse"``, the first ``pattern`` that :func:`gateway.pattern_quote.pattern_reads_quote`, or ``format`` in
    :data:`~gateway.pattern_quote.QUOTE_READING_FORMATS` beside no ``pattern``, is appended to ``quoted`` (refused
    after the other bounds: O(characters) per pattern, bounded by ``max_pattern_chars``). S29-final29-1: a ``$ref``'s
    target the walk saw as data (in ``enum``, ``const``, ``default``, ``examples``) or as a name map (``#/$defs``)
    is walked as a schema too, each target once (compilers resolve any pointer; schema_refs.unwalked_targets); since
    session 31 (S30-attack30-4) a reference that is no ``#/`` pointer also walks every object named by ``$id`` /
    ``$anchor`` / ``$dynamicAnchor`` (:func:`_targets`).
    ``shared`` (session 30, S30-attack30-2): called once, when the walk has met a reference, for ``(schemas,
    per_root, ids)``: schemas every reference is also resolved in (vLLM's and SGLang's ``required`` schemas of all
    tools, where a tool's ``#/$defs/...`` reaches another tool's definitions), a schema per root (by ``id``) that the
    references found under that root are also resolved in (SGLang's named-choice array of that tool), and the ids of
    their own containers (never walked: what they hold of the client's is walked from the roots). S30-attack30-7: a ``grammar`` string, and the ``pattern`` of an
    object whose ``type`` is ``"regex"`` (a structural tag's contents), may hold no counted repetition over
    ``max_item_count`` (:func:`largest_count`), nor the ``min`` / ``max`` of an object whose ``type`` is
    ``"repeat"``. ``max_pattern_states`` (session 30, pattern30): each quote-free pattern's count times the copies
    outlines-core writes of it (``copies`` for the roots: one count for all, or one per root in ``roots``' order, since
    session 31 (S31-review31-4: a named ``tool_choice`` compiles its tool twice, the others once); times each array's
    :func:`~gateway.schema_patterns.item_copies` above it); the sum is left in ``bound["states"]``
    (:func:`gateway.schema_patterns.refs_states_refusal`)."""
    properties = enums = pattern_chars = states = 0
    quotes = bound["quote_reading_patterns"] == "refuse"
    # (value, path node, depth, kind, the roots it may be in, the copies outlines-core writes of it: array items)
    stack: list[tuple[Any, Node, int, int, tuple, int]] = []
    for i, (root, path) in enumerate(roots):
        stack.append((root, path_node(path), 0, _SCHEMA, (root,), copies if type(copies) is int else copies[i]))
    walked: set[int] = set()  # S29-final29-1: ids of what was walked as schemas; refs: {(text, id(root)): ...}
    scanned: set[int] = set()  # S30-attack30-4: ids of the schemas scanned for named objects (once each per walk)
    refs: dict[tuple[str, int], tuple[Node, int, tuple, Any, int]] = {}
    others: Shared | None = None  # ``shared``'s schemas, once asked for
    copied: list[tuple[Node, str, tuple, int]] = []  # references met where their schema is written more than once
    while stack or refs:
        if not stack:  # a $ref into data (default, const) or a name map: its target is a schema too
            if shared is not None and others is None:
                others = shared()
                walked.update(others[2])
            stack.extend((node, (refs[key][0], "$ref"), refs[key][1], _SCHEMA, refs[key][2], 1)  # copies: ``copied``
                         for node, key in _targets(_where_resolved(refs, others), walked, scanned))
            refs = {}
            continue
        cur, where, depth, kind, top, times = stack.pop()
        if kind == _SCHEMA:
            walked.add(id(cur))
            if type(cur) is dict and type(ref := cur.get("$ref")) is str:
                for root in top:  # a structural tag's schema is a root of its own (xgrammar): each may hold it
                    refs.setdefault((ref, id(root)), (where, depth, top, root, times))
                if times > 1 and bound["max_pattern_states"] is not None:  # S30-review30-2: its copies
                    copied.append((where, ref, top, times))
                if shared is not None:  # key 0 (no object's id): resolved in ``shared``'s schemas
                    refs.setdefault((ref, 0), (where, depth, top, None, times))
                    refs.setdefault((ref, -id(top[0])), (where, depth, top, top, times))  # in its root's own wrapper
        if type(cur) is list:
            if _CONTAINERS.isdisjoint(map(type, cur)):  # strings, numbers (an enum's values): one pass in C (cut)
                continue
            stack.extend((v, (where, i), depth, kind, top, times) for i, v in enumerate(cur)
                         if type(v) is dict or type(v) is list)
            continue
        if type(cur) is not dict:  # the root only: nothing else that is not a container is pushed
            continue
        if kind != _MAP:
            depth += 1
            if depth > bound["max_depth"]:
                return refused(param_of(where), f"{subject} nests more than {bound['max_depth']} schema levels",
                                "max_depth", what)
        for key, value in cur.items():
            if (key == "anyOf" or key == "oneOf") and kind == _SCHEMA and type(value) is list and bound[
                    "max_pattern_states"] is not None and (states := states + alternatives_cost(
                    value, bound["tenant"], bound["max_pattern_states"]) * times) > bound["max_pattern_states"]:
                return refused(param_of((where, key)), f"{subject} has patterns whose automata need more than "
                               f"{bound['max_pattern_states']} states together", "max_pattern_states", what)
            if kind == _MAP:
                assert where is not None
                if where[1] == "properties":
                    properties += 1
                    if properties > bound["max_properties"]:
                        return refused(param_of(where), f"{subject} has more than "
                                        f"{bound['max_properties']} properties", "max_properties", what)
                elif where[1] == "patternProperties":
                    pattern_chars += len(key)
                    if pattern_chars > bound["max_pattern_chars"]:
                        return refused(param_of((where, key)), f"{subject} has patterns of more than "
                                        f"{bound['max_pattern_chars']} characters together", "max_pattern_chars", what)
                next_kind = _SCHEMA
            elif kind == _VALUE:
                next_kind = _VALUE
            elif key in _DATA:
                if key == "enum" and type(value) is list:
                    enums += len(value)
                    if enums > bound["max_enum_values"]:
                        return refused(param_of((where, key)), f"{subject} has more than "
                                        f"{bound['max_enum_values']} enum values", "max_enum_values", what)
                next_kind = _VALUE
            elif key == "pattern" and type(value) is str:
                pattern_chars += len(value)
                if pattern_chars > bound["max_pattern_chars"]:
                    return refused(param_of((where, key)), f"{subject} has patterns of more than "
                                    f"{bound['max_pattern_chars']} characters together", "max_pattern_chars", what)
                if (reads := quotes and pattern_reads_quote(value)) and not quoted:
                    quoted.append((where, key))
                if cur.get("type") == "regex" and (over := _count_refusal(value, bound, where, key, subject, what)):
                    return over  # S30-attack30-7: a structural tag's regex content (xgrammar's rule repetition)
                if bound["max_pattern_states"] is not None and not reads and (states := states + times * pattern_cost(
                        bound["tenant"], value, bound["max_pattern_states"])) > bound["max_pattern_states"]:
                    return refused(param_of((where, key)), f"{subject} has patterns whose automata need more than "
                                   f"{bound['max_pattern_states']} states together", "max_pattern_states", what)
                continue
            elif key == "grammar" and type(value) is str:  # S30-attack30-7: a structural tag's EBNF content
                if (over := _count_refusal(value, bound, where, key, subject, what)) is not None:
                    return over
                continue
            elif key == "format" and quotes and type(value) is str and value in QUOTE_READING_FORMATS and (
                    type(cur.get("pattern")) is not str):
                if not quoted:  # outlines-core builds it from a regular expression that reads the quote
                    quoted.append((where, key))
                continue
            elif (key in _COUNTS or (key == "min" or key == "max") and cur.get("type") == "repeat") and (
                    type(value) is int or type(value) is float):  # S30-attack30-7: a structural tag's repeat
                if bound["max_item_count"] is not None and value > bound["max_item_count"]:
                    return refused(param_of((where, key)), f"{subject} asks for {key} over "
                                    f"{bound['max_item_count']}", "max_item_count", what)
                continue
            else:
                next_kind = _MAP if key in _NAME_MAPS and type(value) is dict else _SCHEMA
            if type(value) is dict or type(value) is list:  # a scalar holds nothing more to walk
                stack.append((value, (where, key), depth, next_kind,
                              top + (value,) if key in _SUBROOTS and type(value) is dict else top,
                              times * item_copies(cur) if key in ITEM_KEYS and kind == _SCHEMA else times))
    nodes = [REF_COPIES_NODES]  # shared by the references' counts
    for where, ref, top, times in copied:  # S30-review30-2: a target counted once above, written ``times`` times
        cap = bound["max_pattern_states"]
        if (states := states + max(subtree_states(resolve_ref(root, ref) if type(root) is dict else None,
                                                  bound["tenant"], cap, times - 1, root, nodes) for root in top)) > cap:
            return refused(param_of((where, "$ref")), f"{subject} has patterns whose automata need more than {cap} "
                           "states together", "max_pattern_states", what)
    bound["states"] = states  # the patterns' states, walked (gateway.schema_patterns.refs_states_refusal)
    return None


#: the keys that name a schema object for a ``$ref`` that is no JSON pointer (S30-attack30-4)
_NAMING_KEYS = ("$id", "$anchor", "$dynamicAnchor")


def _targets(refs: list[tuple[Any, tuple[str, int]]], walked: set[int],
             scanned: set[int]) -> list[tuple[Any, tuple[str, int]]]:
    """:func:`gateway.schema_refs.unwalked_targets` of ``refs`` (``(schema it resolves in, key)``), then, for a
    reference that is no ``#/`` pointer (``#name``, ``urn:x``, ``item.json#/a``: a ``$anchor``, ``$id`` or
    ``$dynamicAnchor`` name in JSON Schema's URI resolution, which llguidance may follow and the pointer resolution does
    not), every object of the schema it resolves in that carries such a key with a string value and was not walked
    (hidden in ``default`` or ``examples``: session 31, tools31, S30-attack30-4), with the reference's key. One scan
    of each container per walk (``scanned``: the ids of the schemas and containers scanned, updated; O(containers) per
    walk however the schemas nest: S31-review31b-1), only when such a reference exists;
    an over-count at most (outlines-core refuses these references, xgrammar compiles any value there). Raises
    nothing."""
    out = unwalked_targets(refs, walked)
    for root, key in refs:
        if type(root) is not dict or id(root) in scanned or key[0].startswith("#/") or key[0] == "#":
            continue
        scanned.add(id(root))
        stack: list[Any] = [root]
        while stack:
            cur = stack.pop()
            values = cur.values() if type(cur) is dict else cur
            if type(cur) is dict and id(cur) not in walked and any(type(cur.get(k)) is str for k in _NAMING_KEYS):
                walked.add(id(cur))
                out.append((cur, key))
            # S31-review31b-1: each container once per walk (the schemas nest: subroots, the tools' wrappers); what
            # an earlier scan passed is all found (``walked``), so scanning it again finds nothing
            for v in values:
                if (type(v) is dict or type(v) is list) and id(v) not in scanned:
                    scanned.add(id(v))
                    stack.append(v)
    return out


#: what ``walk_bounds``'s ``shared`` returns: schemas every reference is resolved in, a schema per root id, the ids of
#: their own containers
Shared = tuple[list[Any], dict[int, Any], set[int]]


def _where_resolved(refs: dict[tuple[str, int], tuple[Node, int, tuple, Any, int]],
                    others: Shared | None) -> list[tuple[Any, tuple[str, int]]]:
    """``(schema, key)`` for each reference of ``refs`` and each schema it is resolved in: its own root (``v[3]`` a
    dict), every shared schema (``v[3]`` None), its walk root's own wrapper (``v[3]`` the ``top`` tuple)."""
    out: list[tuple[Any, tuple[str, int]]] = []
    for key, v in refs.items():
        holder = v[3]
        if type(holder) is dict:
            out.append((holder, key))
        elif others is not None and holder is None:
            out.extend((schema, key) for schema in others[0])
        elif others is not None and (own := others[1].get(id(holder[0]))) is not None:
            out.append((own, key))
    return out


#: a counted repetition ``{n}``, ``{n,}``, ``{n,m}`` (spaces allowed) of an EBNF grammar or a regular expression, and
#: Lark's ``~ n`` / ``~ n..m`` (xgrammar's ``"syntax": "lark"``)
_COUNTED = re.compile(r"\{\s*(\d+)\s*(?:,\s*(\d*)\s*)?\}|~\s*(\d+)(?:\s*\.\.\s*(\d+))?")


def largest_count(text: str) -> int:
    """The largest bound of a counted repetition (``{n}``, ``{n,}``, ``{n,m}``; Lark's ``~ n``, ``~ n..m``) in ``text``
    (an xgrammar EBNF or Lark grammar, or a regular expression), 0 for none; a bound of more than 9 digits counts as
    10**9 (never converted: CPython's str->int is quadratic). Text inside a quoted literal counts too (fail closed).
    O(len(text)); raises nothing."""
    largest = 0
    for m in _COUNTED.finditer(text):
        for digits in m.groups():
            if digits:
                largest = max(largest, int(digits) if len(digits) <= 9 else 10**9)
    return largest


def _count_refusal(text: str, bound: dict[str, Any], where: Node, key: str, subject: str,
                   what: str) -> GatewayError | None:
    """``max_item_count`` over the counted repetitions of a structural tag's ``grammar`` / ``regex`` content (session
    30, S30-attack30-7: xgrammar compiles ``("," [0-9]){4999,}`` into the rule repetition ``minItems`` 5000 builds,
    at the same matcher cost), else None; ``max_item_count`` None: not checked."""
    cap = bound["max_item_count"]
    if cap is None or largest_count(text) <= cap:
        return None
    return refused(param_of((where, key)), f"{subject} asks for a counted repetition over {cap} in a grammar or "
                   "regular expression", "max_item_count", what)
