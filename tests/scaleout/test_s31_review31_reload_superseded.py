"""Session 31 (review31): a tenants reload raced by a version adopted from another instance, and a reload whose read of
the stored version fails (``state.backend: redis``).

S31-review31-1: ``POST /admin/tenants/reload`` applies the new registry (a worker thread), is audited, then the
shared-state hook reads the stored version and publishes ``admin.last_tenancy`` as the next one. A sync of the tenants
document in that window (its poll, a channel message) that *adopts* another instance's new version replaces the
reload here; before, the hook then published that adopted registry again under the next version and answered 200:
the operator's reload was lost on every instance (its tenant never served) with a success answer. Now the reload lost
the race and answers 409 ``conflict`` (S17-1's rule for two changes at once: the first stored wins), nothing published.

S31-review31-2: the reload's swap of the registry (worker thread) and a sync's adopt (event loop) interleaved between
the swap and ``last_tenancy``'s update left this instance serving the adopted registry while it published the reload's
under its version: the instance served other tenants than every other one, with nothing to heal it (its sync compares
the stored record with what it published). Now both hold one lock over the swap and the update.

S31-review31-3: a Redis error on the reload's read of the stored version left the reload unnumbered: this instance
served it while its version and kept document stayed the previous ones, so no sync ever shared it (answered 200,
"retried by the next sync"). Now it is numbered from this instance's versions and the next sync publishes it.
"""

from __future__ import annotations

import asyncio
import json
import threading
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis.exceptions
import yaml

from gateway.app import build_admin_app
from tests.scaleout.conftest import redis_server  # noqa: F401 - fixture
from tests.scaleout.s2_instances import ISSUER, OPERATOR, TD, instance, instance_doc, write_secret
from tests.support.waiting import wait_for


def _with_tenant(doc: dict[str, Any], tenant_id: str) -> dict[str, Any]:
    tenants = [*doc["tenancy"]["tenants"], {"id": tenant_id, "spiffe_ids": [f"spiffe://{TD}/{tenant_id}/"],
                                            "models": ["sim-model"], "pools": ["default"]}]
    return {**doc, "tenancy": {**doc["tenancy"], "tenants": tenants}}


async def _reload(gw: Any) -> httpx.Response:
    token = ISSUER.mint(OPERATOR, "prefixgate-admin")
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=build_admin_app(gw)), base_url="http://admin",
                                 headers={"Authorization": f"Bearer {token}"}) as admin:
        return await admin.post("/admin/tenants/reload")


def _served(gw: Any) -> set[str]:
    return {t.id for t in gw.registry.tenants()}


async def _stored(gw: Any) -> tuple[int, set[str]]:
    """The stored tenants record's version and tenant ids (its MAC checked by ``remote_version``)."""
    raw = await gw.shared.client.get(gw.shared.tenants.key)
    text = raw.decode() if isinstance(raw, bytes) else raw
    version, _, body = text.split(":", 2)
    assert await gw.shared.tenants.remote_version() == int(version)
    return int(version), {t["id"] for t in json.loads(body)["tenants"]}


async def _pair(tmp_path: Path, url: str) -> tuple[list[Any], list[dict[str, Any]]]:
    secret = write_secret(tmp_path / "master.key")
    docs = [instance_doc(tmp_path, n, url, secret) for n in (0, 1)]
    gws = [instance(tmp_path, n, url, secret, doc=docs[n]) for n in (0, 1)]
    for gw in gws:
        await gw.shared.start()
    return gws, docs


async def test_a_reload_replaced_here_by_an_adopted_version_answers_409_not_200(
        tmp_path: Path, redis_server: Any) -> None:  # noqa: F811
    """S31-review31-1: instance 1 publishes version 1 (tenant-c); instance 0's reload (tenant-b) is replaced by that
    version, adopted by a sync in the window between its apply and its publish."""
    gws, docs = await _pair(tmp_path, redis_server.url)
    a, c = gws
    try:
        await a.shared.tenants.aclose()  # its follower stopped: its syncs are the ones this test makes
        (tmp_path / "inst1" / "gateway.yaml").write_text(yaml.safe_dump(_with_tenant(docs[1], "tenant-c")))
        assert (await _reload(c)).status_code == 200  # version 1 stored: tenant-a, tenant-c

        synced: list[bool] = []

        async def sync_in_the_window(record: dict[str, Any]) -> None:
            if record.get("action") == "tenants.reload":
                synced.append(await a.shared.tenants.sync())

        a.admin.change_hooks.insert(0, sync_in_the_window)
        (tmp_path / "inst0" / "gateway.yaml").write_text(yaml.safe_dump(_with_tenant(docs[0], "tenant-b")))
        resp = await _reload(a)
        assert synced == [True]  # instance 1's version 1 adopted after the reload applied here
        assert resp.status_code == 409, resp.text  # before: 200, and tenant-b served nowhere
        assert resp.json()["error"]["code"] == "conflict"
        # as answered: the stored registry is in force here, nothing else was published
        assert _served(a) == {"tenant-a", "tenant-c"} and a.shared.registry_version == 1
        assert await _stored(a) == (1, {"tenant-a", "tenant-c"})
        assert not await a.shared.tenants.sync()
    finally:
        for gw in gws:
            await gw.shared.stop()


