"""Session 17, helper secfix: the failure paths of a policy change's staged write (S17-5, policy/store_disk.py).

A change whose files cannot be renamed after the target took it is rolled back on the target (the
store's set is what decides again) and on the active directory; a change the target refuses leaves no
staged file and no version directory behind; a delete of something missing is refused under the lock.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest

import policy.store_disk
from policy.embedded import EmbeddedOpa
from policy.store import PolicyNotFoundError, PolicyStore, PolicyTargetError

TIERS = "prefixgate/config/tiers"


def _leftovers(root: Path) -> list[Path]:
    return [p for p in root.rglob(".*.tmp")]


async def test_a_failed_rename_reapplies_the_stored_set(active: Path, tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    opa = EmbeddedOpa(active, timeout_s=5.0)
    try:
        store = PolicyStore(active, tmp_path / "versions", target=opa)
        before = json.loads((active / "data" / f"{TIERS}.json").read_text("utf-8"))
        real_commit = policy.store_disk.StagedFiles.commit
        calls = []

        def failing_once(self: policy.store_disk.StagedFiles) -> None:
            calls.append(1)
            if len(calls) == 1:
                raise OSError("disk full")
            real_commit(self)

        monkeypatch.setattr(policy.store_disk.StagedFiles, "commit", failing_once)
        tiers = store.get_data(TIERS)
        tiers["standard"] = {"max_tokens": 7}
        records: list = []
        store.add_change_listener(records.append)
        with pytest.raises(OSError):
            await store.put_data(TIERS, tiers, "ops")
        assert records == [] and store.version == 0
        assert opa.policy_set.data_docs[TIERS]["standard"] == {"max_tokens": 1024}
        assert json.loads((active / "data" / f"{TIERS}.json").read_text("utf-8")) == before
        assert not (tmp_path / "versions" / "00000001").exists()
        assert _leftovers(tmp_path) == []
        # the next change takes the free version number and is in force
        rec = await store.put_data(TIERS, tiers, "ops")
        assert rec.version == 1 and opa.policy_set.data_docs[TIERS]["standard"] == {"max_tokens": 7}
    finally:
        opa.close()


class _Refusing:
    async def apply(self, change: object, policy_set: object) -> None:
        raise PolicyTargetError("refused")


async def test_a_refused_change_leaves_no_staged_file(active: Path, tmp_path: Path) -> None:
    store = PolicyStore(active, tmp_path / "versions", target=_Refusing())
    with pytest.raises(PolicyTargetError):
        await store.put_policy("extra_a.rego", "package extra.a\n\nx := 1\n", "ops")
    assert not (active / "extra_a.rego").exists()
    # only version 0, the start set a roll-back can put back (session 24): no version 1, nothing staged
    assert [p.name for p in (tmp_path / "versions").iterdir()] == ["00000000"]
    assert _leftovers(tmp_path) == []
    assert store.history() == [] and store.version == 0


async def test_delete_of_a_missing_module_is_refused(active: Path, tmp_path: Path) -> None:
    store = PolicyStore(active, tmp_path / "versions")
    with pytest.raises(PolicyNotFoundError):
        await store.delete_policy("nope.rego", "ops")
    with pytest.raises(PolicyNotFoundError):
        await store.delete_data("a/b", "ops")
