"""Session 19, helper rc6 (S19-RC6): a policy or registry change that lands while a request waits for a free
upstream connection holds for that request.

The pipeline compares its decision's generation with the decision point's right before ``open_upstream``
(S17-6, S18-RC3); a request that finds no idle connection waits inside the upstream pool (``upstream.pool_size``
connections overall, all busy) and was then written on the old decision (a workload denied meanwhile served,
the old replicas, the old ``max_tokens`` cap). Now the pool writes such a request only when the generation it
was given still holds (gateway/upstream_pool.py ``guard``), else it gives the connection back unused and raises
``NotWritten``; the pipeline decides again with the same attempt (gateway/pipeline.py, gateway/pep_recheck.py).

The stack: flow control off, three slow replicas (r0, r1 in pool ``default``, r2 in ``eu``), a policy store,
ONE upstream connection: a holder request keeps it busy; the request under test waits in the pool.
"""
from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from gateway.proxy import NotWritten, open_upstream
from gateway.upstream_pool import UpstreamPool
from tests.support import flow
from tests.support import audit_log as audit_fixtures
from tests.support.audit_log import ListLog
from tests.support.flow import HOLD_UNTIL_CANCELLED, HOLDING_TOKENS
from tests.support.policy_store import policy_store_section
from tests.support.waiting import wait_for

audit_log, audit_hub = audit_fixtures.audit_log, audit_fixtures.audit_hub  # the stack on a ListLog

replica_cfg = flow.replica_cfg  # slow decode (50 ms a token): the holder holds
WORKLOADS = "/admin/data/prefixgate/config/workloads"
POOLS = "/admin/data/prefixgate/config/pools"
DENIED = "spiffe://demo.prefixgate.test/tenant-a/app"
IDS = ("r0", "r1", "r2")


@pytest.fixture
def n_replicas() -> int:
    """r0, r1 in pool ``default``; r2 in pool ``eu``."""
    return 3


@pytest.fixture
def config_overrides(tmp_path: Path, request: Any) -> dict[str, Any]:
    """Flow control off, unless a test sets ``flow_on`` (indirect parametrization: the request leaves the
    flow queue at once, room on every replica, and then waits in the pool)."""
    flow_cfg = {"enabled": True} if getattr(request, "param", None) == "flow_on" else {"enabled": False}
    return {"flow": flow_cfg, "upstream": {**HOLD_UNTIL_CANCELLED["upstream"], "pool_size": 1},
            "policy": {**policy_store_section(tmp_path), **HOLD_UNTIL_CANCELLED["policy"]}}


async def reload_tenant_a(stack: Any, **fields: Any) -> None:
    """Rewrite tenant-a's entry of gateway.yaml with ``fields`` and reload the registry (200 expected)."""
    p = stack.tmp / "gateway.yaml"
    doc = yaml.safe_load(p.read_text())
    for t in doc["tenancy"]["tenants"]:
        if t["id"] == "tenant-a":
            t.update(fields)
    p.write_text(yaml.safe_dump(doc))
    r = await stack.client.post(f"{stack.admin_url}/admin/tenants/reload", headers=stack.operator_auth())
    assert r.status_code == 200, r.text


async def put_data(stack: Any, path: str, doc: dict[str, Any]) -> None:
    """A policy data upload (200 expected)."""
    r = await stack.client.put(f"{stack.admin_url}{path}", content=json.dumps(doc),
                               headers={**stack.operator_auth(), "Content-Type": "application/json"})
    assert r.status_code == 200, r.text


async def deny_tenant_a(stack: Any) -> None:
    """A policy change: tenant-a's workload on the deny-list."""
    await put_data(stack, WORKLOADS, {"denied": [DENIED]})


def post(stack: Any, max_tokens: int, n: int) -> asyncio.Future[Any]:
    """tenant-a's completion in the background, prompt ``n`` of its own; the client never gives up."""
    prompt = " ".join(f"p{n}w{i}" for i in range(40))
    return asyncio.ensure_future(stack.client.post(
        "/v1/completions", json={"model": "sim-model", "prompt": prompt, "max_tokens": max_tokens},
        headers=stack.auth(), timeout=None))


