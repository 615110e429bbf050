"""Session 25 (helper cut, issue 14): two session 24 checks in a cheaper form, differential against their session 24
form (the git object of c7e7fbd, session 25's start) on generated inputs, refusals and their params included.

* ``tool_call_id`` of a ``tool`` message (S23-newcomer-9): one pass per chat body (:meth:`ChatBody._tool_call_ids`)
  instead of a validator called for every message of every body (``validate_default``).
* the ``response_format`` schema walk (S23-fields-2): only objects and lists are pushed, each with its path; a
  scalar is no longer pushed (nor given a path tuple) to be popped and skipped.
"""
from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from gateway import response_format as new_rf
from gateway.request_schema import ChatBody, schema_error

ROOT = Path(__file__).resolve().parents[2]
START = "c7e7fbd"  # session 25's start: the session 24 forms


def _old_module(tmp: Path, path: str, name: str) -> ModuleType:
    """``path`` of :data:`START`, imported under ``name``."""
    text = subprocess.run(["git", "-C", str(ROOT), "show", f"{START}:{path}"], capture_output=True, text=True,
                          check=True).stdout
    file = tmp / f"{name}.py"
    file.write_text(text)
    spec = importlib.util.spec_from_file_location(name, file)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def old_schema(tmp_path_factory: pytest.TempPathFactory) -> ModuleType:
    return _old_module(tmp_path_factory.mktemp("old"), "gateway/request_schema.py", "s24_request_schema")


@pytest.fixture(scope="module")
def old_rf(tmp_path_factory: pytest.TempPathFactory) -> ModuleType:
    return _old_module(tmp_path_factory.mktemp("old"), "gateway/response_format.py", "s24_response_format")


# ------------------------------------------------------------------ tool_call_id

def _verdict(model: Any, body: Any) -> Any:
    try:
        parsed = model.model_validate(body)
    except ValidationError as exc:
        return ("refused", schema_error(exc), exc.title, len(exc.errors()))
    return ("ok", parsed.model_dump(exclude_none=True, exclude_unset=False))


_ROLES = st.sampled_from(["tool", "tool", "user", "assistant", "system", "developer", "robot", 3, None])
_IDS = st.one_of(st.just("<absent>"), st.none(), st.just("call_1"), st.just(""), st.just("x" * 257), st.integers(0, 3))
_CONTENT = st.one_of(st.just("<absent>"), st.none(), st.just("hi"), st.just([{"type": "text", "text": "a"}]),
                     st.just([{"type": "image_url"}]), st.just(5))
_NAMES = st.one_of(st.just("<absent>"), st.none(), st.just("fn_1"), st.just("bad name"), st.just(7))
_CALLS = st.one_of(st.just("<absent>"), st.none(), st.just([{"id": "c", "type": "function",
                                                             "function": {"name": "f", "arguments": "{}"}}]),
                   st.just([1]), st.just("x"), st.just([]))


@st.composite
def _message(draw: st.DrawFn) -> Any:
    if draw(st.integers(0, 15)) == 0:
        return draw(st.sampled_from(["hi", 3, None, []]))
    m: dict[str, Any] = {}
    for key, strategy in (("role", _ROLES), ("tool_call_id", _IDS), ("content", _CONTENT), ("name", _NAMES),
                          ("tool_calls", _CALLS)):
        value = draw(strategy)
        if value != "<absent>" and not (key == "role" and draw(st.integers(0, 20)) == 0):
            m[key] = value
    return m


@st.composite
def _chat_body(draw: st.DrawFn) -> Any:
    body: dict[str, Any] = {"model": draw(st.sampled_from(["m", "m", "m", "", 5])),
                            "messages": draw(st.one_of(st.lists(_message(), max_size=5), st.just("x")))}
    if draw(st.booleans()):
        body["tools"] = draw(st.sampled_from([[{"type": "function", "function": {"name": "f"}}], [1], "x"]))
    if draw(st.booleans()):
        body["max_tokens"] = draw(st.sampled_from([1, 0, "2", None]))
    if draw(st.integers(0, 5)) == 0:
        body["stream"] = draw(st.sampled_from([None, True, 1]))
    return json.loads(json.dumps(body))  # as decoded from a request


@settings(max_examples=600, deadline=None)
@given(body=_chat_body())
def test_tool_call_id_rule_same_verdict_as_session_24(old_schema: ModuleType, body: Any) -> None:
    assert _verdict(ChatBody, body) == _verdict(old_schema.ChatBody, body)


