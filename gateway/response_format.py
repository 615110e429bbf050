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

__all__ = ["JSON_SCHEMA_BOUNDS", "response_format_refusal"]

#: the names of the bounds (``limits.json_schema`` keys, ``tenants[].json_schema_limits`` keys)
JSON_SCHEMA_BOUNDS = ("max_bytes", "max_depth", "max_properties", "max_enum_values", "max_pattern_chars")

#: keywords whose object maps names to subschemas: the map itself is no schema level
_NAME_MAPS = frozenset({"properties", "$defs", "definitions", "patternProperties", "dependentSchemas"})
#: keywords whose value is data (an instance), never a schema: its keys are not keywords
_DATA = frozenset({"enum", "const", "default", "examples"})
_SCHEMA, _MAP, _VALUE = 0, 1, 2  # what a walked value is
_CONTAINERS = frozenset({dict, list})
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
    bound = {k: overrides.get(k, getattr(limits, k)) for k in JSON_SCHEMA_BOUNDS}
    if body_bytes > bound["max_bytes"] and _encoded_bytes(response_format) > bound["max_bytes"]:
        return _refused("response_format", f"response_format is larger than {bound['max_bytes']} bytes as compact "
                        "JSON", "max_bytes")
    root: Any = response_format
    path: tuple[str, ...] = ("response_format",)
    spec = response_format.get("json_schema")
    if response_format.get("type") == "json_schema" and type(spec) is dict and "schema" in spec:
        root, path = spec["schema"], ("response_format", "json_schema", "schema")
    return _walk(root, path, bound)


def _walk(root: Any, path: tuple[str, ...], bound: dict[str, int]) -> GatewayError | None:
    """Walk ``root`` (a schema at ``path``) and refuse the first bound it passes (see the module docstring).

    Only objects and lists are pushed on the walk's stack (session 25: a scalar popped did nothing, and each push
    built its path tuple: an ``enum`` of 1,000 strings cost 1,000 of them); the order containers are taken in, and
    so the first bound found, is the same."""
    max_depth, max_properties = bound["max_depth"], bound["max_properties"]
    max_enum_values, max_pattern_chars = bound["max_enum_values"], bound["max_pattern_chars"]
    properties = enums = pattern_chars = 0
    stack: list[tuple[Any, tuple[str, ...], int, int]] = [(root, path, 0, _SCHEMA)]
    push, pop = stack.append, stack.pop
    while stack:
        cur, where, depth, kind = pop()
        if type(cur) is list:
            if _CONTAINERS.isdisjoint(map(type, cur)):  # strings, numbers (an enum's values): one pass in C
                continue
            for i, v in enumerate(cur):
                if type(v) is dict or type(v) is list:
                    push((v, where + (str(i),), depth, kind))
            continue
        if type(cur) is not dict:
            continue
        if kind != _MAP:
            depth += 1
            if depth > max_depth:
                return _refused(_param(where), f"response_format nests more than {max_depth} schema levels",
                                "max_depth")
        for key, value in cur.items():
            container = type(value) is dict or type(value) is list
            if kind == _MAP:
                if where[-1] == "properties":
                    properties += 1
                    if properties > max_properties:
                        return _refused(_param(where), "response_format has more than "
                                        f"{max_properties} properties", "max_properties")
                elif where[-1] == "patternProperties":
                    pattern_chars += len(key)
                    if pattern_chars > max_pattern_chars:
                        return _refused(_param(where + (key,)), "response_format's patterns have more than "
                                        f"{max_pattern_chars} characters together", "max_pattern_chars")
                if container:
                    push((value, where + (key,), depth, _SCHEMA))
            elif kind == _VALUE:
                if container:
                    push((value, where + (key,), depth, _VALUE))
            elif key in _DATA:
                if key == "enum" and type(value) is list:
                    enums += len(value)
                    if enums > max_enum_values:
                        return _refused(_param(where + (key,)), "response_format has more than "
                                        f"{max_enum_values} enum values", "max_enum_values")
                if container:
                    push((value, where + (key,), depth, _VALUE))
            elif key == "pattern" and type(value) is str:
                pattern_chars += len(value)
                if pattern_chars > max_pattern_chars:
                    return _refused(_param(where + (key,)), "response_format's patterns have more than "
                                    f"{max_pattern_chars} characters together", "max_pattern_chars")
            elif container:
                push((value, where + (key,), depth, _MAP if key in _NAME_MAPS and type(value) is dict else _SCHEMA))
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


def _refused(param: str, message: str, name: str) -> GatewayError:
    """The 400 ``json_schema_too_complex`` naming the bound ``name`` (``limits.json_schema.<name>``) in its message and
    its audit ``reason`` (no client text there)."""
    return GatewayError(400, "json_schema_too_complex", f"{message} (limits.json_schema.{name}, for this tenant); the "
                        "replica compiles it into a grammar before the first token", param=param,
                        record={"reason": f"response_format over limits.json_schema.{name}"}, client_text=True)
