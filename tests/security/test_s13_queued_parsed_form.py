"""Review R12b-3 (session 13): a request waiting in the flow queue holds no more memory than
``flow.tenant_max_queued_bytes`` counts for it. Before, the count was the body's length while the
request kept its parsed form (5-25x a value-dense body); now it keeps the serialized upstream body
(gateway/flow_bytes.py ``queued_form``) and that is what is counted."""

from __future__ import annotations

import asyncio
import gc
import tracemalloc
from typing import Any

import orjson
import pytest

from gateway.flow_bytes import queued_form, with_salt
from gateway.request import parse_inference_request
from tests.support import flow as flow_support
from tests.support.flow import HOLD_UNTIL_CANCELLED, HOLDING_TOKENS, post, queued, running
from tests.support.waiting import how_it_ended, wait_for

n_replicas = flow_support.n_replicas  # the stack's fixtures: one slow replica
replica_cfg = flow_support.replica_cfg

#: tools holding 8,000 empty objects: ~24 kB of JSON, ~0.6 MB parsed
TOOLS = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "x": [{}] * 8_000}}}]
_TENANT = {"spiffe_ids": ["spiffe://demo.prefixgate.test/tenant-a/"], "models": ["sim-model"], "pools": ["default"],
           "max_output_tokens": 4096, "max_prompt_tokens": 200_000}


def _chat_body() -> dict[str, Any]:
    return {"model": "sim-model", "messages": [{"role": "user", "content": "hi"}], "tools": TOOLS, "max_tokens": 2}


def test_queued_form_is_what_open_upstream_sends_and_drops_the_parsed_form() -> None:
    req = parse_inference_request(orjson.dumps(_chat_body()), "chat", 32, max_json_items=65536)
    body = {**req.body, "max_tokens": 2, "user": "u"}
    expect = orjson.dumps(body)
    salted = orjson.dumps({**body, "cache_salt": "s\u00e9\"1"})
    data = queued_form(req, body)
    assert data == expect
    assert with_salt(data, "s\u00e9\"1") == salted
    assert body == {} and req.body == {} and req.extra_text == "" and req.text == ""
    assert with_salt({"a": 1}, "x") == {"a": 1, "cache_salt": "x"}  # the path without a wait


@pytest.mark.parametrize("config_overrides", [{
    "flow": {"replica_max_running_requests": 1},
    "limits": {"max_prompt_tokens": 200_000},
    "tenancy": {"tenants": [{"id": "tenant-a", **_TENANT}]},
    **HOLD_UNTIL_CANCELLED,  # the first request runs until cancelled, however slow the machine (session 17)
}])
async def test_a_queued_request_holds_about_what_is_counted(stack: Any) -> None:
    flow = stack.components.flow
    # it holds the replica's only running slot until cancelled at the end (205 s of decoding, no upstream
    # deadline or client timeout before): the next request queues, however long it takes to get there
    first = post(stack, HOLDING_TOKENS, timeout=None)
    # running, or refused/ended instead (then say how: session 17 saw a base-tree run wait the 60 s here)
    await wait_for(lambda: running(stack) == 1 or first.done(), 60, what="first request running")
    assert not first.done(), how_it_ended(first)
    gc.collect()
    tracemalloc.start()
    try:
        waiting = asyncio.ensure_future(stack.client.post("/v1/chat/completions", json=_chat_body(),
                                                          headers=stack.auth("tenant-a/app"), timeout=None))
        # queued, or answered/refused instead (then say how, not only that the wait timed out)
        await wait_for(lambda: queued(stack) == 1 or waiting.done(), 120, what="the value-dense request queued")  # tracemalloc is slow
        assert not waiting.done(), how_it_ended(waiting)
        gc.collect()
        holding = tracemalloc.get_traced_memory()[0]
        counted = flow.queued_bytes.held("tenant-a")
        waiting.cancel()
        await asyncio.gather(waiting, return_exceptions=True)
        await wait_for(lambda: flow.queued_bytes.total() == 0 and queued(stack) == 0, 60, what="its bytes back")
        gc.collect()
        after = tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()
        first.cancel()
        await asyncio.gather(first, return_exceptions=True)
    held = holding - after
    assert counted > 20_000
    # before: counted ~24 kB (the body's length) while ~0.6 MB stayed pinned
    assert held < 2 * counted + 150_000, (held, counted)
