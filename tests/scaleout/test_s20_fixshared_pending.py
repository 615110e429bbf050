"""Session 20, fixshared, found here (S20-FS1): an instance whose master is PENDING (a higher generation
announced, its own secret source not provisioned yet) overwrote the shared documents it cannot authenticate,
and the rotated instances re-published them at once: a publish ping-pong on the change channel for as long
as the master stayed pending (a probe, /work/notes/s20-fixshared.md: 1,746-2,257 announcements in 2 s
between two documents' tasks, where a change announces one).

A record this instance cannot authenticate while a higher master is pending here may be the new master's
(tenancy/shared_keys.py leaves the key records alone for that reason): the document's ``sync`` counts it
once and leaves it; the instances holding the new master heal a real forgery. A publish (an operator's
change) still replaces a stored record it finds forged, and nothing unauthenticated is ever adopted.
"""
from __future__ import annotations

import os
import secrets
from pathlib import Path

import httpx
import redis.asyncio as aioredis

from gateway.app import build_admin_app
from gateway.shared_docs import DOCS_MAC_INFO, SharedDocument, state_metrics
from tenancy.keys import KeyRing
from tests.scaleout.s2_instances import ISSUER, OPERATOR, PREFIX, instance
from tests.support.waiting import wait_for


def _provision(path: Path, secret: str) -> None:
    path.write_text(secret)
    os.chmod(path, 0o600)


async def _post(gw, path: str) -> None:
    token = ISSUER.mint(OPERATOR, "prefixgate-admin")
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=build_admin_app(gw)), base_url="http://admin",
                                 headers={"Authorization": f"Bearer {token}"}) as admin:
        resp = await admin.post(path)
        assert resp.status_code == 200, resp.text


async def _noop(version: int, body: object) -> None:
    return None


async def test_an_instance_with_a_pending_master_leaves_the_new_masters_documents_alone(tmp_path: Path,
                                                                                         redis_server) -> None:
    old, new = secrets.token_hex(32), secrets.token_hex(32)
    files = [tmp_path / f"master{i}.key" for i in range(2)]
    for f in files:
        _provision(f, old)
    a, b = (instance(tmp_path, i, redis_server.url, files[i]) for i in range(2))
    raw = aioredis.Redis.from_url(redis_server.url)
    await a.shared.start()
    await b.shared.start()
    try:
        await _post(a, "/admin/tenants/reload")  # tenants version 1, held by both
        await wait_for(lambda: b.shared.registry_version == 1, what="b adopted tenants version 1")
        _provision(files[0], new)  # a's host only: b's is not provisioned yet
        await _post(a, "/admin/keys/rotate-master")
        await wait_for(lambda: b.shared.keys.master_pending == 2, what="b reports the pending generation")
        only_new = SharedDocument(raw, PREFIX, "tenants", KeyRing(new.encode()).mac_subkeys(DOCS_MAC_INFO)[0],
                                  lambda: 0, _noop, state_metrics(None))
        await wait_for(only_new.remote_version, what="a re-published the tenants record under the new master")
        # the documents' tasks stopped: each sync below is called here, one at a time
        await a.shared.tenants.aclose()
        await b.shared.tenants.aclose()
        await a.shared.tenants.sync()  # the record under the new master (re-MAC'd if b had overwritten it)
        assert await only_new.remote_version() == 1
        stored = await raw.get(f"{PREFIX}docs:tenants")
        await b.shared.tenants.sync()
        assert await raw.get(f"{PREFIX}docs:tenants") == stored, "b overwrote a record of the pending master"
        assert b.shared.tenants.rejected == 1 and b.shared.registry_version == 1  # counted once, nothing adopted
        _provision(files[1], new)  # b's host provisioned: it follows, and reads the record
        await wait_for(lambda: b.keyring.master_generation == 2, what="b adopted the new master")
        assert await b.shared.tenants.sync() is False and await only_new.remote_version() == 1
    finally:
        await raw.aclose()
        await a.shared.stop()
        await b.shared.stop()
