"""Session 27 review (review27), S27-review27-2: with shared state, a write that changes nothing here answers
``unchanged`` only when the shared state stores the version and set in force here; when it stores another (a change
of another instance not adopted yet) or cannot be read, the write is made as a change and published, answered as
any change (409 ``conflict`` when the publish is refused).
End to end: tests/scaleout/test_s27_review27_unchanged_shared.py.

S27-review27-6: with shared state, after a change answered ``conflict`` or ``unresolved`` and before the stored set is
adopted, no change is built on the set in force here (409 ``conflict`` / 503 ``state_unavailable``, nothing committed).
"""
from __future__ import annotations

from pathlib import Path

import pytest

from policy.loader import PolicySet
from policy.store import (ChangeRecord, PolicyBaseUnsharedError, PolicyConflictError, PolicyStore, PolicyUnchanged)
from policy.store_types import PolicySharedStateError

OPS = "spiffe://prefixgate.test/ops/alice"


async def test_unchanged_needs_the_shared_state_to_store_the_set_in_force(active: Path, tmp_path: Path) -> None:
    store = PolicyStore(active, tmp_path / "versions")
    asked: list[tuple[int, bool]] = []
    answer: list[object] = [True]
    published: list[int] = []

    async def stored(version: int, policy_set: PolicySet) -> bool:
        asked.append((version, policy_set is store.policy_set))  # the set in force here
        if isinstance(answer[0], Exception):
            raise answer[0]
        return bool(answer[0])

    async def publish(record: ChangeRecord, policy_set: PolicySet) -> str:
        published.append(record.version)
        return "conflict" if answer[0] is False else "published"

    store.set_publisher(publish, stored=stored)
    text = store.get_policy("authz.rego")
    same = await store.put_policy("authz.rego", text, OPS)
    assert isinstance(same, PolicyUnchanged) and same.version == 0 and asked == [(0, True)] and published == []
    answer[0] = False  # another set stored: made as a change, its publish refused -> 409 (session 26: unchanged)
    with pytest.raises(PolicyConflictError):
        await store.put_policy("authz.rego", text, OPS)
    assert published == [1] and store.version == 1
    with pytest.raises(PolicyBaseUnsharedError) as refused:  # S27-review27-6: not built on the losing set
        await store.put_policy("extra.rego", "package extra\n", OPS)
    assert (refused.value.status, refused.value.code) == (409, "conflict") and published == [1]
    await store.adopt(2, store.policy_set, "shared-state:other")  # the stored set adopted: changes go on
    answer[0] = ConnectionError("redis down")  # the shared state unreadable: made as a change too
    made = await store.put_policy("authz.rego", text, OPS)
    assert isinstance(made, ChangeRecord) and made.version == 3 and published == [1, 3]


async def test_a_change_after_an_unresolved_publish_is_refused_until_adoption(active: Path, tmp_path: Path) -> None:
    store = PolicyStore(active, tmp_path / "versions")
    answers = ["unresolved", "published"]

    async def publish(record: ChangeRecord, policy_set: PolicySet) -> str:
        return answers.pop(0)

    async def stored(version: int, policy_set: PolicySet) -> bool:
        return False

    store.set_publisher(publish, stored=stored)
    with pytest.raises(PolicySharedStateError):
        await store.put_policy("extra.rego", "package extra\n", OPS)
    with pytest.raises(PolicyBaseUnsharedError) as refused:
        await store.rollback(0, OPS)
    assert (refused.value.status, refused.value.code) == (503, "state_unavailable") and store.version == 1
    await store.adopt(2, store.policy_set, "shared-state:other")
    assert isinstance(await store.rollback(0, OPS), ChangeRecord) and store.version == 3


async def test_without_shared_state_unchanged_reads_nothing(active: Path, tmp_path: Path) -> None:
    store = PolicyStore(active, tmp_path / "versions")

    async def publish(record: ChangeRecord, policy_set: PolicySet) -> str:
        return "published"

    store.set_publisher(publish)  # no ``stored``: as session 26
    assert isinstance(await store.put_policy("authz.rego", store.get_policy("authz.rego"), OPS), PolicyUnchanged)


def test_the_admin_answers_409_and_audits_a_change_refused_on_a_losing_set(active: Path, tmp_path: Path) -> None:
    from typing import Any

    from starlette.applications import Starlette
    from starlette.testclient import TestClient

    from policy.admin import admin_routes

    store = PolicyStore(active, tmp_path / "versions")
    failures: list[dict[str, Any]] = []

    async def publish(record: ChangeRecord, policy_set: PolicySet) -> str:
        return "conflict"

    async def stored(version: int, policy_set: PolicySet) -> bool:
        return False

    async def operator(request: Any) -> dict[str, Any]:
        return {"id": "ops"}

    store.set_publisher(publish, stored=stored)
    client = TestClient(Starlette(routes=admin_routes(store, operator, on_failure=failures.append)))
    first = client.put("/admin/policies/extra_a.rego", content=b"package extra.a\n\nx := 1\n")
    assert first.status_code == 409 and first.json()["error"]["result"]["shared"] == "conflict"
    second = client.put("/admin/policies/extra_b.rego", content=b"package extra.b\n\nx := 1\n")
    assert second.status_code == 409, second.text  # before: 200 "conflict" again, on top of the losing set
    assert second.json()["error"]["code"] == "conflict" and "result" not in second.json()["error"]
    assert store.version == 1 and "extra_b.rego" not in store.policy_set.modules
    assert [(f["status"], f["error_code"]) for f in failures][-1] == (409, "conflict")
