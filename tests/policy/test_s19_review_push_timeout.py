"""Session 19 review, S19-R9: a policy change pushed to a remote OPA rides on the decision client
(gateway/pep.py: ``RemoteOpaTarget(inner.client, ...)``), whose aiohttp session has a TOTAL timeout of
``policy.timeout_s`` (policy/remote.py ``_OpaClient``: ``ClientTimeout(total=self.timeout)``; default 0.2 s,
gateway/config_policy.py), the deadline of one DECISION. OPA recompiles every module on a policy PUT; a
push that takes OPA longer than that to answer is reported as a lost reply: 502 ``target_refused`` to the
operator although OPA applies it, then given back (S19-R4/R5's machinery, at once and ``settle_s`` later),
so a policy whose compile takes longer than the decision deadline can never be changed, and every such
push opens the window in which OPA decides with an uncommitted change (until the give-back lands; never
given back if OPA answers after ``settle_s``).

Main (3177dd3): the change below, which a test OPA applies in 0.3 s, is refused.
"""
from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from aiohttp import web

from policy.remote import RemoteOpa
from policy.store import PolicyStore, RemoteOpaTarget

EXTRA = "package extra.a\n\nx := 1\n"


@pytest.fixture
async def slow_opa() -> dict[str, object]:
    """An OPA stand-in whose policy PUT takes 0.3 s (a compile), then applies and answers 200."""
    held: dict[str, str] = {}

    async def put_policy(request: web.Request) -> web.Response:
        text = await request.text()
        await asyncio.sleep(0.3)
        held[request.match_info["id"]] = text
        return web.json_response({})

    app = web.Application()
    app.router.add_put("/v1/policies/{id:.*}", put_policy)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    yield {"url": f"http://127.0.0.1:{port}", "held": held}
    await runner.cleanup()


async def test_a_push_slower_than_the_decision_deadline_is_not_refused(active: Path, tmp_path: Path,
                                                                       slow_opa: dict[str, object]) -> None:
    remote = RemoteOpa(str(slow_opa["url"]), timeout_s=0.2)  # policy.timeout_s's default
    await remote.start()
    try:
        store = PolicyStore(active, tmp_path / "versions", target=RemoteOpaTarget(remote.client))
        rec = await store.put_policy("extra_a.rego", EXTRA, "ops")  # main: PolicyTargetError (ServerTimeoutError)
        assert rec.version == 1 and slow_opa["held"]["extra_a.rego"] == EXTRA  # type: ignore[index]
    finally:
        await remote.close()
