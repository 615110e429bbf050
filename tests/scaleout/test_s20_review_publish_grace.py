"""Session 20 review, S20-R2: a publish replaces a HIGHER, authentic record that is MAC'd under a master
still in grace, as if it were forged.

``SharedDocument.publish`` (gateway/shared_docs.py) passes the stored value as ``forged`` when it does not
verify under the CURRENT subkey only (``_verify(cur, current_only=True)``), and the Lua script then stores
the new record whatever the stored version. During a master rotation an instance that has rotated (current
M2, M1 in grace) and one that has not (current M1) both hold authentic keys for the M1 record; ``sync`` and
``remote_version`` accept it (every subkey), but ``publish`` overwrites it: a change published at version 5
replaces the other instance's version 6, answered "published" (200) although a higher version was stored,
and the lower record is then stored. A version must only move forward (module docstring: "Versions only
move forward"); a record that verifies under any accepted subkey is not forged.
"""
from __future__ import annotations

import os

import redis.asyncio as aioredis

from gateway.shared_docs import DOCS_MAC_INFO, SharedDocument, state_metrics
from tenancy.keys import KeyRing
from tests.scaleout.s2_instances import PREFIX


async def _noop(version: int, body: object) -> None:
    return None


async def test_a_higher_record_under_a_master_in_grace_is_not_overwritten_by_a_lower_version(redis_server) -> None:
    raw = aioredis.Redis.from_url(redis_server.url)
    try:
        old, new = KeyRing(os.urandom(32)), KeyRing(os.urandom(32))
        m1 = old.mac_subkeys(DOCS_MAC_INFO)[0]
        m2 = new.mac_subkeys(DOCS_MAC_INFO)[0]
        lagging = SharedDocument(raw, PREFIX, "policy", lambda: [m1], lambda: 0, _noop, state_metrics(None))
        rotated = SharedDocument(raw, PREFIX, "policy", lambda: [m2, m1], lambda: 0, _noop, state_metrics(None))
        assert await lagging.publish(6, {"rules": ["b"]})  # the instance that has not rotated yet: version 6
        assert await rotated.remote_version() == 6  # authentic to the rotated instance too (M1 in grace)
        stored = await rotated.publish(5, {"rules": ["a"]})  # a change made there before it adopted version 6
        assert await rotated.remote_version() == 6, "version 6 was replaced by version 5"
        assert not stored, "a lower version was answered as stored"
    finally:
        await raw.aclose()
