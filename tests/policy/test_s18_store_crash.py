"""Session 18, helper store: SF17-2. A process that dies at any point of a policy change leaves a disk
that the next start recovers: before the commit (the journal's removal) the change is rolled back (it was
never answered 200 nor audited), after it the change is in force with its version record. The on-disk
state a crash leaves is built by stopping the change at each rename (policy/store_disk.py); the restart
builds the engine first and the store second, in the gateway's order (gateway/pep.py)."""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

import policy.store_disk
from policy.embedded import EmbeddedOpa
from policy.loader import JOURNAL, PolicySet, load_policy_dir
from policy.store import PolicyStore

TIERS = "prefixgate/config/tiers"
EXTRA = "package extra.a\n\nx := 1\n"


class Crash(BaseException):
    """The process dies here: nothing after this point runs (no roll-back, no clean-up)."""


def _crash_at(monkeypatch: pytest.MonkeyPatch, n: int, *, after: bool, name: str | None = None) -> None:
    """Die at the ``n``-th rename of policy/store_disk.py (or the one to a file called ``name``),
    before it or right after it."""
    calls: list[str] = []

    def wrap(real: Any) -> Any:
        def renamed(src: Any, dst: Any) -> None:
            calls.append(str(dst))
            hit = Path(dst).name == name if name else len(calls) == n
            if hit and not after:
                raise Crash(str(dst))
            real(src, dst)
            if hit:
                raise Crash(str(dst))
        return renamed

    monkeypatch.setattr(policy.store_disk.os, "rename", wrap(os.rename))
    monkeypatch.setattr(policy.store_disk.os, "replace", wrap(os.replace))


async def _restart(active: Path, versions: Path, expected: PolicySet, version: int) -> None:
    opa = EmbeddedOpa(active, timeout_s=5.0)  # gateway/pep.py builds the engine before the store
    try:
        store = PolicyStore(active, versions, target=opa)
        assert opa.policy_set == store.policy_set == load_policy_dir(active) == expected
        assert store.version == version and [r.version for r in store.history()] == list(range(1, version + 1))
        left = [p.name for p in active.parent.rglob("*")
                if p.name.startswith((".staged-", JOURNAL)) or p.name.endswith(".tmp")]
        assert left == []
        rec = await store.put_data(TIERS, {**store.get_data(TIERS), "standard": {"max_tokens": 9}}, "ops")
        assert rec.version == version + 1 and opa.policy_set == store.policy_set == load_policy_dir(active)
    finally:
        opa.close()


# renames of one change: 1 the journal armed, 2 the active file, 3 the version directory, 4 the commit
@pytest.mark.parametrize(("n", "after", "committed"), [
    (1, False, False), (2, False, False), (2, True, False), (3, False, False), (3, True, False),
    (4, False, False), (4, True, True),
], ids=["journal", "active", "active-renamed", "version", "version-renamed", "commit", "committed"])
async def test_a_crash_during_a_change_is_recovered_at_start(
        active: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, n: int, after: bool, committed: bool) -> None:
    versions = tmp_path / "versions"
    store = PolicyStore(active, versions)
    before = store.policy_set
    _crash_at(monkeypatch, n, after=after)
    with pytest.raises(Crash):
        await store.put_policy("extra_a.rego", EXTRA, "ops")
    monkeypatch.undo()
    if (n, after) in ((2, True), (3, False), (3, True), (4, False)):  # SF17-2: the active file is ahead
        assert (active / "extra_a.rego").exists() and (active / JOURNAL).exists()
        assert load_policy_dir(active) == before  # what every reader sees until the restart rolls it back
    await _restart(active, versions, before.with_module("extra_a.rego", EXTRA) if committed else before,
                   1 if committed else 0)


async def test_a_crash_half_way_through_an_adopted_set_is_rolled_back(
        active: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An adopted set (shared state) renames several active files: a crash between two of them leaves
    a mix of both sets on disk, which neither the engine nor the store ever loads."""
    versions = tmp_path / "versions"
    store = PolicyStore(active, versions)
    before = store.policy_set
    tiers = {**store.get_data(TIERS), "standard": {"max_tokens": 5}}
    new = before.with_module("extra_a.rego", EXTRA).with_data(TIERS, tiers)
    _crash_at(monkeypatch, 0, after=True, name="extra_a.rego")  # modules are renamed before data documents
    with pytest.raises(Crash):
        await store.adopt(4, new, "shared-state:x")
    monkeypatch.undo()
    assert (active / "extra_a.rego").exists(), "the crash should leave one file of each set"
    assert '"max_tokens":5' not in (active / "data" / f"{TIERS}.json").read_text()
    await _restart(active, versions, before, 0)


async def test_a_restart_that_cannot_roll_back_yet_counts_only_committed_versions(
        active: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Crash right before the commit (versions/1 renamed, the journal armed), then a start whose disk
    still fails: the store starts on version 0 and the committed set, and rolls back before its first change."""
    versions = tmp_path / "versions"
    store = PolicyStore(active, versions)
    before = store.policy_set
    _crash_at(monkeypatch, 4, after=False)
    with pytest.raises(Crash):
        await store.put_policy("extra_a.rego", EXTRA, "ops")
    monkeypatch.undo()
    assert (versions / "00000001" / "record.json").exists()

    def broken(src: Any, dst: Any) -> None:
        raise OSError(30, "Read-only file system")

    monkeypatch.setattr(policy.store_disk.os, "replace", broken)
    again = PolicyStore(active, versions)
    assert again.version == 0 and again.history() == [] and again.policy_set == before
    monkeypatch.undo()
    rec = await again.put_policy("extra_b.rego", EXTRA.replace("extra.a", "extra.b"), "ops")
    assert rec.version == 1 and [r.target for r in again.history()] == ["extra_b.rego"]
    assert load_policy_dir(active) == again.policy_set and "extra_a.rego" not in again.policy_set.modules
