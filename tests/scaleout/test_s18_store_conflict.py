"""Session 18, helper store: SF17-1. Two instances change the policy at the same version: the change
stored second is refused inside its admin request (PolicyConflictError -> 409 ``conflict``) instead of
answering 200 and being dropped later; its record (audit) says ``shared: conflict``, the winner's
``published``, and both instances converge on the stored set (gateway/shared_state.py)."""
from __future__ import annotations

from pathlib import Path

import pytest

from policy.store import PolicyConflictError, policy_set_document
from tests.scaleout.s2_instances import OPERATOR, shared_instances
from tests.support.waiting import wait_for

TIERS = "prefixgate/config/tiers"


@pytest.fixture
async def pair(tmp_path: Path, redis_server):
    async with shared_instances(tmp_path, 2, redis_server.url) as gws:
        yield gws


async def test_the_change_stored_second_is_refused_in_its_request(pair) -> None:
    a, b = pair
    seen_a: list = []
    seen_b: list = []
    a.pdp.store.add_change_listener(seen_a.append)
    b.pdp.store.add_change_listener(seen_b.append)
    ta = a.pdp.store.get_data(TIERS)
    ta["gold"] = {"max_tokens": 7}
    tb = b.pdp.store.get_data(TIERS)
    tb["bronze-x"] = {"max_tokens": 5}
    won = await a.pdp.store.put_data(TIERS, ta, OPERATOR)
    assert won.version == 1 and won.shared == "published"
    with pytest.raises(PolicyConflictError) as lost:  # b has not adopted a's version 1 yet
        await b.pdp.store.put_data(TIERS, tb, OPERATOR)
    assert lost.value.record.version == 1 and lost.value.record.shared == "conflict"
    assert [r.shared for r in seen_a] == ["published"] and [r.shared for r in seen_b] == ["conflict"]
    await wait_for(lambda: b.pdp.store.get_data(TIERS).get("gold") == {"max_tokens": 7}, timeout_s=6.0,
                   what="b adopts the stored set")
    await a.shared.settle()
    await b.shared.settle()
    await wait_for(lambda: policy_set_document(a.pdp.store.policy_set) == policy_set_document(b.pdp.store.policy_set),
                   timeout_s=6.0, what="one policy set")
    assert "bronze-x" not in a.pdp.store.get_data(TIERS)
    # the operator retries on b: now on top of the adopted set, stored, and reaching a
    tb = b.pdp.store.get_data(TIERS)
    tb["bronze-x"] = {"max_tokens": 5}
    again = await b.pdp.store.put_data(TIERS, tb, OPERATOR)
    assert again.shared == "published"
    await wait_for(lambda: a.pdp.store.get_data(TIERS).get("bronze-x") == {"max_tokens": 5}, timeout_s=6.0,
                   what="a adopts the retried change")
