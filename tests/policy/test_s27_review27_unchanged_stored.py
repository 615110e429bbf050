"""Session 27 review (review27), S27-review27-2: with shared state, a write that changes nothing here answers
``unchanged`` only when the shared state stores the version and set in force here; when it stores another (a change
of another instance not adopted yet) or cannot be read, the write is made as a change and published, answered as
any change (409 ``conflict`` when the publish is refused). End to end: tests/scaleout/test_s27_review27_unchanged_shared.py.
"""
from __future__ import annotations

from pathlib import Path

import pytest

from policy.loader import PolicySet
from policy.store import ChangeRecord, PolicyConflictError, PolicyStore, PolicyUnchanged

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
    answer[0] = ConnectionError("redis down")  # the shared state unreadable: made as a change too
    made = await store.put_policy("authz.rego", text, OPS)
    assert isinstance(made, ChangeRecord) and made.version == 2 and published == [1, 2]


async def test_without_shared_state_unchanged_reads_nothing(active: Path, tmp_path: Path) -> None:
    store = PolicyStore(active, tmp_path / "versions")

    async def publish(record: ChangeRecord, policy_set: PolicySet) -> str:
        return "published"

    store.set_publisher(publish)  # no ``stored``: as session 26
    assert isinstance(await store.put_policy("authz.rego", store.get_policy("authz.rego"), OPS), PolicyUnchanged)
