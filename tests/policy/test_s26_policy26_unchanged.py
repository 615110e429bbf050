"""Session 26, policy26 (S25-review-8): a write that would change nothing commits no version.

Before this fix every roll-back committed a new version, also one to the set already in force (five concurrent
``{"to": 1}`` gave five versions, four of them no-ops, each a full ``set.json`` copy on disk), and a ``PUT`` of
the module text or data document already in force committed a version too (``old_sha256`` = ``new_sha256``).
Now both answer 200 with the version in force's entry and ``"unchanged": true``: no version, nothing applied,
published or handed to audit.
"""
from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from starlette.applications import Starlette
from starlette.testclient import TestClient

from policy.admin import admin_routes
from policy.embedded import EmbeddedOpa
from policy.loader import PolicySet
from policy.store import ChangeRecord, PolicyStore, PolicyUnchanged
from tests.support.policy_store import header_identity

TIERS = "prefixgate/config/tiers"
OPS = "spiffe://prefixgate.test/ops/alice"
EXTRA = "package prefixgate.extra\n\nx := 1\n"


def _version_dirs(versions: Path) -> list[str]:
    return sorted(p.name for p in versions.iterdir() if not p.name.startswith("."))


async def test_concurrent_roll_backs_to_one_version_commit_one_version(active: Path, tmp_path: Path) -> None:
    versions = tmp_path / "versions"
    opa = EmbeddedOpa(active, timeout_s=5.0)
    changes: list[ChangeRecord] = []
    published: list[int] = []
    store = PolicyStore(active, versions, target=opa, on_change=changes.append)

    async def publish(record: ChangeRecord, policy_set: PolicySet) -> str:
        published.append(record.version)
        return "published"

    store.set_publisher(publish)
    await store.put_policy("extra.rego", EXTRA, OPS)                     # version 1
    tiers = store.get_data(TIERS)
    tiers["standard"] = {**tiers["standard"], "max_tokens": 8}
    await store.put_data(TIERS, tiers, OPS)                              # version 2
    answers = await asyncio.gather(*(store.rollback(1, OPS, client_address=f"10.0.0.{i}") for i in range(5)))

    made = [a for a in answers if isinstance(a, ChangeRecord)]
    same = [a for a in answers if isinstance(a, PolicyUnchanged)]
    assert len(made) == 1 and len(same) == 4
    assert (made[0].version, made[0].rollback_to) == (3, 1)
    assert all(u.version == 3 and u.entry["version"] == 3 and u.entry["rollback_to"] == 1 for u in same)
    assert all(u.entry["set_sha256"] == made[0].set_sha256 for u in same)
    assert store.version == 3 and _version_dirs(versions) == ["00000000", "00000001", "00000002", "00000003"]
    assert [c.version for c in changes] == [1, 2, 3] and published == [1, 2, 3]


async def test_a_put_of_what_is_in_force_commits_nothing(active: Path, tmp_path: Path) -> None:
    versions = tmp_path / "versions"
    changes: list[ChangeRecord] = []
    store = PolicyStore(active, versions, on_change=changes.append)
    same = await store.put_policy("authz.rego", store.get_policy("authz.rego"), OPS)
    assert isinstance(same, PolicyUnchanged) and same.version == 0 and same.entry["start"] is True
    await store.put_policy("extra.rego", EXTRA, OPS)                     # version 1
    again = await store.put_policy("extra.rego", EXTRA, OPS)
    assert isinstance(again, PolicyUnchanged) and again.entry["target"] == "extra.rego"
    data = await store.put_data(TIERS, store.get_data(TIERS), OPS)
    assert isinstance(data, PolicyUnchanged) and data.version == 1
    assert store.version == 1 and [c.version for c in changes] == [1]
    assert _version_dirs(versions) == ["00000000", "00000001"]
    assert isinstance(await store.put_policy("extra.rego", EXTRA + "y := 2\n", OPS), ChangeRecord)


