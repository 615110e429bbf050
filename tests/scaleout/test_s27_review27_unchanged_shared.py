"""Session 27 review (review27), S26-lead-2 / S27-review27-2: a write that changes nothing on this instance
answered ``unchanged`` (200) from the local set alone, while another instance's change was already stored in the
shared state and not yet adopted here (the Pub/Sub + GET + adopt window, or longer while this instance cannot
adopt the stored version). The instance then adopted the other set: the write was lost, answered 200. Before
session 26 the same write was made as a change, its publish refused, and it answered 409 ``conflict``
(SF17-1, tests/scaleout/test_s17_attack_policy_race.py). Now ``unchanged`` needs the shared state to store the
version in force here with the set in force here; otherwise the write is made as a change, as before.

S27-review27-6 (found in the same read, older than session 26): after b's change lost the race (409), b's next
change, taken before b adopted the stored set, was built on b's losing set, numbered above the stored version and
stored: a's published change was gone on every instance. Now it is refused (409 ``conflict``) until the adoption.

The interleavings are driven with events: instance b's adoption of a's change is held at its entry while b's
operator writes.
"""
from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from policy.store import (ChangeRecord, PolicyBaseUnsharedError, PolicyConflictError, PolicyUnchanged,
                          policy_set_document)
from tests.scaleout.s2_instances import OPERATOR, shared_instances
from tests.support.waiting import wait_for

TIERS = "prefixgate/config/tiers"


@pytest.fixture
async def pair(tmp_path: Path, redis_server):
    async with shared_instances(tmp_path, 2, redis_server.url) as gws:
        yield gws


def _hold_adoption(store: Any) -> tuple[asyncio.Event, asyncio.Event]:
    """Hold ``store.adopt`` at its entry (before it takes the store's lock): ``(entered, release)``."""
    entered, release = asyncio.Event(), asyncio.Event()
    adopt = store.adopt

    async def held(*args: Any, **kwargs: Any) -> Any:
        entered.set()
        await release.wait()
        return await adopt(*args, **kwargs)

    store.adopt = held
    return entered, release


async def test_a_write_of_the_local_set_while_another_change_is_stored_is_not_answered_unchanged(pair) -> None:
    a, b = pair
    entered, release = _hold_adoption(b.pdp.store)
    before = b.pdp.store.get_data(TIERS)
    changed = a.pdp.store.get_data(TIERS)
    changed["gold-x"] = {"max_tokens": 7}
    assert isinstance(await a.pdp.store.put_data(TIERS, changed, OPERATOR), ChangeRecord)  # stored as version 1
    await asyncio.wait_for(entered.wait(), 10.0)  # b has read a's version 1 and is about to adopt it
    assert b.pdp.store.version == 0
    try:
        with pytest.raises(PolicyConflictError) as conflict:  # session 26: PolicyUnchanged, version 0 (200)
            await b.pdp.store.put_data(TIERS, before, OPERATOR)
        assert conflict.value.record.shared == "conflict"
    finally:
        release.set()
    await b.shared.settle()
    await wait_for(lambda: policy_set_document(a.pdp.store.policy_set) == policy_set_document(b.pdp.store.policy_set),
                   timeout_s=6.0, what="both instances hold the stored set")
    assert "gold-x" in b.pdp.store.get_data(TIERS)  # the stored change won, and b's operator was told so (409)


async def test_a_write_of_the_set_stored_everywhere_is_still_unchanged(pair) -> None:
    a, b = pair
    changed = a.pdp.store.get_data(TIERS)
    changed["gold-y"] = {"max_tokens": 9}
    await a.pdp.store.put_data(TIERS, changed, OPERATOR)
    await wait_for(lambda: b.pdp.store.version == 1, what="b adopts a's version 1")
    same = await b.pdp.store.put_data(TIERS, changed, OPERATOR)
    assert isinstance(same, PolicyUnchanged) and same.version == 1
    again = await a.pdp.store.put_data(TIERS, changed, OPERATOR)
    assert isinstance(again, PolicyUnchanged) and again.version == 1
    assert (a.pdp.store.version, b.pdp.store.version) == (1, 1)


async def test_a_change_after_a_conflict_is_not_built_on_the_losing_set(pair) -> None:
    """S27-review27-6: b's change loses the race to a's (409 ``conflict``); b's next change, taken before b adopts
    a's set (queued on the store's lock while the first published), was built on b's losing set, numbered above
    the stored version and stored: a's change, answered 200 ``published``, was gone on every instance, and b's
    first change, answered 409, was in force everywhere."""
    a, b = pair
    entered, release = _hold_adoption(b.pdp.store)
    ta = a.pdp.store.get_data(TIERS)
    ta["t-a"] = {"max_tokens": 111}
    assert (await a.pdp.store.put_data(TIERS, ta, OPERATOR)).shared == "published"  # stored as version 1
    await asyncio.wait_for(entered.wait(), 10.0)  # b is about to adopt a's version 1: held
    tb = b.pdp.store.get_data(TIERS)
    tb["t-b1"] = {"max_tokens": 5}
    with pytest.raises(PolicyConflictError):  # b's version 1 is not stored: 409
        await b.pdp.store.put_data(TIERS, tb, OPERATOR)
    tb2 = b.pdp.store.get_data(TIERS)
    tb2["t-b2"] = {"max_tokens": 6}
    try:
        with pytest.raises(PolicyBaseUnsharedError) as refused:  # before: version 2 built on b's losing set, 200
            await b.pdp.store.put_data(TIERS, tb2, OPERATOR)
        assert (refused.value.status, refused.value.code) == (409, "conflict") and b.pdp.store.version == 1
    finally:
        release.set()
    await b.shared.settle()
    await wait_for(lambda: policy_set_document(a.pdp.store.policy_set) == policy_set_document(b.pdp.store.policy_set),
                   timeout_s=6.0, what="both instances hold the stored set")
    final = a.pdp.store.get_data(TIERS)
    assert "t-a" in final and "t-b1" not in final  # a's published change stays; b's refused one is not in force
