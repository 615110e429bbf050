"""Session 31 (tools31, S30-attack30-4): the bounds walk resolved ``$ref`` as JSON pointers only. A reference to a
``$anchor`` / ``$id`` / ``$dynamicAnchor`` name (``#name``, ``urn:...``) reached nothing, so a schema hidden in data
(``default``, ``examples``) under such a name was never walked: outlines-core 0.2.14 refuses the reference ("Invalid
reference path") and xgrammar 0.2.9 compiles any JSON value there, but llguidance follows JSON Schema's URI resolution
and may compile the hidden schema. Now a reference that is no ``#/`` pointer makes the walk also walk, as schemas,
every object of the same root that carries a string ``$id``, ``$anchor`` or ``$dynamicAnchor`` (one scan per root),
so their bounds hold (over-count only).
"""

from __future__ import annotations

from typing import Any

import pytest

from gateway.config_http import JsonSchemaLimits
from gateway.response_format import response_format_refusal, tools_refusal

LIMITS = JsonSchemaLimits()
HOSTILE = "[ab]*a" + "[ab]" * 20  # far over max_pattern_states (16,384)


def _rf(schema: Any) -> dict[str, Any]:
    return {"type": "json_schema", "json_schema": {"name": "answer", "schema": schema}}


def _hidden(ref: str, **name: str) -> dict[str, Any]:
    """A property referring to ``ref``; the target hides in the root's ``default`` (data to the walk)."""
    return {"type": "object", "properties": {"a": {"$ref": ref}},
            "default": {"x": {**name, "type": "string", "pattern": HOSTILE}}}


FORMS = {
    "$anchor": _hidden("#hidden", **{"$anchor": "hidden"}),
    "$dynamicAnchor": _hidden("#hidden", **{"$dynamicAnchor": "hidden"}),
    "$id": _hidden("urn:example:hidden", **{"$id": "urn:example:hidden"}),
    "$id relative": _hidden("hidden.json", **{"$id": "hidden.json"}),
    "$id with a pointer": {"type": "object", "properties": {"a": {"$ref": "item.json#/properties/s"}},
                           "examples": [{"$id": "item.json", "properties": {"s": {"type": "string",
                                                                                  "pattern": HOSTILE}}}]},
}


@pytest.mark.parametrize("form", list(FORMS))
def test_a_schema_hidden_under_a_name_is_walked(form: str) -> None:
    err = response_format_refusal(_rf(FORMS[form]), LIMITS, {}, 100, "tools31")  # before: None
    assert err is not None and err.record == {"reason": "response_format over limits.json_schema.max_pattern_states"}
    err = tools_refusal([{"type": "function", "function": {"name": "f", "parameters": FORMS[form]}}], LIMITS, {}, 100,
                        None, "tools31")
    assert err is not None and err.record == {
        "reason": "tools parameters over limits.json_schema.max_pattern_states"}


def test_other_bounds_hold_there_too() -> None:
    hidden = {"$anchor": "p", "type": "object", "properties": {k: {"type": "integer"} for k in "bcd"}}
    schema = {"type": "object", "properties": {"a": {"$ref": "#p"}}, "default": {"x": hidden}}
    err = response_format_refusal(_rf(schema), LIMITS, {"max_properties": 3}, 100, "tools31")  # before: None
    assert err is not None and err.record == {"reason": "response_format over limits.json_schema.max_properties"}
    assert response_format_refusal(_rf(schema), LIMITS, {"max_properties": 4}, 100, "tools31") is None


def test_without_such_a_reference_data_stays_data() -> None:
    """A pointer, or no reference: the anchored object in data is not walked (one scan only for a name reference)."""
    data = {"x": {"$anchor": "hidden", "type": "string", "pattern": HOSTILE}}
    for schema in ({"type": "object", "properties": {"a": {"type": "string"}}, "default": data},
                   {"type": "object", "$defs": {"s": {"type": "string"}}, "properties": {"a": {"$ref": "#/$defs/s"}},
                    "default": data}):
        assert response_format_refusal(_rf(schema), LIMITS, {"quote_reading_patterns": "allow"}, 100,
                                       "tools31") is None


def test_ordinary_anchored_schemas_are_admitted() -> None:
    schema = {"$id": "urn:example:order", "type": "object", "$defs": {
        "money": {"$anchor": "money", "type": "string", "pattern": "^[0-9]{1,9}\\.[0-9]{2}$"},
        "sku": {"$id": "urn:example:sku", "type": "string", "pattern": "^[A-Z]{3}-[0-9]{4}$"}},
        "properties": {"total": {"$ref": "#money"}, "sku": {"$ref": "urn:example:sku"},
                       "tax": {"$ref": "#/$defs/money"}}, "required": ["total", "sku"]}
    assert response_format_refusal(_rf(schema), LIMITS, {}, 100, "tools31") is None
    assert tools_refusal([{"type": "function", "function": {"name": "f", "parameters": schema}}], LIMITS, {}, 100,
                         {"type": "function", "function": {"name": "f"}}, "tools31") is None
