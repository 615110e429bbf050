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
  bound of 129: memory and ``accept_token`` time per item grow with the bound; bench/s29_xgrammar29_mask_fill.py),
  and since session 30 (S30-attack30-7) every counted repetition in a ``grammar`` string or a ``{"type": "regex"}``
  content's ``pattern``, and a ``{"type": "repeat"}`` content's ``min`` / ``max`` (vLLM's ``structural_tag``
  ``format``: the same rule repetition in xgrammar);
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
The walk itself, its refusal and ``param``: gateway/schema_walk.py (split out in session 30, attack30); since then a
tool's ``$ref`` is also resolved inside vLLM's ``required`` schema of all tools (S30-attack30-2) and a ``#/`` pointer
also as xgrammar decodes it (S30-attack30-1, gateway/schema_refs.py).
The schema's values are also counted in ``max_free_values`` (gateway/free_form.py) and its rendering in the
first sequence's prompt bytes (gateway/request.py ``extra_text``), as before.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gateway.errors import GatewayError
from gateway.schema_expansion import regex_chars, required_schema
from gateway.schema_patterns import refs_states_refusal
from gateway.schema_refs import TOO_DEEP as _TOO_DEEP
from gateway.schema_refs import encoded_bytes as _encoded_bytes
from gateway.schema_refs import inlined_bytes
from gateway.schema_refusal import MAX_PARAM_CHARS
from gateway.schema_refusal import Node as _Node
from gateway.schema_refusal import path_node as _node
from gateway.schema_refusal import path_param as _param
from gateway.schema_refusal import refused as _refused
from gateway.schema_walk import walk_bounds as _walk
from gateway.tool_schemas import sglang_schemas, wrapper_nodes

__all__ = ["JSON_SCHEMA_BOUNDS", "MAX_PARAM_CHARS", "response_format_refusal", "tools_refusal"]

#: the names of the bounds (``limits.json_schema`` keys, ``tenants[].json_schema_limits`` keys)
JSON_SCHEMA_BOUNDS = ("max_bytes", "max_depth", "max_properties", "max_enum_values", "max_pattern_chars",
                      "max_tool_schemas_bytes", "max_regex_chars", "quote_reading_patterns",
                      "max_item_count", "max_pattern_states")
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
    A named ``tool_choice`` (session 31, tools31, S31-review31-4: ``{"function": {"name": NAME}}``): each tool of that
    name (:func:`_named_tools`) counts its patterns' states twice and the regular expression of SGLang's array of it
    (``{"type": "array", "minItems": 1, "items": ...}``, which outlines-core writes with the item twice), the other
    tools as under ``auto``; with its references inlined, that array counts twice (only there does ``#/items/...``
    resolve, and a pointer into the ``parameters``' own root does not: outlines-core refuses it; the array's own copies
    on top: an over-count). ``tenant``: as :func:`response_format_refusal`. Raises nothing."""
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
    twice = tool_choice == "required"
    named = set() if twice else _named_tools(tools, tool_choice)
    copies = [2 if twice or int(path[1]) in named else 1 for _, path in roots]
    arrays = [(w, ("tools", str(i), "function", "parameters")) for i, w in enumerate(sglang_schemas(tools)[1])
              if i in named and w is not None] if named else []
    subject = "tools[].function.parameters"  # counted together: ``required`` compiles an anyOf over every tool
    quoted: list[_Node] = []
    # S30-attack30-2: a reference may also resolve in the schemas vLLM and SGLang build of the tools (another tool's
    # ``$defs`` or ``parameters``, its own data through SGLang's named-choice array), built only once the walk meets one;
    # vLLM's ``required`` schema writes every tool twice (an array of them): each pattern's states twice (pattern30)
    # and SGLang's named-choice schema writes the named tool twice (S31-review31-4)
    if (refused := _walk(roots[::-1], bound, "tools parameters", subject, quoted, shared=lambda: _shared(tools),
                         copies=copies[::-1])) is not None:
        return refused
    return _tools_inlined_refusal(roots, bound, body_bytes, subject) or _tools_regex_refusal(
        tools, roots, bound["max_regex_chars"], subject, together=twice, arrays=arrays) or refs_states_refusal(
        roots, bound, "tools parameters", subject, 2 if twice else 1) or refs_states_refusal(
        arrays, bound, "tools parameters", subject, 2) or _quote_refusal(
        quoted, "tools parameters", subject)


def _named_tools(tools: list[Any], tool_choice: Any) -> set[int]:
    """The indices in ``tools`` of the entries a named ``tool_choice`` (``{"type": "function", "function": {"name":
    NAME}}``) names: every function whose ``name`` is NAME (SGLang compiles the first as an array of it, vLLM's named
    choice the last, alone; both counted: fail closed). Empty for another choice, one without a string name, or a NAME
    no tool has (SGLang then compiles no schema). Session 31 (tools31, S31-review31-4). Raises nothing."""
    fn = tool_choice.get("function") if type(tool_choice) is dict else None
    name = fn.get("name") if type(fn) is dict else None
    if type(name) is not str:
        return set()
    return {i for i, tool in enumerate(tools) if type(tool) is dict and type(f := tool.get("function")) is dict
            and f.get("name") == name}


def _shared(tools: list[Any]) -> tuple[list[Any], dict[int, Any], set[int]]:
    """The schemas a replica builds of ``tools`` (gateway/tool_schemas.py), as ``walk_bounds``'s ``shared``: SGLang's
    ``required`` schema (vLLM's shape with each tool's ``parameters`` whole: every node a pointer reaches in vLLM's
    reaches the same client object there, so vLLM's is not resolved in too), SGLang's named-choice schema per tool by
    the id of its ``parameters`` (the walk's root), and the ids of the containers they built (nothing to walk)."""
    sglang, named = sglang_schemas(tools)
    per_root = {id(w["items"]["properties"]["parameters"]): w for w in named if w is not None}
    own = wrapper_nodes(sglang)
    for w in per_root.values():
        own |= wrapper_nodes(w)
    return [sglang], per_root, own


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
                         subject: str, together: bool = True,
                         arrays: list[tuple[Any, tuple[str, ...]]] | None = None) -> GatewayError | None:
    """``max_regex_chars`` over each tool's ``parameters`` whatever ``tool_choice`` says (a named ``tool_choice``
    compiles it alone, a strict tool under ``auto`` too: fail closed), then, when ``together``, over vLLM's
    ``tool_choice: "required"`` schema of all of them (:func:`gateway.schema_expansion.required_schema`: an array
    whose ``items`` are an ``anyOf`` of every tool, written twice, their ``$defs`` merged); only ``required`` builds
    that schema, so an agent's many tools under ``auto`` are not counted together (session 27: 26 ordinary tools
    make ~1.2 M characters). ``arrays``: ``(schema, path)`` of SGLang's array of each tool a named ``tool_choice``
    names (:func:`gateway.tool_schemas.sglang_schemas`; session 31, S31-review31-4: ~2x its ``parameters``), each
    counted too. ``cap`` None: off."""
    if cap is None:
        return None
    for root, path in roots:
        if regex_chars(root, cap) > cap:
            return _refused(_param(_node(path)), f"{subject} builds a regular expression of more than {cap} "
                            "characters in a compiler that inlines it (outlines-core)", "max_regex_chars",
                            "tools parameters")
    for schema, path in arrays or ():
        if regex_chars(schema, cap) > cap:
            return _refused(_param(_node(path)), f"{subject} builds a regular expression of more than {cap} characters "
                            "as the array SGLang compiles for a named tool_choice, in a compiler that inlines it "
                            "(outlines-core)", "max_regex_chars", "tools parameters")
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
