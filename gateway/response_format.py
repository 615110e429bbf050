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

* ``max_bytes``: compact JSON UTF-8 bytes of the whole ``response_format``;
* ``max_depth``: schema levels: nested JSON objects below ``json_schema.schema`` (the schema itself is level 1; the
  name maps ``properties``, ``$defs``, ``definitions``, ``patternProperties``, ``dependentSchemas`` add none, so
  ``{"properties": {"a": {...}}}`` nests ``a`` one level below; objects inside ``enum``/``const`` count too).
  Another ``response_format`` type is walked whole from ``response_format`` itself (level 1);
* ``max_properties``: entries of every ``properties`` map together;
* ``max_enum_values``: entries of every ``enum`` list together;
* ``max_pattern_chars``: characters of every ``pattern`` string and ``patternProperties`` key together.

Session 25 (mend, S24-fields-1): each ``tools[].function.parameters`` schema takes the same walk and bounds
(:func:`tools_refusal`, ``param`` ``tools.N.function.parameters...``), and ``max_tool_schemas_bytes`` bounds the
compact JSON bytes of all of them together (default 256 KiB: four ``max_bytes``). A body without ``tools`` costs
one key test.

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
The schema's values are also counted in ``max_free_values`` (gateway/free_form.py) and its rendering in the
first sequence's prompt bytes (gateway/request.py ``extra_text``), as before.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import orjson

from gateway.errors import GatewayError
from gateway.unknown_fields import field_label

__all__ = ["JSON_SCHEMA_BOUNDS", "response_format_refusal", "tools_refusal"]

#: the names of the bounds (``limits.json_schema`` keys, ``tenants[].json_schema_limits`` keys)
JSON_SCHEMA_BOUNDS = ("max_bytes", "max_depth", "max_properties", "max_enum_values", "max_pattern_chars",
                      "max_tool_schemas_bytes")

#: keywords whose object maps names to subschemas: the map itself is no schema level
_NAME_MAPS = frozenset({"properties", "$defs", "definitions", "patternProperties", "dependentSchemas"})
#: keywords whose value is data (an instance), never a schema: its keys are not keywords
_DATA = frozenset({"enum", "const", "default", "examples"})
_SCHEMA, _MAP, _VALUE = 0, 1, 2  # what a walked value is
#: the longest ``param`` of a refusal (characters)
MAX_PARAM_CHARS = 1024


def response_format_refusal(response_format: Any, limits: Any, overrides: Mapping[str, int],
                            body_bytes: int) -> GatewayError | None:
    """The 400 for a decoded chat body's ``response_format`` over a bound (see the module docstring), else None.

    ``limits``: an object with the :data:`JSON_SCHEMA_BOUNDS` attributes (ints; ``limits.json_schema``);
    ``overrides``: the tenant's own values by name (``Tenant.json_schema_limits``), which take precedence;
    ``body_bytes``: the length of the body ``response_format`` was decoded from (a body no longer than
    ``max_bytes`` needs no byte count). Types are not checked here (the schema does); a value that is not an
    object is left to it. Work: one C encoding of ``response_format`` when the body is longer than ``max_bytes``,
    then a walk that stops at the first bound passed. Raises nothing."""
    if type(response_format) is not dict:
        return None
    bound = _bounds(limits, overrides)
    if body_bytes > bound["max_bytes"] and _encoded_bytes(response_format) > bound["max_bytes"]:
        return _refused("response_format", f"response_format is larger than {bound['max_bytes']} bytes as compact "
                        "JSON", "max_bytes")
    root: Any = response_format
    path: tuple[str, ...] = ("response_format",)
    spec = response_format.get("json_schema")
    if response_format.get("type") == "json_schema" and type(spec) is dict and "schema" in spec:
        root, path = spec["schema"], ("response_format", "json_schema", "schema")
    return _walk(root, path, bound)


def tools_refusal(tools: Any, limits: Any, overrides: Mapping[str, int], body_bytes: int) -> GatewayError | None:
    """The 400 for a decoded chat body's ``tools`` whose ``function.parameters`` schemas pass a bound (session 25,
    S24-fields-1), else None. The replica compiles a tool's parameters into a grammar as it does a
    ``response_format`` schema (vLLM and SGLang for ``tool_choice`` ``required`` or a named function, and for
    strict tools), so each tool's ``parameters`` is walked as a ``response_format`` schema is (every bound of
    ``limits.json_schema``, the schema itself level 1; ``param`` ``tools.N.function.parameters...``), and the
    compact JSON bytes of all of them together are bounded by ``max_tool_schemas_bytes``.

    ``limits``, ``overrides``: as :func:`response_format_refusal`; ``body_bytes``: the length of the body ``tools``
    was decoded from (a body no longer than the byte bounds needs no encoding). A ``tools`` that is not a list, an
    entry or ``function`` that is not an object, ``parameters`` that is not an object: left to the schema. Work:
    nothing for a body without ``tools`` (the caller's key test); else one walk per tool, and one C encoding per
    tool only when the body is longer than a byte bound. Raises nothing."""
    if type(tools) is not list:
        return None
    bound = _bounds(limits, overrides)
    count_bytes = body_bytes > min(bound["max_bytes"], bound["max_tool_schemas_bytes"])
    total = 0
    for i, tool in enumerate(tools):
        fn = tool.get("function") if type(tool) is dict else None
        params = fn.get("parameters") if type(fn) is dict else None
        if type(params) is not dict:
            continue
        path, subject = ("tools", str(i), "function", "parameters"), f"tools[{i}].function.parameters"
        if count_bytes:
            size = _encoded_bytes(params)
            if size > bound["max_bytes"]:
                return _refused(_param(path), f"{subject} is larger than {bound['max_bytes']} bytes as compact JSON",
                                "max_bytes", "tools parameters")
            total += size
            if total > bound["max_tool_schemas_bytes"]:
                return _refused(_param(path), "the tools' parameters schemas are larger than "
                                f"{bound['max_tool_schemas_bytes']} bytes together as compact JSON",
                                "max_tool_schemas_bytes", "tools parameters")
        if (refused := _walk(params, path, bound, subject, "tools parameters")) is not None:
            return refused
    return None


