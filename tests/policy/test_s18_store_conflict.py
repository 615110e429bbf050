"""Session 18, helper store: SF17-1 at the admin API. A change the shared state refuses (another instance
stored that version first) answers 409 ``conflict`` with its record (``shared: conflict``), and the audit
callback receives that record; a published change answers 200 with ``shared: published``."""
from __future__ import annotations

from pathlib import Path
from typing import Any

from starlette.applications import Starlette
from starlette.testclient import TestClient

from policy.admin import admin_routes
from policy.store import ChangeRecord, PolicyStore

EXTRA = b"package extra.a\n\nx := 1\n"


def test_a_refused_publication_answers_409(active: Path, tmp_path: Path) -> None:
    audited: list[ChangeRecord] = []
    store = PolicyStore(active, tmp_path / "versions", on_change=audited.append)
    answers = ["conflict", "published"]

    async def publish(record: ChangeRecord, policy_set: Any) -> str:
        assert policy_set.modules["extra_a.rego"] == EXTRA.decode()  # the new set, published before the answer
        return answers.pop(0)

    async def operator(request: Any) -> dict[str, Any]:
        return {"id": "ops"}

    store.set_publisher(publish)
    client = TestClient(Starlette(routes=admin_routes(store, operator)))
    r = client.put("/admin/policies/extra_a.rego", content=EXTRA)
    assert r.status_code == 409 and r.json()["error"]["code"] == "conflict"
    assert r.json()["error"]["result"]["shared"] == "conflict" and "retry" in r.json()["error"]["message"]
    assert [a.shared for a in audited] == ["conflict"]
    ok = client.put("/admin/policies/extra_a.rego", content=EXTRA)
    assert ok.status_code == 200 and ok.json()["result"]["shared"] == "published"
    assert [a.shared for a in audited] == ["conflict", "published"]
