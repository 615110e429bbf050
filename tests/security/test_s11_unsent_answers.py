"""Session 11 (R10b-5): a plain answer to a client that never reads stays in the server's write buffer
until the no-progress close (R9b-3), and the request's concurrency slot is free already, so one
tenant could pin any number of them (30 x 1.4 MB: +49 MB). With
``limits.max_unsent_answer_bytes_per_tenant`` its new requests answer 429 ``unsent_answers_limited``
while its unread answers hold more than that; another tenant is served; once the unread
connections are gone the tenant is served again.
"""

from __future__ import annotations

import asyncio
import json
import socket
from collections.abc import AsyncIterator
from typing import Any

import pytest

from tests.support.audit_log import ListLog, audit_hub, audit_log  # noqa: F401 - fixtures: the stack's audit
from tests.support.logprobs_replica import ALTERNATIVES, BigAnswerFake, big_answer_fake, plain_app
from tests.support.fake_replicas import (  # noqa: F401 - n_replicas: this module's stack fixture
    completion, n_replicas, serving)
from tests.support.waiting import wait_for

LIMIT = 512 * 1024


Fake = BigAnswerFake


@pytest.fixture
async def fakes() -> AsyncIterator[list[Fake]]:
    async with serving([big_answer_fake()], plain_app) as out:
        yield out


@pytest.fixture
def config_overrides(fakes: list[Fake]) -> dict[str, Any]:
    return {"replicas": [{"id": "f0", "url": fakes[0].url, "pool": "default"}],
            "limits": {"max_unsent_answer_bytes_per_tenant": LIMIT}}


async def _unread_answer(stack: Any) -> socket.socket:
    """A raw client socket (4 KiB receive buffer) that asked tenant-a's large plain answer and reads nothing."""
    host, port = stack.url.removeprefix("http://").split(":")
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.setblocking(False)
    loop = asyncio.get_running_loop()
    await loop.sock_connect(sock, (host, int(port)))
    body = json.dumps(completion("hello", logprobs=ALTERNATIVES)).encode()
    await loop.sock_sendall(sock, b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                            + f"Authorization: {stack.auth()['Authorization']}\r\n".encode()
                            + f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
    return sock


async def test_a_tenants_unread_answers_are_bounded(stack: Any, fakes: list[Fake],
                                                    audit_log: ListLog) -> None:  # noqa: F811
    assert len(fakes[0].big) > LIMIT
    # the accepted sockets take little: the answer stays in the server's write buffer
    stack.servers[0].servers[0].sockets[0].setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
    unsent = stack.components.cpu_budget.unsent
    sock = await _unread_answer(stack)
    try:
        await wait_for(lambda: unsent.unsent("tenant-a") > LIMIT, what="the unread answer in the write buffer")
        r = await stack.client.post("/v1/completions", json=completion("hello"), headers=stack.auth())
        assert r.status_code == 429, r.text  # before: 200, and so on for any number of unread answers
        assert r.json()["error"]["code"] == "unsent_answers_limited"
        assert r.headers.get("Retry-After") == "1"
        rid = r.headers["X-Request-Id"]
        events = await wait_for(lambda: [e for e in audit_log.events if getattr(e, "request_id", None) == rid],
                                what="the refusal's audit event")
        assert events[0].status_code == 429 and events[0].error_code == "unsent_answers_limited"
        assert events[0].tenant == "tenant-a"
        other = await stack.client.post("/v1/completions", json=completion("hello"), headers=stack.auth("tenant-b/app"))
        assert other.status_code == 200, other.text
    finally:
        sock.close()
    await wait_for(lambda: unsent.unsent("tenant-a") == 0, what="the unread connection forgotten")
    again = await stack.client.post("/v1/completions", json=completion("hello"), headers=stack.auth())
    assert again.status_code == 200, again.text


def test_unsent_answers_count_each_connection_once_and_forget_drained_or_lost_ones() -> None:
    from gateway.answer_cost import UnsentAnswers
    from gateway.client_io import LOSS_KEY, ConnectionLoss
    from tenancy.registry import Tenant

    buffered = {"a": 300, "b": 500}
    conns = {}
    for name in buffered:
        loss = ConnectionLoss()
        loss.unsent = lambda name=name: buffered[name]
        conns[name] = {LOSS_KEY: loss}
    u = UnsentAnswers(600)
    u.note("t", conns["a"])
    u.note("t", conns["a"])  # a second answer on the same keep-alive connection: its buffer counted once
    assert u.unsent("t") == 300
    u.check(Tenant(id="t"))
    u.note("t", conns["b"])
    assert u.unsent("t") == 800
    with pytest.raises(Exception) as refused:
        u.check(Tenant(id="t"))
    assert getattr(refused.value, "code", None) == "unsent_answers_limited"
    u.check(Tenant(id="other"))  # another tenant is not concerned
    buffered["a"] = 0  # drained: forgotten
    assert u.unsent("t") == 500
    conns["b"][LOSS_KEY].fire()  # lost: forgotten at once
    assert u.unsent("t") == 0 and u._held == {}
    assert conns["a"][LOSS_KEY].pending() == 0  # no callback left behind on the drained connection
    u.note("t", {})  # a scope without the guarded listener's loss: nothing tracked
    UnsentAnswers(None).note("t", conns["a"])  # no bound: nothing tracked
    assert u._held == {}


def test_a_connection_reused_for_another_tenant_counts_for_the_last_tenant_only() -> None:
    """Review R11b-1: behind a pooling front proxy one keep-alive connection carries several tenants'
    answers in turn; its unsent bytes are the last answer's, so they count against that tenant only."""
    from gateway.answer_cost import UnsentAnswers
    from gateway.client_io import LOSS_KEY, ConnectionLoss
    from tenancy.registry import Tenant

    pool = []
    for _ in range(5):
        loss = ConnectionLoss()
        buf = {"n": 0}
        loss.unsent = lambda buf=buf: buf["n"]
        pool.append((loss, buf, {LOSS_KEY: loss}))
    u = UnsentAnswers(32 << 20)
    for _loss, buf, scope in pool:  # tenant A's answers, read by its clients afterwards
        buf["n"] = 8 << 20
        u.note("tenant-a", scope)
    for _loss, buf, _scope in pool:
        buf["n"] = 0
    for _loss, buf, scope in pool:  # the same connections carry B's answers, which nobody reads
        buf["n"] = 8 << 20
        u.note("tenant-b", scope)
    assert u.unsent("tenant-a") == 0
    assert u.unsent("tenant-b") == 40 << 20
    u.check(Tenant(id="tenant-a"))
    with pytest.raises(Exception) as refused:
        u.check(Tenant(id="tenant-b"))
    assert getattr(refused.value, "code", None) == "unsent_answers_limited"
    for loss, _buf, _scope in pool:  # each connection keeps one loss callback (B's), none of A's
        assert loss.pending() == 1
        loss.fire()
    assert u.unsent("tenant-b") == 0
