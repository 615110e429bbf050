"""Session 21, fixutf8 (S21-fixutf8-1, -2): a shared-state record that is not UTF-8, or whose MAC field is not ASCII.

S21-review-1 made a record whose number field is not ASCII digits unauthenticated (ignored, counted, written
over) instead of raising out of ``_verify``. Two shapes still raised, and stalled every sync and publish over
the record, for as long as it stayed in Redis (whoever can write to Redis, which is trusted for counters only):

* S21-fixutf8-1: a value (or a hash field, or a routing stream field) that is not UTF-8: the readers called
  ``bytes.decode()``, which raised ``UnicodeDecodeError``;
* S21-fixutf8-2: a MAC or key-check field that is UTF-8 but not ASCII: ``hmac.compare_digest`` raises
  ``TypeError`` on such a ``str``.

Every reader of a shared record is covered: the tenant key records and the ``#master`` record of
``keys:tenants`` (sync and publish), the key-check (join), the shared documents (sync and publish), the
routing stream's entries (read), and a whole instance started over all of them at once.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

import httpx
import pytest
import redis.asyncio as aioredis

from gateway.app import build_admin_app
from gateway.shared_docs import DOCS_MAC_INFO, SharedDocument, state_metrics
from gateway.shared_routing import RoutingStream
from routing.index import InProcessPrefixIndex
from routing.load import InProcessLoadTracker
from routing.shared import LoadDelta, RemoteLoadView, SharedLoadTracker
from tenancy.keys import KeyRing, KeyRingError
from tenancy.shared_keys import MASTER_FIELD, SharedKeyState
from tenancy.shared_store import NOT_UTF8, mac_matches, record_number, record_text
from tests.policy.conftest import make_input
from tests.scaleout.s2_instances import ISSUER, OPERATOR, PREFIX, instance, write_secret
from tests.support.waiting import wait_for

MASTER = os.urandom(32)
TIERS = "prefixgate/config/tiers"
MAC_HEX = "00" * 32
#: key records (``<key version>:<salt epoch>:<MAC>``) that are not UTF-8, or whose MAC is not ASCII; the first
#: ones hold numbers the publish script reads (9:9), so only a replace of the stored BYTES writes over them
BAD_KEY_RECORDS = [b"9:9:" + b"\xff" * 64, b"\xff", b"1:0:" + b"\xc3(" * 32, b"9:9:" + b"\xed\xa0\x80" * 21,
                   ("9:9:" + "\u00e9" * 64).encode()]
#: shared documents (``<version>:<MAC>:<JSON>``): the same shapes
BAD_DOCS = [b"9:" + b"\xff" * 64 + b":{}", b"\xff", b"9:" + MAC_HEX.encode() + b':{"a":"\xff"}',
            ("9:" + "\u00e9" * 64 + ":{}").encode()]
KEY_IDS = ["9:9:ff-mac", "ff", "1:0:c3(-mac", "9:9:surrogate-mac", "9:9:non-ascii-mac"]
DOC_IDS = ["9:ff-mac", "ff", "9:ff-in-body", "9:non-ascii-mac"]


def test_record_text_decodes_utf8_and_marks_what_is_not() -> None:
    assert record_text(b"1:0:ab") == "1:0:ab" and record_text("x") == "x"
    assert record_text("\u00e9".encode()) == "\u00e9"
    for raw in (b"\xff", b"9:9:\xff", b"\xed\xa0\x80"):
        text = record_text(raw)
        assert text.startswith(NOT_UTF8) and record_number(text.split(":")[0]) is None
    assert record_text(b"1\xff") != record_text(b"2\xff")  # distinct values stay distinct (logged once each)


def test_mac_matches_refuses_a_non_ascii_field_without_raising() -> None:
    assert mac_matches("ab" * 32, "ab" * 32) and not mac_matches("ab" * 32, "cd" * 32)
    assert not mac_matches("\u00e9" * 64, "ab" * 32)
    assert not mac_matches(record_text(b"\xff" * 64), "ab" * 32)


@pytest.mark.parametrize("bad", BAD_KEY_RECORDS, ids=KEY_IDS)
async def test_a_tenant_record_not_utf8_is_ignored_counted_and_written_over(clients, bad: bytes) -> None:
    a, b = KeyRing(MASTER), KeyRing(MASTER)
    sa, sb = SharedKeyState(clients[0], PREFIX, MASTER, a), SharedKeyState(clients[1], PREFIX, MASTER, b)
    a.rotate_tenant("acme")
    a.rotate_tenant("globex")
    await clients[2].hset(f"{PREFIX}keys:tenants", "acme", bad)
    assert await sa.publish("acme")  # the bad record does not block a rotation's publish: written over
    assert (await clients[2].hget(f"{PREFIX}keys:tenants", "acme")).startswith(b"2:0:")
    assert await sa.publish("globex")
    await clients[2].hset(f"{PREFIX}keys:tenants", "junk", bad)  # a field no instance holds
    await clients[2].hset(f"{PREFIX}keys:tenants", b"\xfe\xff", b"2:0:" + MAC_HEX.encode())  # a field not UTF-8
    assert await sb.sync() == 2  # the other tenants' records are still adopted
    assert b.key_version("acme") == 2 and b.key_version("globex") == 2
    assert sb.rejected == 2  # both bad ones counted as unauthenticated
    await clients[2].hset(f"{PREFIX}keys:tenants", "globex", bad)
    assert await sb.sync() == 0 and sb.rejected == 5  # every sync counts them (the warning names the tenant)
    assert (await clients[2].hget(f"{PREFIX}keys:tenants", "globex")).startswith(b"2:0:")  # healed by the sync


@pytest.mark.parametrize("bad", BAD_KEY_RECORDS[:4] + [("1:0:" + "\u00e9" * 64).encode()],
                         ids=KEY_IDS[:4] + ["1:0:non-ascii-mac"])
async def test_a_master_record_not_utf8_is_written_over_not_pending(clients, bad: bytes) -> None:
    ring = KeyRing(MASTER)
    ring.rotate_tenant("acme")
    shared = SharedKeyState(clients[0], PREFIX, MASTER, ring)
    await clients[2].hset(f"{PREFIX}keys:tenants", MASTER_FIELD, bad)
    assert await shared.sync() == 0
    assert shared.master_pending == 0 and shared.rejected == 1  # no instance wrote it: forged, not a new master
    assert (await clients[2].hget(f"{PREFIX}keys:tenants", MASTER_FIELD)).startswith(b"1:0:")  # healed
    assert (await clients[2].hget(f"{PREFIX}keys:tenants", "acme")).startswith(b"2:0:")  # tenants still shared


async def test_a_higher_master_record_with_a_non_ascii_mac_is_pending_as_any_unauthenticated_one(clients) -> None:
    """A UTF-8 record of a higher generation that no secret here authenticates may be a new master's: pending,
    as with an ASCII MAC (the rule of docs/scale-out.md), not a TypeError out of the sync."""
    shared = SharedKeyState(clients[0], PREFIX, MASTER, KeyRing(MASTER))
    await clients[2].hset(f"{PREFIX}keys:tenants", MASTER_FIELD, BAD_KEY_RECORDS[4])
    assert await shared.sync() == 0
    assert shared.master_pending == 9 and shared.rejected == 1


@pytest.mark.parametrize("bad", [b"\xff" * 64, ("\u00e9" * 64).encode()], ids=["ff", "non-ascii"])
async def test_a_key_check_not_utf8_or_ascii_reads_as_another_value(clients, bad: bytes) -> None:
    ring = KeyRing(MASTER)
    shared = SharedKeyState(clients[0], PREFIX, MASTER, ring)
    await clients[2].set(f"{PREFIX}keys:check", bad)
    with pytest.raises(KeyRingError):  # no #master record vouches for this secret: the join is refused, as for
        await shared.join()  # any other value (before: UnicodeDecodeError / TypeError)
    await clients[2].hset(f"{PREFIX}keys:tenants", MASTER_FIELD, BAD_KEY_RECORDS[0])
    with pytest.raises(KeyRingError):
        await shared.join()
    ring.rotate_master(os.urandom(32))
    await shared.publish_master()  # an authentic #master: the join overwrites the key-check
    await clients[2].set(f"{PREFIX}keys:check", bad)
    await shared.join()
    assert await clients[2].get(f"{PREFIX}keys:check") == shared.key_check().encode()


async def _noop(version: int, body: object) -> None:
    return None


@pytest.mark.parametrize("bad", BAD_DOCS, ids=DOC_IDS)
async def test_a_shared_document_not_utf8_is_ignored_and_written_over(clients, bad: bytes) -> None:
    key = KeyRing(MASTER).mac_subkeys(DOCS_MAC_INFO)[0]
    doc = SharedDocument(clients[0], PREFIX, "policy", key, lambda: 3, _noop, state_metrics(None),
                         local_body=lambda: {"rules": ["a"]})
    await clients[2].set(doc.key, bad)
    assert await doc.remote_version() == 0
    assert not await doc.sync()  # not adopted; healed with this instance's document
    assert doc.rejected == 1
    assert await doc.remote_version() == 3
    await clients[2].set(doc.key, bad)
    assert await doc.publish(4, {"rules": ["b"]})  # a change is not blocked by it
    assert await doc.remote_version() == 4


def _stream(client: aioredis.Redis, instance_id: str) -> RoutingStream:
    loads = SharedLoadTracker(InProcessLoadTracker(), RemoteLoadView(), lambda e: None)
    return RoutingStream(client, "pgs21u:", instance_id, bytes(range(32)), InProcessPrefixIndex(10_000), loads,
                         ["r0"], lease_ttl_s=10, write_interval_s=0, read_interval_s=0, read_block_ms=100)


async def test_a_routing_entry_not_utf8_is_refused_and_the_reader_goes_on(clients) -> None:
    writer, reader = _stream(clients[0], "w" * 16), _stream(clients[1], "r" * 16)
    writer.emit(LoadDelta("r0", 100, 0, 1))
    await writer.flush()
    ((_, fields),) = await clients[2].xrange(writer.stream)
    for name, value in ((b"i", b"\xff" * 16), (b"n", b"1:\xff"), (b"m", b"\xff" * 64), (b"m", "\u00e9".encode() * 64)):
        await clients[2].xadd(writer.stream, {**fields, name: value})
    writer.emit(LoadDelta("r0", 5, 0, 0))
    await writer.flush()
    assert await reader.read_once(None) == 6  # before: raised at the first bad entry, read again for ever
    assert reader.rejected == 4
    assert reader.remote.total("r0") == (105, 0, 1)  # the authentic entries on both sides are applied


async def test_instances_start_serve_and_share_over_records_not_utf8(tmp_path: Path, redis_server, clients) -> None:
    """Every shared record of a prefix not UTF-8 at once: two whole instances start, a key rotation and a policy
    change through one's admin API are answered 200 and reach the other, which decides under the new policy,
    and Redis is healed. Before: ``start()`` raised ``UnicodeDecodeError`` out of the first sync."""
    raw = clients[2]
    await raw.hset(f"{PREFIX}keys:tenants", mapping={"tenant-a": BAD_KEY_RECORDS[0], MASTER_FIELD: b"\xff",
                                                     b"\xff": b"\xff"})
    for name in ("policy", "tenants"):
        await raw.set(f"{PREFIX}docs:{name}", BAD_DOCS[0])
    secret = write_secret(tmp_path / "master.key")
    a, b = instance(tmp_path, 0, redis_server.url, secret), instance(tmp_path, 1, redis_server.url, secret)
    try:
        for gw in (a, b):
            await gw.shared.start()
        assert (await raw.hget(f"{PREFIX}keys:tenants", MASTER_FIELD)).startswith(b"1:0:")
        tiers = a.pdp.store.get_data(TIERS)
        tiers["gold"] = {"max_tokens": 2048}
        token = ISSUER.mint(OPERATOR, "prefixgate-admin")
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=build_admin_app(a)), base_url="http://admin",
                                     headers={"Authorization": f"Bearer {token}"}) as admin:
            assert (await admin.post("/admin/tenants/tenant-a/rotate-key")).status_code == 200
            resp = await admin.put(f"/admin/data/{TIERS}", content=json.dumps(tiers),
                                   headers={"Content-Type": "application/json"})
            assert resp.status_code == 200, resp.text
        await a.shared.settle()
        await wait_for(lambda: b.keyring.key_version("tenant-a") == 2, what="rotation adopted by b")
        await wait_for(lambda: b.pdp.store.version == 1, what="policy version 1 adopted by b")
        assert a.keyring.cache_salt("tenant-a") == b.keyring.cache_salt("tenant-a")
        gold = {"tier": "gold", "models": ["sim-model"], "pools": ["default"]}
        assert (await b.pdp.decide(make_input("tenant-z", entitlements=gold))).max_tokens == 2048
        assert a.shared.keys.rejected >= 1 and b.shared.keys.rejected >= 1
        assert await a.shared.policy.remote_version() == 1
    finally:
        for gw in (a, b):
            await gw.shared.stop()
