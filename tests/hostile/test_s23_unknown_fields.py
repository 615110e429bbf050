"""Session 23 (S22-newcomer-3): a top-level body field outside the request schema is refused (400
``unsupported_parameter``, the default) or dropped with answer headers naming it (``limits.unknown_fields:
drop``); never dropped silently. Each case asserts what the (recording) replica received and the audit event.

Before: every body below answered 200 and the replica received it without the fields, with no sign of it.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from gateway.unknown_fields import DROPPED_COUNT_HEADER, DROPPED_HEADER, MAX_HEADER_NAME_BYTES
from tests.hostile.conftest import stable_master_secret
from tests.support.audit_log import ListLog, audit_hub, audit_log  # noqa: F401 - fixtures

LONG = " ".join(f"w{i}" for i in range(64))
PROBE = {  # S22-newcomer-3's probe (tests/hostile/test_overrides.py sends routing hints)
    "chat_template": "{{7*7}}", "chat_template_kwargs": {"x": 1}, "guided_regex": "(a+)+$",
    "kv_transfer_params": {"do_remote_prefill": True, "remote_host": "10.0.0.1"}, "priority": -100,
    "lora_request": {"lora_name": "x"}, "guided_json": {"type": "object"}, "tenant": "tenant-b",
}
SECRET_NAME = "my secret prompt text: the launch code is 1234"
NOT_AUDIT_WORDS = [n for n in PROBE if n != "tenant"]  # "tenant" is an audit event field of its own


def _chat(**extra: Any) -> dict[str, Any]:
    return {"model": "sim-model", "max_tokens": 4, "messages": [{"role": "user", "content": LONG}], **extra}


def _completion(**extra: Any) -> dict[str, Any]:
    return {"model": "sim-model", "max_tokens": 4, "prompt": LONG, **extra}


def _overrides(capture: Any, tmp_path: Any, mode: str | None) -> dict[str, Any]:
    limits: dict[str, Any] = {"body_read_timeout_s": 0.6, "max_body_bytes": 65536}
    if mode is not None:
        limits["unknown_fields"] = mode
    return {
        "tenancy": {"master_secret_file": stable_master_secret(tmp_path)},
        "replicas": [{"id": "r0", "url": capture.urls[0], "pool": "default"},
                     {"id": "r1", "url": capture.urls[1], "pool": "default"}],
        "limits": limits,
    }


@pytest.fixture
def mode() -> str | None:
    return None  # the default


@pytest.fixture
def config_overrides(capture: Any, tmp_path: Any, mode: str | None) -> dict[str, Any]:
    return _overrides(capture, tmp_path, mode)


def _events(log: ListLog, path: str) -> list[Any]:
    return [e for e in log.events if getattr(e, "endpoint", None) == path]


@pytest.mark.parametrize("path, body", [("/v1/chat/completions", _chat(**PROBE)),
                                        ("/v1/completions", _completion(**PROBE))])
async def test_default_refuses_fields_outside_the_schema(stack: Any, capture: Any, audit_log: ListLog,  # noqa: F811
                                                         path: str, body: dict[str, Any]) -> None:
    r = await stack.client.post(path, json=body, headers=stack.auth())
    assert r.status_code == 400, r.text  # before: 200
    err = r.json()["error"]
    assert err["code"] == "unsupported_parameter" and err["type"] == "invalid_request_error"
    assert err["param"] == "chat_template"  # the first, in the body's order
    assert err["message"].startswith("Unrecognized request arguments supplied: chat_template, chat_template_kwargs")
    assert "{{7*7}}" not in r.text and "10.0.0.1" not in r.text  # names only, never values
    assert capture.seen == []  # nothing reached a replica
    [event] = _events(audit_log, path)
    assert (event.status_code, event.error_code) == (400, "unsupported_parameter")
    assert event.policy.reason == f"{len(PROBE)} field(s) outside the request schema"
    dumped = json.dumps(event.to_dict())
    assert not any(name in dumped for name in NOT_AUDIT_WORDS), dumped  # the count, never a name


async def test_a_name_carrying_prompt_text_never_reaches_the_audit_event(stack: Any, capture: Any,
                                                                          audit_log: ListLog) -> None:  # noqa: F811
    r = await stack.client.post("/v1/completions", json=_completion(**{SECRET_NAME: 1}), headers=stack.auth())
    assert r.status_code == 400 and r.json()["error"]["param"] == SECRET_NAME  # the client's own text, to itself
    [event] = _events(audit_log, "/v1/completions")
    assert event.policy.reason == "1 field(s) outside the request schema"
    assert "launch code" not in json.dumps(event.to_dict())


async def test_schema_fields_and_cache_salt_are_not_refused(stack: Any, capture: Any) -> None:
    """Modelled fields (session 23: ``logit_bias``, ``top_k``, ``min_p``, ``repetition_penalty``,
    ``parallel_tool_calls``, ``best_of`` 1) are forwarded; ``cache_salt`` is replaced, ``user`` pseudonymised."""
    body = _chat(logit_bias={"50256": -100}, top_k=5, min_p=0.05, repetition_penalty=1.1, parallel_tool_calls=False,
                 seed=7, user="me", cache_salt="mine", temperature=0.5)
    r = await stack.client.post("/v1/chat/completions", json=body, headers=stack.auth())
    assert r.status_code == 200, r.text
    assert DROPPED_COUNT_HEADER.lower() not in r.headers
    [seen] = capture.seen
    for k in ("logit_bias", "top_k", "min_p", "repetition_penalty", "parallel_tool_calls", "seed", "temperature"):
        assert seen.body[k] == body[k], k
    assert seen.body["cache_salt"] != "mine" and seen.body.get("user") != "me"
    r = await stack.client.post("/v1/completions", json=_completion(best_of=1, logit_bias={"1": 2}),
                                headers=stack.auth())
    assert r.status_code == 200, r.text
    assert "best_of" not in capture.seen[-1].body and capture.seen[-1].body["logit_bias"] == {"1": 2}


@pytest.mark.parametrize("extra, param", [
    ({"best_of": 4}, "best_of"),  # 4 sequences the tenant is not charged for
    ({"n": 2}, "n"),
    ({"logit_bias": {"abc": 1}}, "logit_bias"),
    ({"logit_bias": {"1": 1e300}}, "logit_bias"),
    ({"logit_bias": {str(i): 1 for i in range(301)}}, "logit_bias"),
    ({"top_k": 1.5}, "top_k"),
])
async def test_modelled_fields_are_bounded(stack: Any, capture: Any, extra: dict[str, Any], param: str) -> None:
    r = await stack.client.post("/v1/completions", json=_completion(**extra), headers=stack.auth())
    assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text
    assert "abc" not in r.json()["error"]["message"]  # a logit_bias key is never echoed
    assert capture.seen == []


@pytest.mark.parametrize("mode", ["drop"])
@pytest.mark.parametrize("stream", [False, True])
async def test_drop_forwards_without_them_and_names_them(stack: Any, capture: Any, audit_log: ListLog,  # noqa: F811
                                                         stream: bool) -> None:
    body = _chat(**PROBE, top_k=5, cache_salt="mine", stream=stream)
    r = await stack.client.post("/v1/chat/completions", json=body, headers=stack.auth())
    assert r.status_code == 200, r.text
    assert r.headers[DROPPED_COUNT_HEADER] == str(len(PROBE))
    assert r.headers[DROPPED_HEADER].split(",") == list(PROBE)
    [seen] = capture.seen
    assert not set(PROBE) & set(seen.body)  # the replica got none of them
    assert seen.body["top_k"] == 5 and seen.body["cache_salt"] != "mine"
    [event] = _events(audit_log, "/v1/chat/completions")
    assert event.outcome.value == "allowed"
    assert not any(name in json.dumps(event.to_dict()) for name in NOT_AUDIT_WORDS)


@pytest.mark.parametrize("mode", ["drop"])
async def test_drop_header_is_bounded_and_escaped(stack: Any, capture: Any) -> None:
    odd = {"x" * 5000: 1, "é\u2028": 2, "a,b": 3, "c\r\nSet-Cookie: s=1": 4, "\x00\x7f": 5, '"\\': 6}
    many = {f"f{i:03d}": i for i in range(200)}
    r = await stack.client.post("/v1/completions", json=_completion(**odd, **many), headers=stack.auth())
    assert r.status_code == 200, r.text
    assert r.headers[DROPPED_COUNT_HEADER] == str(len(odd) + len(many))
    value = r.headers[DROPPED_HEADER]
    assert len(value) <= MAX_HEADER_NAME_BYTES and value.isascii() and value.isprintable()
    assert "set-cookie" not in r.headers and "x" * 65 not in value
    names = value.split(",")
    assert names[0] == "x" * 64 + "..."  # cut, marked; the next labels while they fit
    assert len(names) >= 1 and all(n for n in names)
    [seen] = capture.seen
    assert set(seen.body) <= {"model", "max_tokens", "stream", "prompt", "cache_salt"}


async def test_refusal_names_a_bounded_number_of_escaped_fields(stack: Any, capture: Any) -> None:
    odd = {"é\x01,\"": 1, "y" * 3000: 2, **{f"f{i}": i for i in range(50)}}
    r = await stack.client.post("/v1/chat/completions", json=_chat(**odd), headers=stack.auth())
    assert r.status_code == 400
    err = r.json()["error"]
    assert err["param"] == "\\u00e9\\u0001\\u002c\\\""  # escaped: printable ASCII
    assert "(and 44 more)" in err["message"] and "f5" in err["message"] and "f6," not in err["message"]
    assert len(r.content) < 2048 and "y" * 65 not in err["message"]
    assert capture.seen == []
