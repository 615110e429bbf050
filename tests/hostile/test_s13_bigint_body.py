"""Review RV2-2 (session 13): what the parse accepts must reach the replica, not a 500.

The parse accepts integers up to ``max_int_digits`` digits (20), also beyond 64 bits, in the
free-form objects a request forwards as parsed (``tools[].function.parameters``,
``response_format``'s JSON schema). ``orjson.dumps`` of the upstream body raised ``TypeError``
for such a value: a 500 ``internal_error`` and a logged traceback per request. The upstream body
is now written by :func:`gateway.json_fast.dumps` (orjson, else :mod:`json`).
"""
from __future__ import annotations

from typing import Any

from gateway.json_fast import dumps

BIG = 99_999_999_999_999_999_999  # 20 digits: beyond 2**64 - 1, within the parse's digit bound


def test_dumps_writes_what_orjson_refuses() -> None:
    assert dumps({"a": 1, "b": "é"}) == b'{"a":1,"b":"\xc3\xa9"}'  # orjson's bytes
    assert dumps({"maximum": BIG, "b": "é"}) == b'{"maximum":99999999999999999999,"b":"\xc3\xa9"}'


async def test_tool_schema_with_a_big_integer_reaches_the_replica(stack: Any, capture: Any) -> None:
    tools = [{"type": "function", "function": {"name": "f", "description": "d",
                                               "parameters": {"type": "integer", "maximum": BIG}}}]
    body = {"model": "sim-model", "max_tokens": 4, "tools": tools,
            "messages": [{"role": "user", "content": "hello there"}]}
    r = await stack.client.post("/v1/chat/completions", json=body, headers=stack.auth("tenant-a/app"))
    assert r.status_code == 200, r.text
    forwarded = [c.body for c in capture.seen if c.path == "/v1/chat/completions"]
    assert forwarded and forwarded[-1]["tools"][0]["function"]["parameters"]["maximum"] == BIG