def routed(stack: Any) -> int:
    """Requests the router counts on the replicas (dispatched: written or waiting for a connection)."""
    loads = stack.components.router.loads
    return sum(loads.snapshot(rid).running_requests for rid in IDS)


def at_replicas(stack: Any) -> list[int]:
    """Requests each replica received (r0, r1, r2)."""
    return [st.counters.requests for st in stack.cluster.states]


def pool(stack: Any) -> UpstreamPool:
    session = stack.components.upstream.session
    assert session is not None
    return session


async def waiting_in_the_pool(stack: Any, monkeypatch: Any, change: Any, max_tokens: int = 4, *,
                              first_route: Any = None) -> tuple[Any, Any, list[str]]:
    """A holder keeps the one upstream connection; a second request of tenant-a (``max_tokens``) is routed
    and waits in the pool for it; ``change(stack)`` is made (acknowledged) meanwhile; then the holder is
    cancelled (its connection closes: the waiting request gets one). tenant-a may use r0, r1 and r2 until
    the change. ``first_route``: the replicas the waiting request's first choice is made among.
    Returns the waiting request's answer, its record and the router's choices after the holder's."""
    await put_data(stack, POOLS, {"reserved": {}})  # no pool reserved: r2 (pool eu) too
    await reload_tenant_a(stack, pools=["default", "eu"], max_output_tokens=HOLDING_TOKENS)
    records: list[Any] = []
    record = stack.components.recorder.record

    def keep(rec: Any) -> None:
        records.append(rec)
        record(rec)

    holder = post(stack, HOLDING_TOKENS, 1)
    waiter: asyncio.Future[Any] | None = None
    try:
        await wait_for(lambda: sum(st.running for st in stack.cluster.states) == 1 or holder.done(), 60,
                       what="holder running")
        assert not holder.done()
        router, choices = stack.components.router, []
        route = router.route

        def first_among(req: Any, ids: Any, *rest: Any) -> Any:
            ids = list(ids)
            choice, ticket = route(req, [i for i in ids if i in first_route] if first_route and not choices
                                   else ids, *rest)
            choices.append(choice.replica_id)
            return choice, ticket
        monkeypatch.setattr(router, "route", first_among)
        choose = router.choose  # flow control's release chooses, then charges (session 30: Router.commit)

        def first_choice(req: Any, ids: Any, *rest: Any) -> Any:
            ids = list(ids)
            choice = choose(req, [i for i in ids if i in first_route] if first_route and not choices else ids, *rest)
            choices.append(choice.replica_id)
            return choice
        monkeypatch.setattr(router, "choose", first_choice)
        monkeypatch.setattr(stack.components.recorder, "record", keep)
        waiter = post(stack, max_tokens, 2)
        # routed (counted by the router) but at no replica: it waits for the pool's one connection
        await wait_for(lambda: routed(stack) == 2 or waiter.done(), 60, what="request waiting in the pool")
        assert not waiter.done() and sum(at_replicas(stack)) == 1 and pool(stack).open_connections == 1
        await change(stack)
        assert not waiter.done()  # still waiting when the change was acknowledged
        holder.cancel()
        answer = await waiter
    finally:
        holder.cancel()
        if waiter is not None:
            waiter.cancel()
        await asyncio.gather(holder, *([waiter] if waiter is not None else []), return_exceptions=True)
    (rec,) = [r for r in records if r.request_id == answer.headers["x-request-id"]]
    return answer, rec, choices


async def back_to_idle(stack: Any) -> None:
    """The pool holds no request any more: every open connection idle, none waited for, no deadline."""
    p = pool(stack)
    await wait_for(lambda: p.waiting == 0 and p.deadlines_pending == 0 and p.open_connections == p.idle_connections
                   and p.open_connections <= 1, 30, what="pool back to idle")


