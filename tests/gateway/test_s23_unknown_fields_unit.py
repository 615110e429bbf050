"""Session 23 (S22-newcomer-3): fields outside the request schema, without a server (gateway/unknown_fields.py,
``parse_inference_request(..., unknown_fields=...)``). End to end: tests/hostile/test_s23_unknown_fields.py."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gateway import errors
from gateway.config_http import LimitsConfig
from gateway.errors import GatewayError
from gateway.request import parse_inference_request
from gateway.unknown_fields import (GATEWAY_OWNED, KNOWN_CHAT, KNOWN_COMPLETIONS, MAX_HEADER_NAME_BYTES, MAX_NAMED,
                                    MAX_LABEL_CHARS, MAX_NAME_CHARS, dropped_headers, field_label, outside_schema)

PLAIN = {"model": "m", "prompt": "a b c", "max_tokens": 3}
CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}


def _parse(body: dict[str, Any], endpoint: str = "completions", **kw: Any) -> Any:
    return parse_inference_request(json.dumps(body).encode(), endpoint, **kw)  # type: ignore[arg-type]


def test_the_default_is_refuse_in_the_config_and_the_parser() -> None:
    assert LimitsConfig().unknown_fields == "refuse"
    with pytest.raises(GatewayError) as exc:
        _parse({**PLAIN, "guided_json": {}})
    assert (exc.value.status, exc.value.code, exc.value.param) == (400, "unsupported_parameter", "guided_json")
    assert exc.value.record == {"reason": "1 field(s) outside the request schema"}
    assert exc.value.client_text  # its body is never cached process-wide
    before = dict(errors._BODIES)
    assert json.loads(exc.value.response().body)["error"]["param"] == "guided_json"
    assert errors._BODIES == before


def test_known_sets_are_the_schema_plus_gateway_owned() -> None:
    assert {"prompt", "best_of", "logit_bias", "top_k", "echo", "cache_salt"} <= KNOWN_COMPLETIONS
    assert {"messages", "tools", "parallel_tool_calls", "cache_salt"} <= KNOWN_CHAT
    assert "messages" not in KNOWN_COMPLETIONS and "prompt" not in KNOWN_CHAT and GATEWAY_OWNED == {"cache_salt"}
    with pytest.raises(GatewayError):  # a completions field in a chat body is not the chat schema's
        _parse({**CHAT, "prompt": "x"}, "chat")


def test_cache_salt_alone_is_not_refused_and_counts_nothing() -> None:
    req = _parse({**PLAIN, "cache_salt": "x"})
    assert req.dropped == (0, "") and "cache_salt" not in req.body


def test_drop_counts_names_and_forwards_the_rest() -> None:
    req = _parse({**PLAIN, "top_k": 2, "guided_regex": "(a+)+$", "x": {"deep": [1, 2]}}, unknown_fields="drop")
    assert req.dropped == (2, "guided_regex,x")
    assert req.body == {"model": "m", "max_tokens": 3, "stream": False, "top_k": 2, "prompt": "a b c"}
    assert dropped_headers(req.dropped) == [("X-PrefixGate-Dropped-Fields-Count", "2"),
                                            ("X-PrefixGate-Dropped-Fields", "guided_regex,x")]
    assert dropped_headers((0, "")) == []


@given(st.text(max_size=300))
def test_a_label_is_printable_ascii_bounded_and_comma_free(name: str) -> None:
    label = field_label(name)
    assert label.isascii() and label.isprintable() and "," not in label and label
    assert len(label) <= MAX_LABEL_CHARS + 3
    if 0 < len(name) <= MAX_NAME_CHARS and name.isascii() and name.isprintable() and not set(name) & set(',"\\'):
        assert label == name  # an ordinary name is shown as it is


def test_a_name_of_characters_beyond_the_bmp_is_cut_to_the_label_bound() -> None:
    # each escapes to a 12-character surrogate pair: 64 of them were 768 characters (CI's hypothesis example)
    name = "0000" + "\U00010000" * 40
    label = field_label(name)
    assert len(label) <= MAX_LABEL_CHARS + 3 and label.endswith("...") and label.startswith("0000\\ud800\\udc00")
    assert field_label("\U00010000" * 32) == "\\ud800\\udc00" * 32  # exactly at the bound: not cut


@given(st.dictionaries(st.text(max_size=200), st.integers(-9, 9), max_size=40))
def test_the_header_and_the_message_stay_bounded(extra: dict[str, int]) -> None:
    data = {**PLAIN, **extra}
    names = [k for k in data if k not in KNOWN_COMPLETIONS]
    count, value = outside_schema(data, KNOWN_COMPLETIONS, "drop")
    assert count == len(names)
    labels = value.split(",") if value else []
    assert len(labels) <= min(count, MAX_NAMED) and (not names or labels[0] == field_label(names[0]))
    assert len(value) <= max(MAX_HEADER_NAME_BYTES, len(field_label(names[0])) if names else 0)
    if names:
        with pytest.raises(GatewayError) as exc:
            outside_schema(data, KNOWN_COMPLETIONS, "refuse")
        assert exc.value.param == field_label(names[0]) and len(exc.value.message) < 4096
        assert exc.value.record["reason"] == f"{count} field(s) outside the request schema"


_SCHEMA_VALUES = st.fixed_dictionaries({}, optional={
    "max_tokens": st.integers(1, 64), "stream": st.booleans(), "temperature": st.floats(0, 2),
    "top_k": st.integers(-1, 50), "seed": st.integers(0, 99), "stop": st.sampled_from(["x", ["y", "z"]]),
})


@given(_SCHEMA_VALUES, st.dictionaries(st.sampled_from(["guided_json", "foo", "chat_template", "ü"]),
                                       st.integers(-9, 9), max_size=4), st.sampled_from(["chat", "completions"]))
def test_drop_parses_as_the_body_without_the_unknown_fields(fields: dict[str, Any], unknown: dict[str, int],
                                                            endpoint: str) -> None:
    """Differential: a ``drop`` parse forwards exactly what the default parse forwards for the body without them
    (fast path or pydantic alike), and the default refuses the body with them."""
    base = {**(CHAT if endpoint == "chat" else PLAIN), **fields}
    without = _parse(base, endpoint)
    dropped = _parse({**base, **unknown}, endpoint, unknown_fields="drop")
    assert dropped.body == without.body and dropped.prompts == without.prompts
    assert dropped.prompt_bytes == without.prompt_bytes and dropped.dropped[0] == len(unknown)
    if unknown:
        with pytest.raises(GatewayError) as exc:
            _parse({**base, **unknown}, endpoint)
        assert exc.value.code == "unsupported_parameter"


_PLAIN_VALUES = st.fixed_dictionaries({}, optional={
    "model": st.sampled_from(["m", "", 5, "x" * 257]), "prompt": st.sampled_from(["a b", "", ["a"], None]),
    "messages": st.sampled_from([[{"role": "user", "content": "hi"}], [], [{"role": "x", "content": "y"}], "s"]),
    "max_tokens": st.sampled_from([1, 0, None, True, 2.0]), "stream": st.sampled_from([True, False, 1, None]),
    "stream_options": st.sampled_from([{"include_usage": True}, {}, None, 3]), "cache_salt": st.just("s"),
})


@given(_PLAIN_VALUES)
def test_keys_checked_skips_only_a_test_that_would_pass(data: dict[str, Any]) -> None:
    """Differential (session 23): for a body whose keys are all in ``PLAIN_*`` (what the parse tests first),
    ``keys_checked=True`` answers exactly as request_fast's own test of other schema fields does."""
    from gateway.request_fast import plain_chat, plain_completion
    from gateway.unknown_fields import PLAIN_CHAT, PLAIN_COMPLETIONS
    if PLAIN_COMPLETIONS.issuperset(data):
        assert plain_completion(data, True) == plain_completion(data)
    if PLAIN_CHAT.issuperset(data):
        assert plain_chat(data, True) == plain_chat(data)
