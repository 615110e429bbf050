"""S24-newcomer-4 (session 25 fixops): a decision carries the policy store's version of the set that
evaluated it (``Decision.policy_version``, audited as ``policy.version``), read with the engine in one
step: an upload relabels it, a change whose commit fails and is given back carries the committed version
again, and a cached decision keeps its own. A remote OPA's decisions carry none (its set can change
outside the gateway)."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import policy.store_disk
from policy.decision import decision_from_result
from policy.embedded import EmbeddedOpa
from policy.store import PolicyStore

TIERS = "prefixgate/config/tiers"


async def test_decisions_carry_the_version_in_force_after_each_change(active: Path, tmp_path: Path, mk: Any) -> None:
    opa = EmbeddedOpa(active, timeout_s=5.0)
    try:
        store = PolicyStore(active, tmp_path / "versions", target=opa)
        assert (await opa.decide(mk("tenant-a"))).policy_version is None  # not labelled: no versioned store yet
        opa.policy_version = store.version  # what gateway.pep.build_decision_point does
        assert (await opa.decide(mk("tenant-a"))).policy_version == 0
        tiers = store.get_data(TIERS)
        tiers["standard"] = {"max_tokens": 8}
        await store.put_data(TIERS, tiers, "ops")
        got = await opa.decide(mk("tenant-a"))
        assert (got.policy_version, got.max_tokens) == (1, 8)
        assert got.as_cached().policy_version == 1
        await store.put_policy("extra.rego", "package prefixgate.extra\n\nx := 1\n", "ops")
        assert (await opa.decide(mk("tenant-a"))).policy_version == 2
    finally:
        opa.close()


async def test_a_change_given_back_after_a_failed_commit_carries_the_committed_version(
        active: Path, tmp_path: Path, mk: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    opa = EmbeddedOpa(active, timeout_s=5.0)
    try:
        store = PolicyStore(active, tmp_path / "versions", target=opa)
        opa.policy_version = store.version

        def failing(self: policy.store_disk.StagedFiles) -> None:
            raise OSError("disk full")

        monkeypatch.setattr(policy.store_disk.StagedFiles, "commit", failing)
        tiers = store.get_data(TIERS)
        tiers["standard"] = {"max_tokens": 7}
        with pytest.raises(OSError):
            await store.put_data(TIERS, tiers, "ops")
        got = await opa.decide(mk("tenant-a"))
        assert store.version == 0 and got.max_tokens != 7  # the committed set is back in force
        assert got.policy_version == 0  # and labelled as such, not as the version that failed
    finally:
        opa.close()


def test_a_decision_without_a_version_has_none() -> None:
    doc = {"allow": True, "reason_code": "ok", "reason": "r"}
    assert decision_from_result(doc, "d").policy_version is None  # the remote OPA's path
    assert decision_from_result(doc, "d", 4).policy_version == 4
    assert decision_from_result({"allow": False, "reason_code": "no", "reason": "r"}, "d", 4).policy_version == 4
    assert decision_from_result(None, "d", 4).policy_version == 4


async def test_a_swap_during_an_offloaded_evaluation_leaves_the_version_unknown(
        active: Path, mk: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    opa = EmbeddedOpa(active, timeout_s=5.0, offload=True)
    try:
        opa.policy_version = 3
        assert (await opa.decide(mk("tenant-a"))).policy_version == 3
        real = EmbeddedOpa.evaluate

        def swapping(self: EmbeddedOpa, input: dict[str, Any]) -> Any:
            got = real(self, input)
            self._swap(self._build(self.policy_set), self.policy_set, 4)  # a change lands meanwhile
            return got

        monkeypatch.setattr(EmbeddedOpa, "evaluate", swapping)
        assert (await opa.decide(mk("tenant-a"))).policy_version is None  # neither 3 nor 4: not known
        monkeypatch.setattr(EmbeddedOpa, "evaluate", real)
        assert (await opa.decide(mk("tenant-a"))).policy_version == 4
    finally:
        opa.close()
