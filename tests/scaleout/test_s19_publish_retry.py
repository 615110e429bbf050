"""Session 19: a shared document's publish is idempotent for the very same record.

CI under load (session 19, tests/scaleout/test_s17_attack_policy_race.py) answered a FIRST policy change
409 ``conflict``: the publish script ran, its reply missed the 0.5 s command timeout, and redis-py's one
retry (tenancy/shared_store.py ``Retry(NoBackoff(), 1)``) found version 1 stored, by itself. The script now
answers 1 when the stored record is the one it would store, and publishes nothing the second time.
"""
from __future__ import annotations

import os

import redis.asyncio as aioredis

from gateway.shared_docs import DOCS_MAC_INFO, SharedDocument, state_metrics
from tenancy.keys import KeyRing
from tests.scaleout.s2_instances import PREFIX


async def _noop(version: int, body: object) -> None:
    return None


async def test_the_same_record_published_twice_is_stored_once_and_not_a_conflict(redis_server) -> None:
    raw = aioredis.Redis.from_url(redis_server.url)
    sub = raw.pubsub()
    try:
        ring = KeyRing(os.urandom(32))
        doc = SharedDocument(raw, PREFIX, "policy", lambda: ring.mac_subkeys(DOCS_MAC_INFO), lambda: 0, _noop,
                             state_metrics(None))
        await sub.subscribe(doc.channel)
        await sub.get_message(timeout=1.0)  # the subscribe confirmation
        assert await doc.publish(1, {"rules": ["a"]})
        assert await doc.publish(1, {"rules": ["a"]})  # the retry of the same script: stored, not a conflict
        assert not await doc.publish(1, {"rules": ["b"]})  # another body at that version: a conflict
        assert await doc.remote_version() == 1
        notes = []
        while (msg := await sub.get_message(ignore_subscribe_messages=True, timeout=0.5)) is not None:
            notes.append(msg)
        assert len(notes) == 1  # one change announced once
    finally:
        await sub.aclose()
        await raw.aclose()
