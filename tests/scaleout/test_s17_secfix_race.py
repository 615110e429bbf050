"""Session 17, helper secfix (S17-1): after two policy changes raced to one version, the instances converge
on the stored set and stay there (no adoption loop), and the stored record is the one adopted everywhere."""
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


async def test_a_raced_change_converges_on_the_first_stored_and_stays(pair) -> None:
    a, b = pair
    ta = a.pdp.store.get_data(TIERS)
    ta["gold"] = {"max_tokens": 7}
    tb = b.pdp.store.get_data(TIERS)
    tb["bronze-x"] = {"max_tokens": 5}
    await a.pdp.store.put_data(TIERS, ta, OPERATOR)
    await a.shared.settle()  # a's record is stored first
    with pytest.raises(PolicyConflictError):  # session 18 (SF17-1): refused inside the request (409)
        await b.pdp.store.put_data(TIERS, tb, OPERATOR)
    await b.shared.settle()  # b's is refused: b adopts a's as its version 2 and publishes it
    await wait_for(lambda: a.pdp.store.version == b.pdp.store.version == 2, timeout_s=6.0,
                   what="both at version 2")
    assert policy_set_document(a.pdp.store.policy_set) == policy_set_document(b.pdp.store.policy_set)
    assert a.pdp.store.get_data(TIERS)["gold"] == {"max_tokens": 7}
    assert "bronze-x" not in b.pdp.store.get_data(TIERS)
    gold = make_input("tenant-z", entitlements={"tier": "gold", "models": ["sim-model"], "pools": ["default"]})
    assert (await b.pdp.decide(gold)).max_tokens == 7  # b's engine decides with it
    # settled: no instance adopts again
    assert not await a.shared.policy.sync()
    assert not await b.shared.policy.sync()
    assert a.pdp.store.version == b.pdp.store.version == 2
