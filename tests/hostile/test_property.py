"""Property: over arbitrary request bodies (valid fields, wrong types, hostile extras), the
gateway never answers 500, and whatever it forwards passes its own documented schema
(gateway.request's pydantic models, strict) and carries the tenant's cache_salt."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from gateway.request import ChatBody, CompletionBody

ALLOWED_STATUSES = {200, 400, 404, 413}

scalars = st.one_of(
    st.none(), st.booleans(), st.integers(min_value=-(1 << 70), max_value=1 << 70),
    st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=12),
)
json_values = st.recursive(scalars, lambda kids: st.lists(kids, max_size=3) | st.dictionaries(
    st.text(max_size=6), kids, max_size=3), max_leaves=8)
words = st.lists(st.sampled_from(["alpha", "beta", "gamma", "delta", "\u00e9t\u00e9", "\u6f22\u5b57", "", " "]),
                 max_size=12).map(" ".join)


def bodies(valid_only: bool) -> st.SearchStrategy[tuple[str, dict[str, Any]]]:
    """(endpoint, body): schema-valid fields plus hostile extras, or (``valid_only`` False)
    fields that are each sometimes of any JSON type at all."""

    def field(valid: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
        return valid if valid_only else st.one_of(valid, json_values)

    text_part = st.fixed_dictionaries({"type": st.just("text"), "text": words})
    message = st.fixed_dictionaries(
        {"role": field(st.sampled_from(["system", "user", "assistant", "developer", "tool"])),
         "content": field(st.one_of(words, st.lists(text_part, max_size=2)))},
        optional={"name": field(st.text(max_size=8)), "cache_salt": json_values, "tenant": json_values},
    )
    optional = {
        "max_tokens": field(st.integers(min_value=1 if valid_only else -5, max_value=1 << 21)),
        "temperature": field(st.floats(min_value=0, max_value=2)),
        "top_p": field(st.floats(min_value=0, max_value=1)),
        "n": field(st.just(1) if valid_only else st.integers(min_value=0, max_value=3)),
        "stream": field(st.booleans()),
        "stream_options": field(st.fixed_dictionaries({}, optional={"include_usage": field(st.booleans())})),
        "stop": field(st.one_of(st.text(max_size=4), st.lists(st.text(max_size=4), max_size=4))),
        "seed": field(st.integers(min_value=0, max_value=1 << 32)),
        "user": field(st.text(max_size=10)),
        "presence_penalty": field(st.floats(min_value=-2, max_value=2)),
        # hostile extras: must never reach a replica
        "cache_salt": json_values, "tenant": json_values, "replica": json_values, "pool": json_values,
        "x-prefixgate-replica": json_values,
    }
    model = field(st.sampled_from(["sim-model", "sim-model", "sim-model", "other-model"]))
    completion = st.fixed_dictionaries(
        {"model": model, "prompt": field(st.one_of(words, st.lists(words, min_size=1, max_size=3)))},
        optional={"echo": field(st.booleans()), "logprobs": field(st.integers(min_value=0, max_value=20)),
                  **optional},
    )
    chat = st.fixed_dictionaries(
        {"model": model, "messages": field(st.lists(message, min_size=1, max_size=3))},
        optional={"max_completion_tokens": field(st.integers(min_value=1 if valid_only else -1, max_value=1 << 21)),
                  "tools": field(st.lists(st.dictionaries(st.text(max_size=4), scalars, max_size=2), max_size=2)),
                  "logprobs": field(st.booleans()), **optional},
    )
    return st.one_of(st.tuples(st.just("completions"), completion), st.tuples(st.just("chat"), chat))


requests = st.one_of(bodies(True), bodies(False))


@settings(max_examples=120, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(req=requests)
async def test_gateway_never_500_and_forwards_only_schema_valid_bodies(stack, capture, req):
    endpoint, body = req
    path = "/v1/chat/completions" if endpoint == "chat" else "/v1/completions"
    raw = json.dumps(body, allow_nan=True).encode()
    before = len(capture.seen)
    r = await stack.client.post(path, content=raw, headers={**stack.auth(), "content-type": "application/json"})
    assert r.status_code in ALLOWED_STATUSES, (r.status_code, r.text)
    event(f"status {r.status_code}")  # --hypothesis-show-statistics shows the mix
    if r.status_code != 200:
        err = r.json()["error"]
        assert {"message", "type", "code", "param"} <= set(err)
        assert err["code"] != "upstream_rejected", err  # gateway and replica agree on the schema
        assert len(capture.seen) == before  # a refused body is never forwarded
        return
    assert len(capture.seen) == before + 1
    fwd = capture.seen[-1].body
    model = ChatBody if endpoint == "chat" else CompletionBody
    model.model_validate(fwd)  # strict: raises if the forwarded body breaks the documented schema
    allowed_keys = set(model.model_fields) | {"cache_salt"}
    assert set(fwd) <= allowed_keys - {"max_completion_tokens"}
    tenant = stack.components.registry.get("tenant-a")
    assert fwd["cache_salt"] == stack.components.keys.cache_salt(tenant)
    assert 1 <= fwd["max_tokens"] <= 256  # tenant-a's output cap
