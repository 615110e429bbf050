"""Session 20, fixshared: what a shared document's publish may replace (S20-R2) and the floor below
which a document is never adopted (S20-R1), on ``SharedDocument`` against a real redis-server.

S20-R2: a stored record is "forged" only when it fails EVERY accepted subkey; one MAC'd under a master
still in grace is authentic, replaced from above, or at its own version by the same body (the re-MAC of
``sync``, tests/scaleout/test_s3_master_generation.py), never by a lower version, and another body at
its version is the race answered 409 (SF17-1), adopted by ``sync`` rather than overwritten.
S20-R1: ``floor()`` (the registry's persisted highest version seen) refuses, counts once and logs a
lower record even while the instance holds version 0 (just started), and adopts one at the floor.
"""
from __future__ import annotations

import os
from typing import Any

import redis.asyncio as aioredis
from prometheus_client import CollectorRegistry

from gateway.shared_docs import DOCS_MAC_INFO, SharedDocument, state_metrics
from tenancy.keys import KeyRing
from tests.scaleout.s2_instances import PREFIX


async def _noop(version: int, body: object) -> None:
    return None


def _keys() -> tuple[bytes, bytes]:
    return KeyRing(os.urandom(32)).mac_subkeys(DOCS_MAC_INFO)[0], KeyRing(os.urandom(32)).mac_subkeys(DOCS_MAC_INFO)[0]


async def test_a_lower_record_under_a_master_in_grace_is_replaced_from_above(redis_server) -> None:
    raw = aioredis.Redis.from_url(redis_server.url)
    try:
        m1, m2 = _keys()
        lagging = SharedDocument(raw, PREFIX, "policy", lambda: [m1], lambda: 0, _noop, state_metrics(None))
        rotated = SharedDocument(raw, PREFIX, "policy", lambda: [m2, m1], lambda: 0, _noop, state_metrics(None))
        only_new = SharedDocument(raw, PREFIX, "policy", lambda: [m2], lambda: 0, _noop, state_metrics(None))
        assert await lagging.publish(4, {"rules": ["b"]})
        assert not await rotated.publish(3, {"rules": ["a"]})  # lower than the authentic 4: refused
        assert await only_new.remote_version() == 0  # still the M1 record
        assert await rotated.publish(5, {"rules": ["a"]})  # above it: stored, under the current master
        assert await only_new.remote_version() == 5
    finally:
        await raw.aclose()


async def test_another_body_at_the_same_version_under_a_master_in_grace_is_a_conflict_adopted(redis_server) -> None:
    raw = aioredis.Redis.from_url(redis_server.url)
    try:
        m1, m2 = _keys()
        reg = CollectorRegistry()
        metrics = state_metrics(reg)
        held: dict[str, Any] = {"version": 6, "body": {"rules": ["a"]}}

        async def apply(version: int, body: Any) -> None:
            held.update(version=version, body=body)

        lagging = SharedDocument(raw, PREFIX, "policy", lambda: [m1], lambda: 0, _noop, state_metrics(None))
        rotated = SharedDocument(raw, PREFIX, "policy", lambda: [m2, m1], lambda: held["version"], apply, metrics,
                                 local_body=lambda: held["body"])
        assert await lagging.publish(6, {"rules": ["b"]})  # stored first
        assert not await rotated.publish(6, {"rules": ["a"]})  # the race at one version: 409, not replaced
        assert await rotated.sync()  # the stored one wins (S17-1), counted as a conflict, not healed over
        assert held == {"version": 6, "body": {"rules": ["b"]}}
        assert reg.get_sample_value("prefixgate_shared_state_rejected_records_total",
                                    {"kind": "policy", "reason": "conflict"}) == 1
        assert await rotated.sync() is False  # now the same body: re-MAC'd under the current master
        only_new = SharedDocument(raw, PREFIX, "policy", lambda: [m2], lambda: 0, _noop, state_metrics(None))
        assert await only_new.remote_version() == 6 and rotated.rejected == 0
    finally:
        await raw.aclose()


async def test_a_record_failing_every_accepted_subkey_is_still_replaced_whatever_its_version(redis_server) -> None:
    raw = aioredis.Redis.from_url(redis_server.url)
    try:
        m1, m2 = _keys()
        forger = SharedDocument(raw, PREFIX, "policy", lambda: [os.urandom(32)], lambda: 0, _noop,
                                state_metrics(None))
        doc = SharedDocument(raw, PREFIX, "policy", lambda: [m2, m1], lambda: 0, _noop, state_metrics(None))
        assert await forger.publish(99, {"rules": ["x"]})
        assert await doc.remote_version() == 0  # not authentic here
        assert await doc.publish(1, {"rules": ["a"]})  # tampering cannot block a change
        assert await doc.remote_version() == 1
    finally:
        await raw.aclose()


async def test_a_record_below_the_floor_is_refused_counted_once_and_one_at_the_floor_adopted(redis_server) -> None:
    raw = aioredis.Redis.from_url(redis_server.url)
    try:
        m1, _ = _keys()
        adopted: list[int] = []
        held = [0]

        async def apply(version: int, body: Any) -> None:
            adopted.append(version)
            held[0] = version

        writer = SharedDocument(raw, PREFIX, "tenants", lambda: [m1], lambda: 0, _noop, state_metrics(None))
        reg = CollectorRegistry()
        started = SharedDocument(raw, PREFIX, "tenants", lambda: [m1], lambda: held[0], apply, state_metrics(reg),
                                 floor=lambda: 5)
        assert await writer.publish(4, {"tenants": []})  # an older, authentic record put back
        assert await started.sync() is False and await started.sync() is False
        assert adopted == [] and started.rejected == 1  # counted once, not at every poll
        assert reg.get_sample_value("prefixgate_shared_state_rejected_records_total",
                                    {"kind": "tenants", "reason": "lower"}) == 1
        await raw.delete(started.key)
        assert await writer.publish(5, {"tenants": [{"id": "t"}]})  # the highest version seen: adopted
        assert await started.sync() and adopted == [5]
        assert await writer.publish(6, {"tenants": []})
        assert await started.sync() and adopted == [5, 6]
    finally:
        await raw.aclose()