async def test_a_deny_while_waiting_for_a_connection_refuses_the_request(
        stack: Any, audit_log: ListLog, monkeypatch: Any) -> None:
    failed: list[Any] = []
    monkeypatch.setattr(stack.components.upstream, "failed", lambda *a: failed.append(a))
    answer, rec, choices = await waiting_in_the_pool(stack, monkeypatch, deny_tenant_a)
    assert answer.status_code == 403, answer.text[:200]  # before: 200, written on the old allow
    assert answer.json()["error"]["code"] == "workload_denied"
    assert sum(at_replicas(stack)) == 1  # only the holder's request was ever written
    (ev,) = [e for e in audit_log.events if e.request_id == answer.headers["x-request-id"]]
    assert ev.status_code == 403 and ev.policy.decision_id == rec.decision_id is not None
    assert len(choices) == 1  # refused, not routed again
    assert rec.attempts == 1 and failed == []  # no attempt counted again, no failure verdict
    await back_to_idle(stack)


async def test_a_pool_narrowed_while_waiting_sends_it_to_a_replica_still_allowed(
        stack: Any, monkeypatch: Any) -> None:
    failed: list[Any] = []
    monkeypatch.setattr(stack.components.upstream, "failed", lambda *a: failed.append(a))
    before: list[int] = []

    async def narrow(stack: Any) -> None:
        before.extend(at_replicas(stack))
        await reload_tenant_a(stack, pools=["eu"])  # a registry change: tenant-a may use r2 only

    answer, rec, choices = await waiting_in_the_pool(stack, monkeypatch, narrow, first_route=("r0", "r1"))
    assert answer.status_code == 200, answer.text[:200]
    after = at_replicas(stack)
    assert after[:2] == before[:2] and after[2] == before[2] + 1  # before: written to r0 or r1
    assert choices[0] in ("r0", "r1") and choices[1:] == ["r2"]  # chosen again among the allowed
    assert rec.replica == "r2" and rec.attempts == 1 and failed == []
    rs = stack.components.replica_set
    assert all(rs.state(rid).consecutive_failures == 0 for rid in IDS)  # the first choice not blamed
    await back_to_idle(stack)


@pytest.mark.parametrize("config_overrides", ["flow_on"], indirect=True)
async def test_flow_controls_released_replica_taken_away_while_waiting_is_refused(
        stack: Any, monkeypatch: Any) -> None:
    """Flow control on: the replica flow control released the request to is its slot; a change that takes it
    away while the request waits for a connection refuses it (503 no_replica, as S17-6), nothing written."""
    seen: list[int] = []

    async def take_its_replica_away(stack: Any) -> None:
        loads, states = stack.components.router.loads, stack.cluster.states
        (mine,) = [rid for rid, st in zip(IDS, states) if loads.snapshot(rid).running_requests > st.running]
        seen.extend(at_replicas(stack))
        await reload_tenant_a(stack, pools=["default"] if mine == "r2" else ["eu"])

    answer, rec, choices = await waiting_in_the_pool(stack, monkeypatch, take_its_replica_away)
    assert answer.status_code == 503 and answer.json()["error"]["code"] == "no_replica", answer.text[:200]
    assert at_replicas(stack) == seen and sum(seen) == 1  # before: 200, written to the replica taken away
    assert rec.attempts == 1 and len(choices) == 1  # flow control's release only: not routed again


async def test_a_cap_lowered_while_waiting_holds_on_the_same_replica(stack: Any, monkeypatch: Any) -> None:
    async def lower_cap(stack: Any) -> None:
        await reload_tenant_a(stack, max_output_tokens=3)  # a registry change that keeps its replicas

    answer, rec, choices = await waiting_in_the_pool(stack, monkeypatch, lower_cap, 20, first_route=("r0", "r1"))
    assert answer.status_code == 200, answer.text[:200]
    assert answer.json()["usage"]["completion_tokens"] <= 3  # before: 20, the old cap
    assert rec.max_tokens == 3 and rec.attempts == 1  # decided again, one attempt
    assert len(choices) == 1 and rec.replica == choices[0]  # on the replica it was routed to
    await back_to_idle(stack)


# ---------------------------------------------------------------- the pool and open_upstream alone


