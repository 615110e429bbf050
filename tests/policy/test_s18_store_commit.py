"""Session 18, helper store: R17-3. A policy change that fails at ANY step of its write (the journal, a
staged file, a rename of the active file or of the version directory, the commit) leaves the store
usable and the disk, the target and the audit consistent (policy/store_disk.py ChangeFiles); a roll-back
that fails too says whether the target may still hold the change and is finished before the next one."""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

import policy.store_disk
from policy.embedded import EmbeddedOpa
from policy.loader import JOURNAL, load_policy_dir
from policy.store import PolicyPersistError, PolicyStore, PolicyTargetError

TIERS = "prefixgate/config/tiers"
EXTRA = "package extra.a\n\nx := 1\n"


def _fail_nth(monkeypatch: pytest.MonkeyPatch, n: int, *, times: int = 1) -> list[str]:
    """Make the ``n``-th rename of policy/store_disk.py (os.rename or os.replace) and the ``times - 1``
    after it fail with EIO; returns the list of renamed destinations."""
    calls: list[str] = []

    def wrap(real: Any) -> Any:
        def renamed(src: Any, dst: Any) -> None:
            calls.append(str(dst))
            if n <= len(calls) < n + times:
                raise OSError(5, "Input/output error")
            real(src, dst)
        return renamed

    monkeypatch.setattr(policy.store_disk.os, "rename", wrap(os.rename))
    monkeypatch.setattr(policy.store_disk.os, "replace", wrap(os.replace))
    return calls


def _consistent(store: PolicyStore, opa: EmbeddedOpa, root: Path) -> None:
    """Engine, store, disk (active files as loaded, versions) agree; nothing staged is left."""
    assert opa.policy_set == store.policy_set == load_policy_dir(store.active_dir)
    assert [r.version for r in store.history()] == list(range(1, store.version + 1))
    assert not (store.active_dir / JOURNAL).exists()
    left = [p.name for p in root.rglob("*") if p.name.startswith((".staged-", JOURNAL)) or p.name.endswith(".tmp")]
    assert left == []


@pytest.mark.parametrize("step", [1, 2, 3, 4], ids=["journal", "active-file", "version-dir", "commit"])
async def test_a_write_failing_at_any_step_leaves_the_store_usable(
        active: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, step: int) -> None:
    opa = EmbeddedOpa(active, timeout_s=5.0)
    try:
        store = PolicyStore(active, tmp_path / "versions", target=opa)
        audit: list[Any] = []
        store.add_change_listener(audit.append)
        before = store.policy_set
        tiers = store.get_data(TIERS)
        tiers["standard"] = {"max_tokens": 7}
        calls = _fail_nth(monkeypatch, step)
        with pytest.raises(OSError) as err:
            await store.put_data(TIERS, tiers, "ops")
        if step > 1:  # applied to the engine, then rolled back
            assert isinstance(err.value, PolicyPersistError)
            assert not err.value.target_may_hold_change and err.value.disk_restored
        assert len(calls) >= step
        monkeypatch.undo()
        assert audit == [] and store.version == 0 and store.policy_set == before
        assert not (tmp_path / "versions" / "00000001").exists()
        _consistent(store, opa, tmp_path)
        # R17-3: the next changes take the free number (they were refused with FileExistsError)
        rec = await store.put_data(TIERS, tiers, "ops")
        rec2 = await store.put_policy("extra_a.rego", EXTRA, "ops")
        assert (rec.version, rec2.version) == (1, 2) and audit == [rec, rec2]
        assert opa.policy_set.data_docs[TIERS]["standard"] == {"max_tokens": 7}
        _consistent(store, opa, tmp_path)
    finally:
        opa.close()


