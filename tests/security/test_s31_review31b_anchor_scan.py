"""Session 31 (review31b, S31-review31b-1): the scan for ``$id`` / ``$anchor`` / ``$dynamicAnchor`` objects that a
``$ref`` that is no ``#/`` pointer starts (gateway/schema_walk.py ``_targets``, S30-attack30-4) scanned the whole of
each schema the reference resolves in: a tool's own root, every structural-tag subroot above the reference (``schema``
/ ``json_schema`` keys nested up to ``max_depth``), SGLang's ``required`` wrapper of every tool and the tool's own
named-choice wrapper. The schemas nest, so the same containers were scanned once per schema: a 95 KB ``tools`` body
of empty lists in ``default`` under 17 nested ``schema`` keys, with no ``pattern`` (prepared on the event loop),
cost ~280 ms of the loop's CPU instead of ~80 ms with a ``#/`` pointer. Now each container is scanned once per walk
(what a second scan finds was already found by the first). Counts of the scan's object visits, no timing.
"""

from __future__ import annotations

from typing import Any

import pytest

import gateway.schema_walk as schema_walk
from gateway.config_http import JsonSchemaLimits
from gateway.response_format import response_format_refusal, tools_refusal

LIMITS = JsonSchemaLimits()
ALLOW = {"quote_reading_patterns": "allow"}
HOSTILE = "[ab]*a" + "[ab]" * 20  # far over max_pattern_states (16,384)


class _Counting(tuple):  # type: ignore[type-arg]
    """``_NAMING_KEYS`` that counts its iterations: one per object the scan visits."""

    visits = 0

    def __iter__(self) -> Any:
        type(self).visits += 1
        return super().__iter__()


@pytest.fixture
def visits(monkeypatch: pytest.MonkeyPatch) -> type[_Counting]:
    _Counting.visits = 0
    monkeypatch.setattr(schema_walk, "_NAMING_KEYS", _Counting(schema_walk._NAMING_KEYS))
    return _Counting


def _nested(depth: int, data: Any, ref: str = "#s") -> dict[str, Any]:
    """A ``$ref`` under ``depth`` nested ``schema`` keys (each a subroot of its own), ``data`` in ``default``."""
    inner: dict[str, Any] = {"type": "object", "properties": {"a": {"$ref": ref}}, "default": data}
    for _ in range(depth):
        inner = {"type": "object", "properties": {"b": {"type": "string"}}, "schema": inner}
    return inner


DATA = 500  # objects in each ``default``


@pytest.mark.parametrize("depth", [0, 8, 17])
def test_response_format_objects_are_scanned_once(visits: type[_Counting], depth: int) -> None:
    rf = {"type": "json_schema", "json_schema": {"name": "a", "schema": _nested(depth, [{} for _ in range(DATA)])}}
    assert response_format_refusal(rf, LIMITS, ALLOW, 100, "review31b") is None
    objects = DATA + 3 * depth + 4  # the data, each level's 3 objects, the innermost 3 and the root wrapper's
    assert visits.visits <= objects  # before: ~ (depth + 1) x DATA (each subroot's scan)


@pytest.mark.parametrize("named", [False, True])
def test_tools_objects_are_scanned_once(visits: type[_Counting], named: bool) -> None:
    tools = [{"type": "function", "function": {"name": f"t{i}", "parameters": _nested(17, [{} for _ in range(DATA)])}}
             for i in range(4)]
    choice = {"type": "function", "function": {"name": "t0"}} if named else None
    assert tools_refusal(tools, LIMITS, ALLOW, 100, choice, "review31b") is None
    objects = 4 * (DATA + 3 * 17 + 3) + 4 * 5 + 10  # the tools' objects, their wrappers' (each ~5), SGLang's
    assert visits.visits <= objects  # before: ~ 20 x 4 x DATA (each subroot, SGLang's wrapper, the tool's own)


def test_a_named_object_under_nested_subroots_is_still_walked() -> None:
    """The scan visits less, not what it finds: a hidden anchored schema deep in data under subroots is refused."""
    hidden = {"x": {"$anchor": "s", "type": "string", "pattern": HOSTILE}}
    rf = {"type": "json_schema", "json_schema": {"name": "a", "schema": _nested(8, [{}, hidden])}}
    err = response_format_refusal(rf, LIMITS, {}, 100, "review31b")
    assert err is not None and err.record == {"reason": "response_format over limits.json_schema.max_pattern_states"}
    tools = [{"type": "function", "function": {"name": "f", "parameters": _nested(8, [{}, hidden])}}]
    err = tools_refusal(tools, LIMITS, {}, 100, {"type": "function", "function": {"name": "f"}}, "review31b")
    assert err is not None and err.record == {"reason": "tools parameters over limits.json_schema.max_pattern_states"}