class Generation:
    """A guard whose reads of ``generation`` are counted."""

    def __init__(self) -> None:
        self.value, self.reads = 0, 0

    @property
    def generation(self) -> int:
        self.reads += 1
        return self.value


async def _server(gate: asyncio.Event, seen: list[bytes]) -> asyncio.Server:
    """A loopback HTTP/1.1 server: each request (a head and a Content-Length body) counted in ``seen``,
    answered ``200 ok`` once ``gate`` is set; keep-alive."""
    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = [int(h.split(b":")[1]) for h in head.split(b"\r\n") if h.lower().startswith(b"content-length")]
                await reader.readexactly(length[0] if length else 0)
                seen.append(head)
                await gate.wait()
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            writer.close()
    return await asyncio.start_server(serve, "127.0.0.1", 0)


async def test_the_pool_gives_the_connection_back_when_the_guard_moved_during_its_wait() -> None:
    gate, seen = asyncio.Event(), []
    server = await _server(gate, seen)
    url = "http://127.0.0.1:%d/v1/completions" % server.sockets[0].getsockname()[1]
    p = UpstreamPool(1, 5.0)
    guard = Generation()
    tasks: list[asyncio.Future[Any]] = []
    try:
        busy = asyncio.ensure_future(p.request("POST", url, b"{}", deadline=p.time() + 30))
        await wait_for(lambda: len(seen) == 1, 10, what="first request at the server")
        waiting = asyncio.ensure_future(p.request("POST", url, b"{}", deadline=p.time() + 30, guard=guard,
                                                  generation=0))
        tasks += [busy, waiting]
        await wait_for(lambda: p.waiting == 1, 10, what="second request waiting for the connection")
        assert guard.reads == 0
        guard.value = 1  # a change while it waits
        gate.set()
        resp = await busy
        assert await resp.read_chunk() == b"ok"
        resp.close()
        with pytest.raises(NotWritten):
            await waiting
        assert guard.reads == 1 and len(seen) == 1  # read once, after the wait; nothing written
        await wait_for(lambda: p.open_connections == p.idle_connections == 1 and p.waiting == 0, 10,
                       what="the connection idle again")
        again = await p.request("POST", url, b"{}", deadline=p.time() + 30, guard=guard, generation=1)
        assert again.status == 200 and len(seen) == 2  # the same guard, now current: written
        again.close()
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await p.close()
        server.close()


def _calls_of(fn: Any) -> tuple[Any, list[str]]:
    """Run ``fn()`` under ``sys.setprofile``: its result and the Python functions it called (file:name)."""
    names: list[str] = []

    def prof(frame: Any, event: str, arg: Any) -> None:
        if event == "call":
            names.append(f"{Path(frame.f_code.co_filename).name}:{frame.f_code.co_name}")
    sys.setprofile(prof)
    try:
        out = fn()
    finally:
        sys.setprofile(None)
    return out, names


async def test_the_common_path_reads_no_guard_and_makes_the_same_calls() -> None:
    """A request written at once on an idle connection (the warm gateway's usual request): the same Python
    calls with a guard as without, and the guard is never read (the compare runs only after a wait)."""
    gate, seen = asyncio.Event(), []
    gate.set()
    server = await _server(gate, seen)
    url = "http://127.0.0.1:%d/v1/completions" % server.sockets[0].getsockname()[1]
    p = UpstreamPool(1, 5.0)
    guard = Generation()
    try:
        calls: list[list[str]] = []
        # the first: a new connection, the URL's head template and the deadline timer made (not measured)
        for i, args in enumerate([(), (), (guard, 0), (), (guard, 0)]):
            call, names = _calls_of(lambda: open_upstream(p, url, {"a": i}, {"X-Request-Id": f"r{i}"}, 30.0, *args))
            up = await call
            up.close()
            calls.append(names)
            await wait_for(lambda: p.idle_connections == 1, 10, what="idle connection")
        assert "upstream_conn.py:send" in calls[1]  # written within open_upstream's call: the common path
        assert calls[1] == calls[2] == calls[3] == calls[4]  # with a guard or without: the same calls
        assert guard.reads == 0 and len(seen) == 5
    finally:
        await p.close()
        server.close()
