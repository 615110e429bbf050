"""Remote OPA: fail closed and fast; response edge cases."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest
from aiohttp import web

from policy.decision import PolicyOutputError, PolicyUnavailableError
from tests.support.opa_server import OpaServerState, create_app, state_from_dir
from policy.remote import RemoteOpa
from sim.procs import free_port


_closed_port = free_port  # free a moment ago: nothing listens there


async def _serve(handler: Any) -> tuple[web.AppRunner, str]:
    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", handler)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    return runner, f"http://127.0.0.1:{port}"


async def test_opa_down_fails_fast(mk: Any) -> None:
    async with RemoteOpa(f"http://127.0.0.1:{_closed_port()}", timeout_s=0.05) as remote:
        start = time.monotonic()
        with pytest.raises(PolicyUnavailableError):
            await remote.decide(mk())
        assert time.monotonic() - start < 2.0  # the 0.05 s deadline, not a 3 s wait (room for a loaded CI box)


async def test_opa_slower_than_deadline_fails_fast(mk: Any) -> None:
    calls = 0

    async def slow(request: web.Request) -> web.Response:
        nonlocal calls
        calls += 1
        await asyncio.sleep(3)
        return web.json_response({"result": {"allow": True, "reason_code": "x", "reason": ""}})

    runner, url = await _serve(slow)
    try:
        async with RemoteOpa(url, timeout_s=0.05) as remote:
            start = time.monotonic()
            with pytest.raises(PolicyUnavailableError):
                await remote.decide(mk())
            assert time.monotonic() - start < 2.0  # the 0.05 s deadline, not a 3 s wait (room for a loaded CI box)
        assert calls == 1  # no retry
    finally:
        await runner.cleanup()


async def test_server_error_not_retried(mk: Any) -> None:
    calls = 0
    seen_query: list[str] = []

    async def broken(request: web.Request) -> web.Response:
        nonlocal calls
        calls += 1
        seen_query.append(request.query_string)
        return web.json_response({"code": "internal_error", "message": "boom"}, status=500)

    runner, url = await _serve(broken)
    try:
        async with RemoteOpa(url, timeout_s=1.0) as remote:
            with pytest.raises(PolicyUnavailableError):
                await remote.decide(mk())
        assert calls == 1
        assert "strict-builtin-errors=true" in seen_query[0]
    finally:
        await runner.cleanup()


async def test_not_started_is_unavailable(mk: Any) -> None:
    with pytest.raises(PolicyUnavailableError):
        await RemoteOpa("http://127.0.0.1:1").decide(mk())


def test_plaintext_to_remote_host_refused() -> None:
    with pytest.raises(ValueError):
        RemoteOpa("http://opa.example.com:8181")
    RemoteOpa("https://opa.example.com:8181")  # TLS is fine
    RemoteOpa("http://opa.example.com:8181", allow_plaintext=True)


async def test_200_without_result_is_deny(opa_server: Any, mk: Any) -> None:
    async with RemoteOpa(opa_server.url, timeout_s=5.0, decision_path="prefixgate/authz/nothing_here") as remote:
        d = await remote.decide(mk())
    assert (d.allow, d.reason_code) == (False, "undefined")


async def test_decision_id_from_opa_or_generated(server_cls: Any, rego_dir: Any, mk: Any) -> None:
    seen: list[str] = []

    async def echo(request: web.Request) -> web.Response:
        return web.json_response(
            {"result": {"allow": False, "reason_code": "x", "reason": ""}, "decision_id": "opa-id-42"}
        )

    runner, url = await _serve(echo)
    try:
        async with RemoteOpa(url, timeout_s=2.0) as remote:
            seen.append((await remote.decide(mk())).decision_id)
    finally:
        await runner.cleanup()
    assert seen == ["opa-id-42"]
    with server_cls(create_app(state_from_dir(rego_dir, decision_logs=False))) as srv:
        async with RemoteOpa(srv.url, timeout_s=5.0) as remote:
            a = await remote.decide(mk())
            b = await remote.decide(mk())
    assert a.decision_id and a.decision_id != b.decision_id


async def test_wrongly_shaped_decision_is_policy_error(mk: Any) -> None:
    async def bad(request: web.Request) -> web.Response:
        return web.json_response({"result": {"allow": "yes", "reason_code": "x", "reason": ""}})

    runner, url = await _serve(bad)
    try:
        async with RemoteOpa(url, timeout_s=2.0) as remote:
            with pytest.raises(PolicyOutputError):
                await remote.decide(mk())
    finally:
        await runner.cleanup()


async def test_revision_change_notifies_listeners(server_cls: Any, rego_dir: Any, mk: Any) -> None:
    state = state_from_dir(rego_dir)
    changes: list[int] = []
    with server_cls(create_app(state)) as srv:
        async with RemoteOpa(srv.url, timeout_s=5.0, provenance=True) as remote:
            remote.add_change_listener(lambda: changes.append(1))
            await remote.decide(mk())
            await remote.decide(mk())
            assert changes == []
            state.swap(dict(state.modules), dict(state.data))
            await remote.decide(mk())
            assert changes == [1]


def test_server_state_rejects_broken_policy(rego_dir: Any) -> None:
    state: OpaServerState = state_from_dir(rego_dir)
    before = dict(state.modules)
    with pytest.raises(Exception):
        state.swap({**state.modules, "x.rego": "package x\nallow if nope(1)"}, state.data)
    assert state.modules == before
