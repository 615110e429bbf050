"""Issue 14, session 15 (helper "route"): the router's prefix-index record of a routed request is
applied while the replica works (``Router.settle`` from ``InferencePipeline._prepare``), after the
upstream request was written; the routing decision precedes the write, and a sequential next request's
decision sees the record (docs/routing.md, "Session 15"). Session 30: flow control's fast path charges the
decision (``Router.commit``: the load ticket, the index record, the counters) right after the write, before
the replica wait's work and the answer (no await between the choice and the charge)."""

from __future__ import annotations

import asyncio

import pytest

from gateway.upstream_conn import UpstreamConnection
from tests.conftest import Stack
from tests.gateway.test_s10_critical_path import _serve
from tests.support.spies import log_answer_bytes, log_calls


@pytest.fixture
def n_replicas() -> int:
    return 1


async def test_record_applied_in_the_replica_wait_and_seen_by_the_next_request(
        stack: Stack, monkeypatch: pytest.MonkeyPatch) -> None:
    gw = stack.components
    index = gw.router.index
    rid = gw.replica_set.all()[0].id
    log: list[str] = []
    log_calls(gw.router, "choose", log, "routed", monkeypatch)
    log_calls(gw.router, "choose_among", log, "routed", monkeypatch)
    log_calls(gw.router, "commit", log, "charged", monkeypatch)
    log_calls(gw.router, "settle", log, "index applied", monkeypatch)
    log_calls(UpstreamConnection, "send", log, "upstream written", monkeypatch)
    log_answer_bytes(log, monkeypatch)
    for _ in range(2):  # a kept-alive upstream connection
        await _serve(stack, log)
    await asyncio.sleep(0)
    blocks = index.replica_blocks(rid)
    assert blocks > 0  # the first requests' keys are in the index
    first = gw.router.counters()
    log.clear()
    await _serve(stack, log)
    decided = log.index("routed")
    written = log.index("upstream written")
    assert decided < written < log.index("charged") < log.index("index applied") < log.index("answer bytes"), log
    # the same prompt again: its decision predicted the whole recorded prefix
    now = gw.router.counters()
    assert now.requests == first.requests + 1
    assert now.predicted_prefix_tokens - first.predicted_prefix_tokens > 0