async def test_a_failed_roll_back_of_the_disk_is_finished_before_the_next_change(
        active: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    opa = EmbeddedOpa(active, timeout_s=5.0)
    try:
        store = PolicyStore(active, tmp_path / "versions", target=opa)
        before = store.policy_set
        _fail_nth(monkeypatch, 3, times=1000)  # the version directory's rename, then every rename: disk gone
        with pytest.raises(PolicyPersistError) as err:
            await store.put_policy("extra_a.rego", EXTRA, "ops")
        assert err.value.disk_restored is False and not err.value.target_may_hold_change
        assert "next change" in str(err.value)
        # the journal stays: every reader (and a restart) sees the committed set
        assert (active / JOURNAL).exists()
        assert load_policy_dir(active) == before == store.policy_set == opa.policy_set
        with pytest.raises(OSError):  # still broken: refused, nothing applied
            await store.put_policy("extra_b.rego", EXTRA.replace("extra.a", "extra.b"), "ops")
        assert opa.policy_set == before
        monkeypatch.undo()  # the disk works again: the next change finishes the roll-back first
        rec = await store.put_policy("extra_b.rego", EXTRA.replace("extra.a", "extra.b"), "ops")
        assert rec.version == 1 and not (active / "extra_a.rego").exists()
        assert set(store.policy_set.modules) == set(before.modules) | {"extra_b.rego"}
        _consistent(store, opa, tmp_path)
    finally:
        opa.close()


class _Target:
    """A target that records what it is given and can fail its next applies."""

    def __init__(self) -> None:
        self.applied: list[tuple[str, str, Any]] = []
        self.fail = 0

    async def apply(self, change: Any, policy_set: Any) -> None:
        if self.fail and self.applied:  # the first apply (the change) works, the undo fails
            self.fail -= 1
            raise PolicyTargetError("remote OPA refused the change: ConnectError")
        self.applied.append((change.op, change.target, policy_set))


async def test_a_target_that_cannot_take_the_undo_is_reported_and_repaired_first(
        active: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    target = _Target()
    store = PolicyStore(active, tmp_path / "versions", target=target)
    before = store.policy_set
    target.fail = 2
    _fail_nth(monkeypatch, 3)
    with pytest.raises(PolicyPersistError) as err:
        await store.put_policy("extra_a.rego", EXTRA, "ops")
    monkeypatch.undo()
    assert err.value.target_may_hold_change and err.value.disk_restored
    assert "may still hold version 1" in str(err.value)
    assert target.applied == [("put", "extra_a.rego", store.policy_set.with_module("extra_a.rego", EXTRA))]
    with pytest.raises(PolicyTargetError):  # the undo is retried first, and still refused: nothing else
        await store.put_data(TIERS, store.get_data(TIERS), "ops")
    assert len(target.applied) == 1 and store.version == 0
    tiers = store.get_data(TIERS)  # a real change (session 26: the document in force again commits nothing)
    tiers["standard"] = {**tiers["standard"], "max_tokens": 8}
    rec = await store.put_data(TIERS, tiers, "ops")
    assert [a[:2] for a in target.applied] == [("put", "extra_a.rego"), ("delete", "extra_a.rego"), ("put", TIERS)]
    assert target.applied[1][2] == before and rec.version == 1
    assert json.loads((tmp_path / "versions" / "00000001" / "record.json").read_text())["target"] == TIERS


def test_the_admin_api_answers_a_rolled_back_change_with_its_own_code(
        active: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from starlette.applications import Starlette
    from starlette.testclient import TestClient

    from policy.admin import admin_routes

    async def operator(request: Any) -> dict[str, Any]:
        return {"id": "ops"}

    store = PolicyStore(active, tmp_path / "versions")
    client = TestClient(Starlette(routes=admin_routes(store, operator)))
    _fail_nth(monkeypatch, 3)
    r = client.put("/admin/policies/extra_a.rego", content=EXTRA.encode(), headers={"content-type": "text/plain"})
    monkeypatch.undo()
    err = r.json()["error"]
    assert r.status_code == 500 and err["code"] == "policy_not_persisted"
    assert err["target_may_hold_change"] is False and "could not be written" in err["message"]
    assert client.put("/admin/policies/extra_a.rego", content=EXTRA.encode()).json()["result"]["version"] == 1