def test_the_admin_answers_unchanged_for_a_repeated_roll_back_and_put(active: Path, tmp_path: Path) -> None:
    versions = tmp_path / "versions"
    changes: list[ChangeRecord] = []
    failures: list[dict[str, Any]] = []
    store = PolicyStore(active, versions, on_change=changes.append)
    app = Starlette(routes=admin_routes(store, header_identity, on_failure=failures.append))
    h = {"x-test-spiffe-id": OPS}
    with TestClient(app) as c:
        put = c.put("/admin/policies/extra.rego", content=EXTRA, headers=h)
        assert put.status_code == 200 and "unchanged" not in put.json()
        first = c.post("/admin/policies/rollback", json={"to": 0}, headers=h)
        assert first.status_code == 200 and "unchanged" not in first.json()
        entry = {k: v for k, v in first.json()["result"].items() if k != "client_address"} | {"restorable": True}
        for to in (0, 2):                                                # an earlier version and the one in force
            r = c.post("/admin/policies/rollback", json={"to": to}, headers=h)
            assert r.status_code == 200, r.text
            assert r.json() == {"result": entry, "unchanged": True}      # version 2's entry, as listed
        r = c.put("/admin/data/" + TIERS, json=store.get_data(TIERS), headers=h)
        assert (r.status_code, r.json()["unchanged"], r.json()["result"]["version"]) == (200, True, 2)
        listed = c.get("/admin/policies/versions", headers=h).json()
    assert listed["version"] == 2 and [e["version"] for e in listed["result"]] == [2, 1, 0]
    assert [c.version for c in changes] == [1, 2] and failures == []


async def test_a_repeated_write_after_an_unshared_change_is_made_again(active: Path, tmp_path: Path) -> None:
    """A 409 ``conflict`` (its adoption runs after the answer), a 503 ``master_pending`` or ``unresolved`` leaves
    the change in force here but not shared: the operator's retry of the same write must be published again,
    not answered ``unchanged``."""
    store = PolicyStore(active, tmp_path / "versions")
    answers = ["conflict", "master_pending", "unresolved", "published"]
    published: list[int] = []

    async def publish(record: ChangeRecord, policy_set: PolicySet) -> str:
        published.append(record.version)
        return answers.pop(0)

    store.set_publisher(publish)
    for _ in range(4):
        try:
            await store.put_policy("extra.rego", EXTRA, OPS)
        except Exception as exc:  # noqa: BLE001 - the three refusals raise their errors
            assert exc.record.shared in ("conflict", "master_pending", "unresolved")  # type: ignore[attr-defined]
    assert published == [1, 2, 3, 4] and store.version == 4
    again = await store.put_policy("extra.rego", EXTRA, OPS)             # published: now it changes nothing
    assert isinstance(again, PolicyUnchanged) and again.version == 4 and published == [1, 2, 3, 4]


async def test_an_unchanged_write_first_gives_the_target_its_pending_give_back(
        active: Path, tmp_path: Path) -> None:
    """The target may differ from the set in force while a give-back is pending: a write that changes nothing
    first makes it (and is refused, as a change is, while the target still refuses)."""
    from policy.store import PolicyTargetError

    class Refusing:
        applies_whole_sets = True

        def __init__(self) -> None:
            self.refuse, self.applied = 0, 0

        async def apply(self, change: Any, policy_set: PolicySet) -> None:
            if self.refuse:
                self.refuse -= 1
                raise PolicyTargetError("remote OPA refused the change: ConnectError")
            self.applied += 1

    target = Refusing()
    store = PolicyStore(active, tmp_path / "versions", target=target, settle_s=3600)
    target.refuse = 2                                                    # the push, then its give-back
    try:
        await store.put_policy("extra.rego", EXTRA, OPS)
    except PolicyTargetError:
        pass
    else:
        raise AssertionError("the refused push was answered")
    for _ in range(100):                                                 # the give-back in its task: refused
        if target.refuse == 0:
            break
        await asyncio.sleep(0)
    assert target.refuse == 0 and store.version == 0
    target.refuse = 1
    try:
        await store.put_policy("authz.rego", store.get_policy("authz.rego"), OPS)
    except PolicyTargetError:
        pass
    else:
        raise AssertionError("answered unchanged while the target's give-back is pending")
    same = await store.put_policy("authz.rego", store.get_policy("authz.rego"), OPS)  # given back, then unchanged
    assert isinstance(same, PolicyUnchanged) and target.applied >= 1 and store.version == 0
