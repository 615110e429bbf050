"""Session 20, helper fixreg (S19-R10): after a crash mid-change, the change a remote OPA may hold is given
back when the store starts, not at the next change.

The process dies after the push reached OPA and before the change was committed (an active file renamed
in place: tests/policy/test_s18_fixstore.py's crash). The next start restores the journal (the committed set
on disk) and ``hold()``s the change; until session 20 only the NEXT change gave OPA the committed state back,
so with no next change OPA decided with a module on no disk, in no history, in no audit record. Now
``PolicyStore.start`` (run by ``gateway.pep.DecisionPoint.start`` once the remote client is up) gives it back.
"""
from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from gateway.config_policy import PolicyConfig
from gateway.pep import build_decision_point
from policy.loader import JOURNAL
from policy.remote import RemoteOpa
from policy.store import PolicyStore, RemoteOpaTarget
from tests.policy.test_s18_fixstore import Crash, _crash_at_rename
from tests.support.opa_standin import StandInOpa, serving_opa

EXTRA = "package extra.a\n\nx := 1\n"


Opa = StandInOpa  # holds the modules it is sent; /health answers 200; decisions allow


@pytest.fixture
async def opa() -> AsyncIterator[Opa]:
    async with serving_opa(Opa()) as stand_in:
        yield stand_in


async def _crash_mid_change(active: Path, versions: Path, opa: Opa, monkeypatch: pytest.MonkeyPatch) -> None:
    """A change pushed to OPA, then the process dies before it is committed (its journal stays armed)."""
    async with RemoteOpa(opa.url, timeout_s=5.0) as remote:
        store = PolicyStore(active, versions, target=RemoteOpaTarget(remote.client))
        _crash_at_rename(monkeypatch, "extra_a.rego")
        with pytest.raises(Crash):
            await store.put_policy("extra_a.rego", EXTRA, "ops")
        monkeypatch.undo()
    assert (active / JOURNAL).exists() and opa.modules == {"extra_a.rego": EXTRA}  # OPA holds it


async def test_the_store_gives_back_at_start_what_a_crash_left_in_opa(
        active: Path, tmp_path: Path, opa: Opa, monkeypatch: pytest.MonkeyPatch) -> None:
    versions = tmp_path / "versions"
    await _crash_mid_change(active, versions, opa, monkeypatch)
    async with RemoteOpa(opa.url, timeout_s=5.0) as remote:
        store = PolicyStore(active, versions, target=RemoteOpaTarget(remote.client), settle_s=0)  # the restart
        assert not (active / JOURNAL).exists() and "extra_a.rego" not in store.policy_set.modules
        await store.start()
        assert opa.modules == {} and opa.deletes == ["extra_a.rego"]  # before: only at the next change
        assert store.history() == [] and store.version == 0
        store.close()


async def test_the_decision_points_start_gives_it_back(active: Path, tmp_path: Path, opa: Opa,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """The gateway's wiring: ``DecisionPoint.start`` (a Lifecycle of gateway/build.py) runs the give-back
    once the remote client is started; its ``stop`` cancels the settle pass still scheduled."""
    versions = tmp_path / "versions"
    await _crash_mid_change(active, versions, opa, monkeypatch)
    pc = PolicyConfig(mode="remote", url=opa.url, timeout_s=5.0, dir=str(active), versions_dir=str(versions),
                      cache_key_fields=[])
    dp = build_decision_point(pc, audit=_Audit())  # type: ignore[arg-type]
    assert opa.modules == {"extra_a.rego": EXTRA}  # built, not started: nothing sent yet
    await dp.start()
    try:
        assert opa.modules == {} and opa.deletes == ["extra_a.rego"]
    finally:
        await dp.stop()
    assert dp.store is not None and dp.store.version == 0


async def test_a_target_unreachable_at_start_keeps_the_key_for_the_next_change(
        active: Path, tmp_path: Path, opa: Opa, monkeypatch: pytest.MonkeyPatch) -> None:
    """The start does not fail (decisions fail closed on their own); the key stays pending and the next
    change gives it back first, as before."""
    versions = tmp_path / "versions"
    await _crash_mid_change(active, versions, opa, monkeypatch)
    remote = RemoteOpa(opa.url, timeout_s=5.0)
    store = PolicyStore(active, versions, target=RemoteOpaTarget(remote.client), settle_s=0)
    await store.start()  # the client is not started: the give-back fails, logged
    assert opa.modules == {"extra_a.rego": EXTRA}
    async with remote:
        rec = await store.put_policy("extra_b.rego", "package extra.b\n\nz := 3\n", "ops")
    assert rec.version == 1 and "extra_a.rego" not in opa.modules and opa.deletes == ["extra_a.rego"]


class _Audit:
    def record_operator(self, event: dict[str, Any]) -> None:
        pass