@pytest.mark.parametrize("messages, param", [
    ([{"role": "tool", "content": "x"}], "messages.0.tool_call_id"),
    ([{"role": "tool", "content": "x", "tool_call_id": None}], "messages.0.tool_call_id"),
    ([{"role": "user", "content": "x"}, {"role": "tool", "content": None}], "messages.1.tool_call_id"),
    # two errors in one tool message: the per-message form reports tool_call_id, not tool_calls after it
    ([{"role": "tool", "content": "x", "tool_calls": 5}], "messages.0.tool_call_id"),
    # an earlier tool message without its id is the list's first bad item
    ([{"role": "tool", "content": "x"}, {"role": "robot", "content": "x"}], "messages.0.tool_call_id"),
    ([{"role": "robot", "content": "x"}, {"role": "tool", "content": "x"}], "messages.0.role"),
])
def test_tool_message_without_id_refused_as_before(old_schema: ModuleType, messages: list[Any], param: str) -> None:
    body = {"model": "m", "messages": messages, "tools": "x"}
    got = _verdict(ChatBody, body)
    assert got == _verdict(old_schema.ChatBody, body)
    assert got[0] == "refused" and got[1][1] == param


def test_common_body_validates_no_message_twice(monkeypatch: pytest.MonkeyPatch) -> None:
    """The session 24 form (a second validation) runs only for a body that breaks the rule."""
    import gateway.request_schema as schema

    calls: list[Any] = []
    real = schema._ToolCheckedBody.model_validate
    monkeypatch.setattr(schema._ToolCheckedBody, "model_validate", lambda data: calls.append(data) or real(data))
    ok = {"model": "m", "messages": [{"role": "user", "content": "x"}, {"role": "tool", "content": "4",
                                                                       "tool_call_id": "c"}], "temperature": 0.5}
    ChatBody.model_validate(ok)
    with pytest.raises(ValidationError):
        ChatBody.model_validate({"model": "m", "messages": [{"role": "user", "content": 3}]})
    assert calls == []
    with pytest.raises(ValidationError):
        ChatBody.model_validate({"model": "m", "messages": [{"role": "tool", "content": "4"}]})
    assert len(calls) == 1


# ------------------------------------------------------------------ response_format walk

_KEYWORDS = st.sampled_from(["properties", "patternProperties", "$defs", "items", "anyOf", "enum", "const",
                             "pattern", "type", "default", "x-name", "required"])
_LEAF = st.one_of(st.none(), st.booleans(), st.integers(-3, 3), st.text(max_size=6))
_JSON = st.recursive(_LEAF, lambda inner: st.one_of(st.lists(inner, max_size=4),
                                                    st.dictionaries(st.one_of(_KEYWORDS, st.text(max_size=4)), inner,
                                                                    max_size=4)), max_leaves=25)
_LIMITS = st.builds(SimpleNamespace, max_bytes=st.sampled_from([40, 65536]), max_depth=st.integers(1, 5),
                    max_properties=st.integers(0, 4), max_enum_values=st.integers(0, 4),
                    max_pattern_chars=st.integers(0, 8), max_tool_schemas_bytes=st.just(262144),
                    max_regex_chars=st.just(None),  # session 27's bound off: session 24 had none
                    quote_reading_patterns=st.just("allow"),  # session 29's (pattern29) off too
                    max_item_count=st.just(None),  # session 29's bound off too
                    max_pattern_states=st.just(None))  # session 30's (pattern30) too


def _refusal(mod: ModuleType, rf: Any, limits: Any, overrides: dict[str, int], size: int) -> Any:
    err = mod.response_format_refusal(rf, limits, overrides, size)
    # review's S25 wording of the pattern refusal (merged after this test was written): the same refusal
    message = None if err is None else err.message.replace("response_format's patterns have more than",
                                                           "response_format has patterns of more than")
    return None if err is None else (err.status, err.code, message, err.param, err.record)


@settings(max_examples=800, deadline=None)
@given(schema=_JSON, typed=st.booleans(), limits=_LIMITS, overrides=st.dictionaries(
    st.sampled_from(["max_depth", "max_properties", "max_enum_values"]), st.integers(0, 3), max_size=2),
       size=st.sampled_from([10, 100000]))
def test_response_format_walk_same_refusal_as_session_24(old_rf: ModuleType, schema: Any, typed: bool, limits: Any,
                                                          overrides: dict[str, int], size: int) -> None:
    rf = {"type": "json_schema", "json_schema": {"name": "n", "schema": schema}} if typed else schema
    assert _refusal(new_rf, rf, limits, overrides, size) == _refusal(old_rf, rf, limits, overrides, size)


def test_response_format_walk_refuses_deep_in_an_enum_list_as_before(old_rf: ModuleType) -> None:
    """Objects inside enum values still count as levels, at the path the session 24 walk named."""
    limits = SimpleNamespace(max_bytes=65536, max_depth=3, max_properties=10, max_enum_values=10, max_pattern_chars=10,
                             max_tool_schemas_bytes=262144, max_regex_chars=None,  # session 27's bound off
                             quote_reading_patterns="allow",  # session 29's (pattern29) too
                             max_item_count=None, max_pattern_states=None)  # sessions 29, 30 too
    rf = {"type": "json_schema", "json_schema": {"schema": {"enum": ["a", 1, {"k": {"k": {"k": 1}}}]}}}
    got = _refusal(new_rf, rf, limits, {}, 10)
    assert got == _refusal(old_rf, rf, limits, {}, 10)
    assert got is not None and got[3] == "response_format.json_schema.schema.enum.2.k.k"