class _AnnouncingLock:
    """A lock that sets ``go`` before it waits for its holder (the event loop would otherwise wait forever for a
    worker thread that waits for ``go``)."""

    def __init__(self, go: threading.Event) -> None:
        self._lock = threading.Lock()
        self._go = go

    def __enter__(self) -> _AnnouncingLock:
        if not self._lock.acquire(blocking=False):
            self._go.set()
            self._lock.acquire()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._lock.release()


async def test_an_adopt_inside_a_reloads_registry_swap_never_leaves_two_registries(
        tmp_path: Path, redis_server: Any, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: F811
    """S31-review31-2: instance 0's reload (worker thread) is held between its registry swap and its ``last_tenancy``
    update while its sync adopts instance 1's version 1 on the event loop. Whatever the reload answers, the registry
    instance 0 serves is the one stored at the version it holds."""
    gws, docs = await _pair(tmp_path, redis_server.url)
    a, c = gws
    go, in_window = threading.Event(), threading.Event()
    loop_thread = threading.current_thread()
    try:
        await a.shared.tenants.aclose()
        (tmp_path / "inst1" / "gateway.yaml").write_text(yaml.safe_dump(_with_tenant(docs[1], "tenant-c")))
        assert (await _reload(c)).status_code == 200  # version 1: tenant-a, tenant-c

        real = a.admin.pdp.registry_changed

        def held_in_the_thread() -> None:
            if threading.current_thread() is not loop_thread:  # the reload's worker thread, after its swap
                in_window.set()
                go.wait(30)  # bounded: a broken test never hangs the run
            real()

        monkeypatch.setattr(a.admin.pdp, "registry_changed", held_in_the_thread)
        monkeypatch.setattr(a.admin, "_apply_lock", _AnnouncingLock(go), raising=False)  # absent before the fix
        (tmp_path / "inst0" / "gateway.yaml").write_text(yaml.safe_dump(_with_tenant(docs[0], "tenant-b")))
        reload = asyncio.create_task(_reload(a))
        await wait_for(in_window.is_set, what="the reload's worker thread between its swap and its update")
        assert await a.shared.tenants.sync()  # version 1 adopted on the event loop
        go.set()
        resp = await reload
        assert resp.status_code in (200, 409), resp.text
        version, stored = await _stored(a)
        assert a.shared.registry_version == version
        assert _served(a) == stored  # before: {a, c} served here, {a, b} stored at version 2 (and served elsewhere)
        assert {t["id"] for t in a.admin.last_tenancy["tenants"]} == stored
    finally:
        go.set()
        for gw in gws:
            await gw.shared.stop()


async def test_a_reload_whose_version_read_fails_is_shared_by_the_next_sync(
        tmp_path: Path, redis_server: Any) -> None:  # noqa: F811
    """S31-review31-3: instance 0 publishes version 1, then reloads tenant-c while Redis fails the read of the stored
    version; the reload is answered 200 (applied here) and its next sync shares it with instance 1."""
    gws, docs = await _pair(tmp_path, redis_server.url)
    a, c = gws
    try:
        path = tmp_path / "inst0" / "gateway.yaml"
        path.write_text(yaml.safe_dump(_with_tenant(docs[0], "tenant-b")))
        assert (await _reload(a)).status_code == 200  # version 1: tenant-a, tenant-b
        await wait_for(lambda: c.shared.registry_version == 1, what="version 1 adopted by instance 1")
        await a.shared.tenants.aclose()
        real, down = a.shared.tenants._get, [True]

        async def get() -> Any:  # Redis fails the reload's reads (the stored version's, then the publish's)
            if down[0]:
                raise redis.exceptions.ConnectionError("Redis went away")
            return await real()

        a.shared.tenants._get = get  # type: ignore[method-assign]
        path.write_text(yaml.safe_dump(_with_tenant(_with_tenant(docs[0], "tenant-b"), "tenant-c")))
        assert (await _reload(a)).status_code == 200  # applied here; its publish left to the next sync
        assert "tenant-c" in _served(a)
        down[0] = False  # Redis answers again
        await a.shared.tenants.sync()
        assert await _stored(a) == (2, {"tenant-a", "tenant-b", "tenant-c"})  # before: version 1 stored, forever
        await wait_for(lambda: c.registry.get("tenant-c") is not None, what="the reload shared with instance 1")
    finally:
        for gw in gws:
            await gw.shared.stop()
