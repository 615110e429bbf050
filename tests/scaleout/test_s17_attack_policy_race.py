"""Session 17, helper attack: two operators change the policy on two instances sharing one Redis
(``state.backend: redis``) before either has heard of the other's change (S17-1).

Each instance numbers its change ``store.version + 1`` from its own version (gateway/shared_state.py
publishes ``rec.version``; policy/store.py); both answer 200; the forward-only publish script stores
one of the two records and the other instance logs "was not stored". The loser then holds a
*different* policy set at the *same* version as the stored record, so ``SharedDocument.sync``
(gateway/shared_docs.py: ``version == local``: nothing to adopt) never converges: the two
instances decide the same request with different policies until the next change.
"""
from __future__ import annotations

from pathlib import Path

import pytest

from policy.store import PolicyConflictError, policy_set_document
from tests.policy.conftest import make_input
from tests.scaleout.s2_instances import OPERATOR, shared_instances
from tests.support.waiting import wait_for

TIERS = "prefixgate/config/tiers"


@pytest.fixture
async def pair(tmp_path: Path, redis_server):
    async with shared_instances(tmp_path, 2, redis_server.url) as gws:
        yield gws


def _doc(gw) -> dict:
    return policy_set_document(gw.pdp.store.policy_set)


async def test_sequential_changes_on_two_instances_converge(pair) -> None:
    """What holds: a change made after the other instance's change was adopted reaches both."""
    a, b = pair
    tiers = a.pdp.store.get_data(TIERS)
    tiers["t-a"] = {"max_tokens": 111}
    await a.pdp.store.put_data(TIERS, tiers, OPERATOR)
    await a.shared.settle()
    await wait_for(lambda: b.pdp.store.version == 1, what="b adopts a's version 1")
    tiers = b.pdp.store.get_data(TIERS)
    tiers["t-b"] = {"max_tokens": 222}
    await b.pdp.store.put_data(TIERS, tiers, OPERATOR)
    await b.shared.settle()
    await wait_for(lambda: a.pdp.store.version == 2, what="a adopts b's version 2")
    assert _doc(a) == _doc(b)


async def test_changes_racing_on_two_instances_converge(pair) -> None:
    a, b = pair
    gold = {"tier": "gold", "models": ["sim-model"], "pools": ["default"]}
    doc = make_input("tenant-z", entitlements=gold)
    # operator 1 on instance a lowers gold's cap; operator 2 on instance b adds an unrelated tier.
    # Neither instance has heard of the other's change (both are at version 0): the window is the
    # Pub/Sub + GET + adopt latency, or any Redis outage on either side.
    ta = a.pdp.store.get_data(TIERS)
    ta["gold"] = {"max_tokens": 7}
    tb = b.pdp.store.get_data(TIERS)
    tb["bronze-x"] = {"max_tokens": 5}
    ra = await a.pdp.store.put_data(TIERS, ta, OPERATOR)  # what PUT /admin/data/... calls
    with pytest.raises(PolicyConflictError) as lost:  # session 18 (SF17-1): the loser answers 409, not 200
        await b.pdp.store.put_data(TIERS, tb, OPERATOR)
    rb = lost.value.record
    assert ra.version == rb.version == 1
    await a.shared.settle()
    await b.shared.settle()
    # every instance must end up on one policy set (several poll periods of 1 s)
    await wait_for(lambda: _doc(a) == _doc(b), timeout_s=6.0, what="both instances hold one policy set")
    da, db = await a.pdp.decide(doc), await b.pdp.decide(doc)
    assert (da.allow, da.max_tokens) == (db.allow, db.max_tokens)
