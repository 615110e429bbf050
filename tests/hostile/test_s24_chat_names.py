"""Session 24 (S23-newcomer-9): shapes OpenAI's API refuses are refused here too, before anything reaches a
replica, with the client's path as ``param``: a ``tool`` message without ``tool_call_id`` (required in OpenAI's
API reference, ChatCompletionToolMessageParam) and a function or message name outside ``^[a-zA-Z0-9_-]{1,64}$``
(API reference, ``tools[].function.name``: "a-z, A-Z, 0-9, or contain underscores and dashes, with a maximum
length of 64"; the API answers 400 ``invalid_value`` for ``messages[].name``, ``tools[].function.name`` and
``messages[].tool_calls[].function.name`` outside that pattern).

Before: each body below answered 200 and the replica received it (a strict engine refuses it after admission).
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.hostile.conftest import stable_master_secret
from tests.support.audit_log import ListLog, audit_hub, audit_log  # noqa: F401 - fixtures

PATH = "/v1/chat/completions"
LONG = "Q" * 100_000  # not a hex digit: an audit event's random ids never contain it
SNOWMAN = "a b\u2603"


@pytest.fixture
def config_overrides(capture: Any, tmp_path: Any) -> dict[str, Any]:
    return {"tenancy": {"master_secret_file": stable_master_secret(tmp_path)},
            "replicas": [{"id": "r0", "url": capture.urls[0], "pool": "default"},
                         {"id": "r1", "url": capture.urls[1], "pool": "default"}],
            "limits": {"max_body_bytes": 1 << 20}}


def _tool(name: Any) -> dict[str, Any]:
    return {"type": "function", "function": {"name": name, "parameters": {"type": "object", "properties": {}}}}


def _call(name: str) -> dict[str, Any]:
    return {"id": "call_1", "type": "function", "function": {"name": name, "arguments": "{}"}}


def _chat(messages: list[dict[str, Any]] | None = None, **extra: Any) -> dict[str, Any]:
    return {"model": "sim-model", "max_tokens": 4,
            "messages": messages or [{"role": "user", "content": "what is the weather"}], **extra}


ANSWERED = [{"role": "user", "content": "weather?"}, {"role": "assistant", "tool_calls": [_call("get_weather")]}]

CASES = [
    (_chat(ANSWERED + [{"role": "tool", "content": "sunny"}]), "messages.2.tool_call_id"),
    (_chat([{"role": "tool", "content": "sunny"}]), "messages.0.tool_call_id"),  # the plain shape's shortcut too
    (_chat(ANSWERED + [{"role": "tool", "content": "sunny", "tool_call_id": None}]), "messages.2.tool_call_id"),
    (_chat(tools=[_tool("ok_name"), _tool(LONG)]), "tools.1.function.name"),
    (_chat(tools=[_tool("x" * 65)]), "tools.0.function.name"),
    (_chat(tools=[_tool("get.weather")]), "tools.0.function.name"),
    (_chat(tools=[_tool(7)]), "tools.0.function.name"),
    (_chat(tools=[{"type": "function", "function": {"parameters": {}}}]), "tools.0.function.name"),
    (_chat(tools=[_tool("ok")], tool_choice={"type": "function", "function": {"name": SNOWMAN}}),
     "tool_choice.function.name"),
    (_chat([{"role": "user", "content": "q"}, {"role": "assistant", "tool_calls": [_call(SNOWMAN)]}]),
     "messages.1.tool_calls.0.function.name"),
    (_chat([{"role": "user", "content": "hi", "name": SNOWMAN}]), "messages.0.name"),
    (_chat([{"role": "user", "content": "hi", "name": "n" * 65}]), "messages.0.name"),
]


@pytest.mark.parametrize("body, param", CASES)
async def test_openai_refused_shapes_are_refused(stack: Any, capture: Any, audit_log: ListLog,  # noqa: F811
                                                 body: dict[str, Any], param: str) -> None:
    r = await stack.client.post(PATH, json=body, headers=stack.auth())
    assert r.status_code == 400, r.text  # before: 200, forwarded
    err = r.json()["error"]
    assert (err["code"], err["type"], err["param"]) == ("invalid_request", "invalid_request_error", param)
    assert "QQQ" not in err["message"] and "\u2603" not in err["message"] and "get.weather" not in err["message"]
    assert capture.seen == []
    [event] = [e for e in audit_log.events if getattr(e, "endpoint", None) == PATH]
    assert (event.status_code, event.error_code) == (400, "invalid_request")
    assert "QQQ" not in json.dumps(event.to_dict())


async def test_conforming_names_and_tool_messages_are_forwarded(stack: Any, capture: Any) -> None:
    body = _chat(ANSWERED + [{"role": "tool", "content": "sunny", "tool_call_id": "call_1"}],
                 tools=[_tool("get_weather"), _tool("A-b_9" + "z" * 59)],
                 tool_choice={"type": "function", "function": {"name": "get_weather"}})
    body["messages"][0]["name"] = "alice-01"
    r = await stack.client.post(PATH, json=body, headers=stack.auth())
    assert r.status_code == 200, r.text
    [seen] = capture.seen
    assert seen.body["messages"][2]["tool_call_id"] == "call_1" and seen.body["tools"] == body["tools"]
    assert seen.body["messages"][0]["name"] == "alice-01"
