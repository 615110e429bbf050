"""Bounds on a chat body's ``response_format`` schema, the input of the replica's grammar compiler (session 24,
S23-fields-2), checked on the decoded JSON before schema validation.

``response_format: {"type": "json_schema", "json_schema": {"schema": ...}}`` (OpenAI's Structured Outputs; vLLM's
``structural_tag`` carries schemas too) is compiled by the replica into a grammar or automaton (xgrammar,
outlines, llguidance in vLLM and SGLang) before the first token. That compile costs the replica CPU and memory
that no token quota charges, and it grows faster than the schema: nested ``anyOf``/``oneOf`` and regular
expressions (``pattern``, ``patternProperties``) can expand exponentially. vLLM guards only a regex's compile with
a timeout (``compile_regex_with_timeout``, since 0.24.0: GHSA-rwxx-mrjm-wc2m / CVE-2026-55574); its JSON-schema
compile has none (vllm-project/vllm#54003, open; PRs #45172, #54090 open), nor has SGLang's (sgl-project/sglang
#39125, open). So the gateway bounds the schema before forwarding it, as it bounds ``tools``
(gateway/free_form.py), with :class:`gateway.config_http.JsonSchemaLimits` (``limits.json_schema``; each bound
overridden per tenant by ``tenants[].json_schema_limits``):

* ``max_bytes``: compact JSON UTF-8 bytes of the whole ``response_format``, and of its schema once its local ``$ref``
  are inlined (session 25, S25-review-5: :mod:`gateway.schema_refs`);
* ``max_depth``: schema levels: nested JSON objects below ``json_schema.schema`` (the schema itself is level 1; the
  name maps ``properties``, ``$defs``, ``definitions``, ``patternProperties``, ``dependentSchemas`` add none, so
  ``{"properties": {"a": {...}}}`` nests ``a`` one level below; objects inside ``enum``/``const`` count too).
  Another ``response_format`` type is walked whole from ``response_format`` itself (level 1);
* ``max_properties``: entries of every ``properties`` map together;
* ``max_enum_values``: entries of every ``enum`` list together;
* ``max_pattern_chars``: characters of every ``pattern`` string and ``patternProperties`` key together.
* ``max_regex_chars`` (session 27, expand27, S27-review27-3): characters of the regular expression a compiler that
  inlines the schema (outlines-core) builds from it, an upper bound (:mod:`gateway.schema_expansion`): for a tool,
  also all the tools together as vLLM's ``tool_choice: "required"`` schema; ``None``: not checked.
* ``quote_reading_patterns`` (session 29, pattern29, S29-pattern29-1): ``"refuse"`` (default) refuses a ``pattern``
  that can read the string's closing ``"`` once outlines-core inlines it between quotes, and a ``format`` it builds
  from such a regular expression (``uri``, ``email``) without a ``pattern`` (:mod:`gateway.pattern_quote`; such a
  schema kills an outlines-core replica: S28-pattern28-2); checked after the other bounds; ``"allow"``: not checked
  (xgrammar, llguidance). ``patternProperties`` keys and ``propertyNames`` are not inlined by outlines-core.
* ``max_item_count`` (session 29, xgrammar29, S29-xgrammar29-1): the largest ``minItems``, ``maxItems``,
  ``minProperties``, ``maxProperties``, ``minContains`` or ``maxContains`` (S29-final29-3) (each value on its own;
  xgrammar 0.2.9 compiles them into a counted repetition whose matcher holds more parser states per item past a lower
  bound of 129: memory and ``accept_token`` time per item grow with the bound; bench/s29_xgrammar29_mask_fill.py);
  ``None``: not checked.
* ``max_pattern_states`` (session 30, pattern30, S30-pattern30-1): the states of the automata of every quote-free
  ``pattern`` together (:mod:`gateway.pattern_states`, cached per tenant by :mod:`gateway.schema_patterns`); ``None``:
  not checked (xgrammar, llguidance).

OpenAI documents its own limits of a Structured Outputs schema (platform.openai.com/docs/guides/structured-outputs,
"Supported schemas"): at most 5,000 object properties, 10 levels of object nesting, 1,000 enum values, 120,000
characters of property names, definition names, enum and const values (first published: 100 properties, 5 levels,
500 enum values, 15,000 characters); it documents no bound on patterns. vLLM and SGLang document none. The
defaults here take OpenAI's property and enum counts, allow 20 schema levels (10 object levels with an array
between each), and bound bytes (64 KiB) and pattern characters (1,024) tighter, since the compile cost grows
with them: a tenant that needs more gets its own values.

A refusal is 400 ``json_schema_too_complex`` (type ``invalid_request_error``) whose ``param`` is the client's path to
what passed the bound (``response_format.json_schema.schema.properties.a.pattern``; keys shown as
:func:`gateway.unknown_fields.field_label` shows them: bounded, escaped), so its body holds client text
(``client_text``: rendered per answer, never cached). The audit record's ``reason`` names the bound only.
Session 25 (S24-fields-1, S25-review-3): each ``tools[].function.parameters`` schema takes the same walk and
bounds (:func:`tools_refusal`, ``param`` ``tools.N.function.parameters...``), whatever ``tool_choice`` says, and
``max_tool_schemas_bytes`` bounds the compact JSON bytes of all of them together (default 256 KiB: four
``max_bytes``), and since session 26 (S26-review26-4) their sum once their local ``$ref`` are inlined. A body
without ``tools`` costs one key test.
The schema's values are also counted in ``max_free_values`` (gateway/free_form.py) and its rendering in the
first sequence's prompt bytes (gateway/request.py ``extra_text``), as before.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gateway.errors import GatewayError
from gateway.pattern_quote import QUOTE_READING_FORMATS, pattern_reads_quote
from gateway.schema_expansion import regex_chars, required_schema
from gateway.schema_patterns import ITEM_KEYS, alternatives_cost, item_copies, pattern_cost, refs_states_refusal
from gateway.schema_refs import TOO_DEEP as _TOO_DEEP
from gateway.schema_refs import encoded_bytes as _encoded_bytes
from gateway.schema_refs import inlined_bytes, unwalked_targets
from gateway.schema_refusal import MAX_PARAM_CHARS
from gateway.schema_refusal import Node as _Node
from gateway.schema_refusal import path_node as _node
from gateway.schema_refusal import path_param as _param
from gateway.schema_refusal import refused as _refused

__all__ = ["JSON_SCHEMA_BOUNDS", "MAX_PARAM_CHARS", "response_format_refusal", "tools_refusal"]

#: the names of the bounds (``limits.json_schema`` keys, ``tenants[].json_schema_limits`` keys)
JSON_SCHEMA_BOUNDS = ("max_bytes", "max_depth", "max_properties", "max_enum_values", "max_pattern_chars",
                      "max_tool_schemas_bytes", "max_regex_chars", "quote_reading_patterns",
                      "max_item_count", "max_pattern_states")
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


def response_format_refusal(response_format: Any, limits: Any, overrides: Mapping[str, int | str | None],
                            body_bytes: int, tenant: str = "") -> GatewayError | None:
    """The 400 for a decoded chat body's ``response_format`` over a bound (see the module docstring), else None.

    ``limits``: an object with the :data:`JSON_SCHEMA_BOUNDS` attributes (ints; ``limits.json_schema``);
    ``overrides``: the tenant's own values by name (``Tenant.json_schema_limits``), which take precedence;
    ``body_bytes``: the length of the body ``response_format`` was decoded from (a body no longer than
    ``max_bytes`` needs no byte count). Types are not checked here (the schema does); a value that is not an
    object is left to it. Work: one C encoding of ``response_format`` when the body is longer than ``max_bytes``,
    then a walk that stops at the first bound passed, then the inlined count (:func:`_inlined_refusal`), then
    the regular expression's estimate (:func:`_regex_refusal`, O(nodes); session 27), then the first pattern the walk
    found reading the closing quote (``quote_reading_patterns``, session 29). ``tenant``: the tenant's id, the key of
    its cached pattern counts (``max_pattern_states``, session 30). Raises nothing."""
    if type(response_format) is not dict:
        return None
    bound: dict[str, Any] = {k: overrides.get(k, getattr(limits, k)) for k in JSON_SCHEMA_BOUNDS} | {"tenant": tenant}
    if body_bytes > bound["max_bytes"] and (size := _encoded_bytes(response_format)) > bound["max_bytes"]:
        if size == _TOO_DEEP:  # S25-review-1: was a RecursionError, a 500 and a traceback; the decoder's own answer
            return GatewayError(400, "invalid_json", "request body is nested too deeply")
        return _refused("response_format", f"response_format is larger than {bound['max_bytes']} bytes as compact "
                        "JSON", "max_bytes")
    root: Any = response_format
    path: tuple[str, ...] = ("response_format",)
    spec = response_format.get("json_schema")
    if response_format.get("type") == "json_schema" and type(spec) is dict and "schema" in spec:
        root, path = spec["schema"], ("response_format", "json_schema", "schema")
    quoted: list[_Node] = []
    return _walk([(root, path)], bound, "response_format", "response_format", quoted) or _inlined_refusal(
        [(root, path)], bound, "response_format", "response_format") or (
        _regex_refusal(root, path, bound["max_regex_chars"], "response_format", "response_format")
        if len(path) > 1 else None) or refs_states_refusal(
        [(root, path)], bound, "response_format", "response_format") or _quote_refusal(
        quoted, "response_format", "response_format")


def tools_refusal(tools: Any, limits: Any, overrides: Mapping[str, int | str | None], body_bytes: int,
                  tool_choice: Any = "required", tenant: str = "") -> GatewayError | None:
    """The 400 for a decoded chat body's ``tools`` whose ``function.parameters`` schemas pass a bound of
    :data:`JSON_SCHEMA_BOUNDS`, else None (session 25: S24-fields-1, S25-review-3).

    Why: the replica compiles a tool's parameters into a grammar before the first token as it compiles a
    ``response_format`` (vLLM docs/features/tool_calling.md, "Named Function Calling" and "Required Function
    Calling": guided decoding over "the tool parameter object defined by the JSON schema in the ``tools``
    parameter"; for ``required`` an ``anyOf`` over every tool; strict tools under ``auto`` too). Every tool counts
    whatever ``tool_choice`` says: the gateway does not know which tools a replica compiles (fail closed). Each
    tool's ``parameters`` is walked as a ``response_format`` schema is (the schema itself level 1; ``param``
    ``tools.N.function.parameters...``), with the counts of ``max_properties``, ``max_enum_values`` and
    ``max_pattern_chars`` shared by all tools (``required`` compiles an ``anyOf`` over every tool, S25-review-3);
    ``max_bytes`` bounds each tool's schema, also with its local ``$ref`` inlined, and ``max_tool_schemas_bytes`` the
    compact JSON bytes of all of them together, and their sum once inlined (:func:`_tools_inlined_refusal`).

    ``limits``, ``overrides``: as :func:`response_format_refusal`; ``body_bytes``: the length of the body ``tools``
    was decoded from (a body no longer than the byte bounds needs no encoding). A ``tools`` that is not a list, an
    entry or ``function`` that is not an object, ``parameters`` that is not an object: left to the schema. Work:
    nothing for a body without ``tools`` (the caller's key test); else one walk per tool (O(containers)), one C
    encoding per tool only when the body is longer than a byte bound, and the inlined count of each tool
    (:func:`_tools_inlined_refusal`), then each tool's regular expression estimate and, only when ``tool_choice``
    (the body's) is ``"required"``, their sum (:func:`_tools_regex_refusal`; session 27: vLLM builds that one
    schema of every tool for ``required`` only; the default, for a caller that does not say, counts it).
    ``tenant``: as :func:`response_format_refusal`. Raises nothing."""
    if type(tools) is not list:
        return None
    bound: dict[str, Any] = {k: overrides.get(k, getattr(limits, k)) for k in JSON_SCHEMA_BOUNDS} | {"tenant": tenant}
    count_bytes = body_bytes > min(bound["max_bytes"], bound["max_tool_schemas_bytes"])
    total = 0
    roots: list[tuple[Any, tuple[str, ...]]] = []
    for i, tool in enumerate(tools):
        fn = tool.get("function") if type(tool) is dict else None
        params = fn.get("parameters") if type(fn) is dict else None
        if type(params) is not dict:
            continue
        path = ("tools", str(i), "function", "parameters")
        roots.append((params, path))
        if count_bytes:
            size = _encoded_bytes(params)
            if size == _TOO_DEEP:  # S25-review-1: the decoder's own answer, never a RecursionError
                return GatewayError(400, "invalid_json", "request body is nested too deeply")
            node = _node(path)
            if size > bound["max_bytes"]:
                return _refused(_param(node), f"tools[{i}].function.parameters is larger than {bound['max_bytes']} "
                                "bytes as compact JSON", "max_bytes", "tools parameters")
            total += size
            if total > bound["max_tool_schemas_bytes"]:
                return _refused(_param(node), "the tools' parameters schemas are larger than "
                                f"{bound['max_tool_schemas_bytes']} bytes together as compact JSON",
                                "max_tool_schemas_bytes", "tools parameters")
    if not roots:
        return None
    subject = "tools[].function.parameters"  # counted together: ``required`` compiles an anyOf over every tool
    quoted: list[_Node] = []
    # vLLM's ``required`` schema writes every tool twice (an array of them): each pattern's states twice (session 30)
    if (refused := _walk(roots[::-1], bound, "tools parameters", subject, quoted,
                         2 if tool_choice == "required" else 1)) is not None:
        return refused
    return _tools_inlined_refusal(roots, bound, body_bytes, subject) or _tools_regex_refusal(
        tools, roots, bound["max_regex_chars"], subject, together=tool_choice == "required") or refs_states_refusal(
        roots, bound, "tools parameters", subject, 2 if tool_choice == "required" else 1) or _quote_refusal(
        quoted, "tools parameters", subject)


def _quote_refusal(quoted: list[_Node], what: str, subject: str) -> GatewayError | None:
    """``quote_reading_patterns`` (session 29, S29-pattern29-1): the 400 for the first ``pattern`` / ``format``
    :func:`_walk` found reading the string's closing ``"`` (``quoted``: its path node), else None."""
    if not quoted:
        return None
    return _refused(_param(quoted[0]), f"{subject} has a pattern or format that can read the string's closing quote "
                    "in a compiler that inlines it (outlines-core): use a class without it, such as [^\"] or an "
                    "explicit [A-Za-z0-9._-], instead of ., \\S or a negated class, group alternatives, and no "
                    "format uri / email", "quote_reading_patterns", what)


def _regex_refusal(root: Any, path: tuple[str, ...], cap: int | None, what: str, subject: str) -> GatewayError | None:
    """``max_regex_chars`` (session 27, expand27, S27-review27-3): the 400 when the regular expression an inlining
    compiler builds from ``root`` (:func:`gateway.schema_expansion.regex_chars`, an upper bound of outlines-core's)
    is longer than ``cap`` characters; ``cap`` None: off (replicas that compile with xgrammar or llguidance). Work:
    O(nodes), stopping at the bound."""
    if cap is None or regex_chars(root, cap) <= cap:
        return None
    return _refused(_param(_node(path)), f"{subject} builds a regular expression of more than {cap} characters in a "
                    "compiler that inlines it (outlines-core)", "max_regex_chars", what)


def _tools_regex_refusal(tools: list[Any], roots: list[tuple[Any, tuple[str, ...]]], cap: int | None,
                         subject: str, together: bool = True) -> GatewayError | None:
    """``max_regex_chars`` over each tool's ``parameters`` whatever ``tool_choice`` says (a named ``tool_choice``
    compiles it alone, a strict tool under ``auto`` too: fail closed), then, when ``together``, over vLLM's
    ``tool_choice: "required"`` schema of all of them (:func:`gateway.schema_expansion.required_schema`: an array
    whose ``items`` are an ``anyOf`` of every tool, written twice, their ``$defs`` merged); only ``required`` builds
    that schema, so an agent's many tools under ``auto`` are not counted together (session 27: 26 ordinary tools
    make ~1.2 M characters). ``cap`` None: off."""
    if cap is None:
        return None
    for root, path in roots:
        if regex_chars(root, cap) > cap:
            return _refused(_param(_node(path)), f"{subject} builds a regular expression of more than {cap} "
                            "characters in a compiler that inlines it (outlines-core)", "max_regex_chars",
                            "tools parameters")
    # the one schema the replica compiles for ``required``, counted whole (S27-attack27-2: a sum of the tools, each
    # against its own root, missed references across tools and ``#`` meaning the wrapper; it is no longer computed)
    if not together or regex_chars(required_schema(tools), cap) <= cap:
        return None
    return _refused("tools", f"the tools' parameters schemas build a regular expression of more than {cap} characters "
                    "together (tool_choice required) in a compiler that inlines it (outlines-core)",
                    "max_regex_chars", "tools parameters")


def _tools_inlined_refusal(roots: list[tuple[Any, tuple[str, ...]]], bound: dict[str, int], body_bytes: int,
                           subject: str) -> GatewayError | None:
    """Each tool's schema over ``max_bytes`` once its local ``$ref`` are inlined (as :func:`_inlined_refusal`), then
    all of them over ``max_tool_schemas_bytes`` together once inlined (session 26, review26, S26-review26-4: each was
    bounded by ``max_bytes`` alone, so 128 tools of ~1 KB, each inlining to just under 64 KiB, compiled ~8 MB as
    ``required``'s ``anyOf``). A schema without references counts its compact bytes, encoded only when the
    references' sum plus the body's length could pass the bound. Work: one count per schema (O(nodes +
    references)), at most one C encoding per schema without references."""
    cap_one, cap_all = bound["max_bytes"], bound["max_tool_schemas_bytes"]
    counts = []
    for root, path in roots:
        n = inlined_bytes(root, _encoded_bytes, max(cap_one, cap_all))
        if n > cap_one:
            return _refused(_param(_node(path)), f"{subject} is larger than {cap_one} bytes as compact JSON once its "
                            "local $ref are inlined", "max_bytes", "tools parameters")
        counts.append(n)
    total = sum(counts)
    if total + body_bytes <= cap_all:
        return None
    for (root, _), n in zip(roots, counts):
        if n == 0:
            total += _encoded_bytes(root)
    if total <= cap_all:
        return None
    return _refused("tools", f"the tools' parameters schemas are larger than {cap_all} bytes together as compact "
                    "JSON once their local $ref are inlined", "max_tool_schemas_bytes", "tools parameters")


def _inlined_refusal(roots: list[tuple[Any, tuple[str, ...]]], bound: dict[str, int], what: str,
                     subject: str) -> GatewayError | None:
    """``max_bytes`` over the schemas of ``roots`` together once their local ``$ref`` are inlined
    (:func:`gateway.schema_refs.inlined_bytes`; session 25, S25-review-5: 20 definitions each referring to the
    next twice, ~1.3 KB within every other bound, inline to 2**20 copies in a compiler that inlines references);
    ``param`` names the first root over it. Work: one pass over each schema's containers to find its local
    references (any form, session 26, S26-review26-1: not only top-level definitions); with references, O(nodes +
    references) more and one C encoding per node a reference reaches."""
    cap, total = bound["max_bytes"], 0
    for root, path in roots:
        total += inlined_bytes(root, _encoded_bytes, cap)
        if total > cap:
            return _refused(_param(_node(path)), f"{subject} is larger than {cap} bytes as compact JSON once its local "
                            "$ref are inlined", "max_bytes", what)
    return None


def _walk(roots: list[tuple[Any, tuple[str, ...]]], bound: dict[str, Any], what: str,
          subject: str, quoted: list[_Node], copies: int = 1) -> GatewayError | None:
    """Walk each schema of ``roots`` (``(schema, path)``, the last first) with shared counts and refuse the first
    bound they pass (see the module docstring); ``what`` names them in the audit reason, ``subject`` in the message.

    Work: O(1) per JSON container below ``root`` (session 25, S25-review-2: each pushed value links to its parent's
    path node, ``(parent, key)``, instead of copying the whole path tuple, which made the walk values x depth: 57
    ms of CPU for a 61 KiB schema of 31,000 zeros 250 lists deep); scalars are never pushed (their checks are made
    at their key); the path is spelled out only for a refusal (:func:`_param`). With ``quote_reading_patterns``
    ``"refuse"``, the first ``pattern`` that :func:`gateway.pattern_quote.pattern_reads_quote`, or ``format`` in
    :data:`~gateway.pattern_quote.QUOTE_READING_FORMATS` beside no ``pattern``, is appended to ``quoted`` (refused
    after the other bounds: O(characters) per pattern, bounded by ``max_pattern_chars``). S29-final29-1: a ``$ref``'s
    target the walk saw as data (in ``enum``, ``const``, ``default``, ``examples``) or as a name map (``#/$defs``)
    is walked as a schema too, each target once (compilers resolve any pointer; schema_refs.unwalked_targets).
    ``max_pattern_states`` (session 30): each pattern's count times the copies outlines-core writes of it
    (``copies`` for the roots, times each array's :func:`~gateway.schema_patterns.item_copies` above it)."""
    properties = enums = pattern_chars = states = 0
    quotes = bound["quote_reading_patterns"] == "refuse"
    # (value, path node, depth, kind, the roots it may be in, the copies outlines-core writes of it: array items)
    stack: list[tuple[Any, _Node, int, int, tuple, int]] = []
    for root, path in roots:
        stack.append((root, _node(path), 0, _SCHEMA, (root,), copies))
    walked: set[int] = set()  # S29-final29-1: ids of what was walked as schemas; refs: {(text, id(root)): ...}
    refs: dict[tuple[str, int], tuple[_Node, int, tuple, Any, int]] = {}
    while stack or refs:
        if not stack:  # a $ref into data (default, const) or a name map: its target is a schema too
            stack.extend((node, (refs[key][0], "$ref"), refs[key][1], _SCHEMA, refs[key][2], refs[key][4])
                         for node, key in unwalked_targets(((v[3], k) for k, v in refs.items()), walked))
            refs = {}
            continue
        cur, where, depth, kind, top, times = stack.pop()
        if kind == _SCHEMA:
            walked.add(id(cur))
            if type(cur) is dict and type(ref := cur.get("$ref")) is str:
                for root in top:  # a structural tag's schema is a root of its own (xgrammar): each may hold it
                    refs.setdefault((ref, id(root)), (where, depth, top, root, times))
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
                return _refused(_param(where), f"{subject} nests more than {bound['max_depth']} schema levels",
                                "max_depth", what)
        for key, value in cur.items():
            if (key == "anyOf" or key == "oneOf") and kind == _SCHEMA and type(value) is list and bound[
                    "max_pattern_states"] is not None and (states := states + alternatives_cost(
                    value, bound["tenant"], bound["max_pattern_states"]) * times) > bound["max_pattern_states"]:
                return _refused(_param((where, key)), f"{subject} has patterns whose automata need more than "
                                f"{bound['max_pattern_states']} states together", "max_pattern_states", what)
            if kind == _MAP:
                assert where is not None
                if where[1] == "properties":
                    properties += 1
                    if properties > bound["max_properties"]:
                        return _refused(_param(where), f"{subject} has more than "
                                        f"{bound['max_properties']} properties", "max_properties", what)
                elif where[1] == "patternProperties":
                    pattern_chars += len(key)
                    if pattern_chars > bound["max_pattern_chars"]:
                        return _refused(_param((where, key)), f"{subject} has patterns of more than "
                                        f"{bound['max_pattern_chars']} characters together", "max_pattern_chars", what)
                next_kind = _SCHEMA
            elif kind == _VALUE:
                next_kind = _VALUE
            elif key in _DATA:
                if key == "enum" and type(value) is list:
                    enums += len(value)
                    if enums > bound["max_enum_values"]:
                        return _refused(_param((where, key)), f"{subject} has more than "
                                        f"{bound['max_enum_values']} enum values", "max_enum_values", what)
                next_kind = _VALUE
            elif key == "pattern" and type(value) is str:
                pattern_chars += len(value)
                if pattern_chars > bound["max_pattern_chars"]:
                    return _refused(_param((where, key)), f"{subject} has patterns of more than "
                                    f"{bound['max_pattern_chars']} characters together", "max_pattern_chars", what)
                if (reads := quotes and pattern_reads_quote(value)) and not quoted:
                    quoted.append((where, key))
                if bound["max_pattern_states"] is not None and not reads and (states := states + times * pattern_cost(
                        bound["tenant"], value, bound["max_pattern_states"])) > bound["max_pattern_states"]:
                    return _refused(_param((where, key)), f"{subject} has patterns whose automata need more than "
                                    f"{bound['max_pattern_states']} states together", "max_pattern_states", what)
                continue
            elif key == "format" and quotes and type(value) is str and value in QUOTE_READING_FORMATS and (
                    type(cur.get("pattern")) is not str):
                if not quoted:  # outlines-core builds it from a regular expression that reads the quote
                    quoted.append((where, key))
                continue
            elif key in _COUNTS and (type(value) is int or type(value) is float):
                if bound["max_item_count"] is not None and value > bound["max_item_count"]:
                    return _refused(_param((where, key)), f"{subject} asks for {key} over "
                                    f"{bound['max_item_count']}", "max_item_count", what)
                continue
            else:
                next_kind = _MAP if key in _NAME_MAPS and type(value) is dict else _SCHEMA
            if type(value) is dict or type(value) is list:  # a scalar holds nothing more to walk
                stack.append((value, (where, key), depth, next_kind, top + (value,) if key in _SUBROOTS and type(
                    value) is dict else top, times * item_copies(cur) if key in ITEM_KEYS and kind == _SCHEMA else times))
    bound["states"] = states  # the patterns' states, walked (gateway.schema_patterns.refs_states_refusal)
    return None
