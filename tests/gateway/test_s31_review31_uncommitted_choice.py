"""Session 31 (review31): flow control's deferred routing charge (S30-cut30-1) when the step between the choice and
its commit raises. ``open_upstream`` raises ValueError synchronously (a header or URL it refuses, before anything is
written): the request answers 500 and leaves nothing behind: no replica load, no router counter, no virtual tokens,
no queued request, its tenant's concurrency slot given back (``in_flight`` 0), and the next request is served. A pin
of S30-cut30-1's caveat ("that request uncharged"), not a fix."""

from __future__ import annotations

from typing import Any

import pytest

import gateway.pipeline as pipeline
from tests.conftest import Stack

BODY = {"model": "sim-model", "prompt": "QQQ uncommitted choice " * 8, "max_tokens": 4}


@pytest.fixture
def n_replicas() -> int:
    return 1


async def test_a_choice_whose_write_raises_holds_nothing(stack: Stack, monkeypatch: pytest.MonkeyPatch) -> None:
    gw = stack.components
    assert gw.flow is not None
    rid = gw.replica_set.all()[0].id
    calls: list[str] = []

    def refused(*args: Any, **kwargs: Any) -> Any:
        calls.append(args[1])
        raise ValueError("header value holds CR or LF")

    before = (gw.router.counters().requests, gw.flow.queue.counter("tenant-a"))
    with monkeypatch.context() as m:
        m.setattr(pipeline, "open_upstream", refused)
        r = await stack.client.post(f"{stack.url}/v1/completions", json=BODY, headers=stack.auth())
    assert r.status_code == 500 and calls, r.text
    load = gw.router.loads.snapshot(rid)
    assert (load.running_requests, load.tokens) == (0, 0)
    assert (gw.router.counters().requests, gw.flow.queue.counter("tenant-a")) == before
    assert len(gw.flow.queue) == 0 and gw.admission.limiter.in_flight("tenant-a") == 0
    ok = await stack.client.post(f"{stack.url}/v1/completions", json=BODY, headers=stack.auth())
    assert ok.status_code == 200, ok.text
    assert gw.router.counters().requests == before[0] + 1 and gw.flow.queue.counter("tenant-a") > before[1]
