"""Session 21, review (S21-review-4): a change published by an instance whose master is PENDING overwrites
a HIGHER shared document of the new master, is answered as published, and is lost.

S20-FS1 made ``sync`` leave a record it cannot authenticate while a higher master is pending here (it may be the
new master's), but kept ``publish`` replacing such a record "as forged" (docs/security.md S20-FS1). So on an
instance still waiting for the new master's secret, a policy change (or a registry reload) finds the rotated
instances' higher version unverifiable, replaces it whatever its version (the publish script's ``replaceable``),
and ``_publish_policy`` answers ``published`` (200). The rotated instances read the lower record under the master
in grace, refuse it as lower and re-publish theirs; the pending instance keeps its own version until its secret is
provisioned, then adopts the higher one: the operator's change, answered 200, took effect nowhere but briefly on
that instance, and no conflict was counted or answered (409 is what a lost race answers, SF17-1).

Now ``SharedDocument.publish`` treats a record it cannot authenticate as forged only while
``heal_unauthenticated()`` holds (no master pending here): otherwise the publish script's forward-only rule applies,
so a lower change is not stored and answers False (a policy change 409, a reload the conflict path's error log),
and a higher one still replaces it. Failed before the fix (version 6 stored over 7, answered True).
"""
from __future__ import annotations

import os

import redis.asyncio as aioredis

from gateway.shared_docs import DOCS_MAC_INFO, SharedDocument, state_metrics
from tenancy.keys import KeyRing
from tests.scaleout.s2_instances import PREFIX


async def _noop(version: int, body: object) -> None:
    return None


async def test_a_pending_instance_does_not_overwrite_the_new_masters_higher_document(redis_server) -> None:
    client = aioredis.Redis.from_url(redis_server.url)
    try:
        old = KeyRing(os.urandom(32)).mac_subkeys(DOCS_MAC_INFO)[0]
        new = KeyRing(os.urandom(32)).mac_subkeys(DOCS_MAC_INFO)[0]
        rotated = SharedDocument(client, PREFIX, "policy", lambda: [new, old], lambda: 7, _noop, state_metrics(None))
        pending = SharedDocument(client, PREFIX, "policy", lambda: [old], lambda: 5, _noop, state_metrics(None),
                                 heal_unauthenticated=lambda: False)  # a higher master is pending here
        assert await rotated.publish(7, {"rules": ["seven"]})
        published = await pending.publish(6, {"rules": ["six"]})  # an operator's change on the pending instance
        assert await rotated.remote_version() == 7, "the new master's version 7 was replaced by version 6"
        assert not published  # answered as the race is (409), not 200 for a change that is lost
    finally:
        await client.aclose()


async def test_a_pending_instance_still_publishes_above_an_unauthenticated_record(redis_server) -> None:
    client = aioredis.Redis.from_url(redis_server.url)
    try:
        key = KeyRing(os.urandom(32)).mac_subkeys(DOCS_MAC_INFO)[0]
        pending = SharedDocument(client, PREFIX, "policy", lambda: [key], lambda: 5, _noop, state_metrics(None),
                                 heal_unauthenticated=lambda: False)
        await client.set(pending.key, f"3:{'00' * 32}:{{}}")  # lower and unauthenticated: stored over
        assert await pending.publish(6, {"rules": ["six"]}) and await pending.remote_version() == 6
        healing = SharedDocument(client, PREFIX, "policy", lambda: [key], lambda: 5, _noop, state_metrics(None))
        await client.set(pending.key, f"9:{'00' * 32}:{{}}")  # higher: a forgery for an instance with no master
        assert await healing.publish(7, {"rules": ["seven"]})  # an instance with no master pending replaces it, as before
        assert await pending.remote_version() == 7
    finally:
        await client.aclose()