def _bounds(limits: Any, overrides: Mapping[str, int]) -> dict[str, int]:
    """Every bound of :data:`JSON_SCHEMA_BOUNDS`: the tenant's ``overrides`` first, else ``limits``' attribute."""
    return {k: overrides.get(k, getattr(limits, k)) for k in JSON_SCHEMA_BOUNDS}


def _walk(root: Any, path: tuple[str, ...], bound: dict[str, int], subject: str = "response_format",
          audit: str = "response_format") -> GatewayError | None:
    """Walk ``root`` (a schema at ``path``) and refuse the first bound it passes (see the module docstring);
    ``subject`` names the schema in the client's message, ``audit`` in the audit ``reason`` (no client text)."""
    properties = enums = pattern_chars = 0
    stack: list[tuple[Any, tuple[str, ...], int, int]] = [(root, path, 0, _SCHEMA)]
    while stack:
        cur, where, depth, kind = stack.pop()
        if type(cur) is list:
            stack.extend((v, where + (str(i),), depth, kind) for i, v in enumerate(cur))
            continue
        if type(cur) is not dict:
            continue
        if kind != _MAP:
            depth += 1
            if depth > bound["max_depth"]:
                return _refused(_param(where), f"{subject} nests more than {bound['max_depth']} schema levels",
                                "max_depth", audit)
        for key, value in cur.items():
            at = where + (key,)
            if kind == _MAP:
                if where[-1] == "properties":
                    properties += 1
                    if properties > bound["max_properties"]:
                        return _refused(_param(where), f"{subject} has more than "
                                        f"{bound['max_properties']} properties", "max_properties", audit)
                elif where[-1] == "patternProperties":
                    pattern_chars += len(key)
                    if pattern_chars > bound["max_pattern_chars"]:
                        return _refused(_param(at), f"{subject}'s patterns have more than "
                                        f"{bound['max_pattern_chars']} characters together", "max_pattern_chars", audit)
                stack.append((value, at, depth, _SCHEMA))
            elif kind == _VALUE:
                stack.append((value, at, depth, _VALUE))
            elif key in _DATA:
                if key == "enum" and type(value) is list:
                    enums += len(value)
                    if enums > bound["max_enum_values"]:
                        return _refused(_param(at), f"{subject} has more than "
                                        f"{bound['max_enum_values']} enum values", "max_enum_values", audit)
                stack.append((value, at, depth, _VALUE))
            elif key == "pattern" and type(value) is str:
                pattern_chars += len(value)
                if pattern_chars > bound["max_pattern_chars"]:
                    return _refused(_param(at), f"{subject}'s patterns have more than "
                                    f"{bound['max_pattern_chars']} characters together", "max_pattern_chars", audit)
            else:
                stack.append((value, at, depth, _MAP if key in _NAME_MAPS and type(value) is dict else _SCHEMA))
    return None


def _encoded_bytes(value: dict[str, Any]) -> int:
    """Compact JSON UTF-8 bytes of ``value`` (orjson; an integer beyond 64 bits or a lone surrogate, which orjson
    does not encode, falls back to :func:`json.dumps`)."""
    try:
        return len(orjson.dumps(value))
    except (TypeError, orjson.JSONEncodeError):
        import json

        return len(json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode("utf-8", "surrogatepass"))


def _param(path: tuple[str, ...]) -> str:
    """``path`` as the error's ``param``: dotted, each client key as :func:`field_label` shows it (the fixed
    names and list indexes are plain ASCII already); cut to :data:`MAX_PARAM_CHARS` (``...`` marks a cut)."""
    param = ".".join(p if p.isascii() and (p.isidentifier() or p.isdigit()) else field_label(p) for p in path)
    return param if len(param) <= MAX_PARAM_CHARS else param[:MAX_PARAM_CHARS - 3] + "..."


def _refused(param: str, message: str, name: str, audit: str = "response_format") -> GatewayError:
    """The 400 ``json_schema_too_complex`` naming the bound ``name`` (``limits.json_schema.<name>``) in its message and
    its audit ``reason`` (``audit``: what was bounded, a fixed name; no client text there)."""
    return GatewayError(400, "json_schema_too_complex", f"{message} (limits.json_schema.{name}, for this tenant); the "
                        "replica compiles it into a grammar before the first token", param=param,
                        record={"reason": f"{audit} over limits.json_schema.{name}"}, client_text=True)
