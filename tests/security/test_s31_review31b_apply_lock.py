"""Session 31 (review31b, S31-review31b-3): ``Admin._apply`` (a reload in a worker thread, a version adopted from
another instance on the event loop) built the tenant table twice: ``TenantRegistry.from_config`` to validate, then
``registry.reload`` with the same tenants inside ``_apply_lock`` (S31-review31-2). The build checks every pair of
SPIFFE rules (O(rules²): 2,000 one-rule tenants ~0.5 s, 4,000 ~2.1 s of CPU), so the lock was held for a whole build
while a reload ran, and an adoption on the event loop waited for it on top of its own two builds. Now the validated
table is swapped in under the lock: one build per apply, none under the lock, the same registry in force.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import tenancy.registry as registry_module
from tests.scaleout.s2_instances import instance, instance_doc, write_secret


async def test_an_apply_builds_the_tenants_once_and_never_under_the_lock(tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    secret = write_secret(tmp_path / "master.key")
    doc = instance_doc(tmp_path, 0, "redis://127.0.0.1:9", secret)
    doc.pop("state")
    gw = instance(tmp_path, 0, "", secret, doc=doc)
    admin = gw.admin
    builds: list[bool] = []  # per build: was the apply lock held
    inner = registry_module._build

    def counting(tenants: Any, operators: Any) -> Any:
        builds.append(admin._apply_lock.locked())
        return inner(tenants, operators)

    monkeypatch.setattr(registry_module, "_build", counting)
    tenants = [dict(t) for t in doc["tenancy"]["tenants"]]
    tenants.append({"id": "tenant-q", "spiffe_ids": ["spiffe://demo.prefixgate.test/tenant-q/"],
                    "models": ["sim-model"]})
    operators = list(doc["tenancy"].get("operators") or [])
    registry = admin.apply_registry(tenants, operators)
    assert builds == [False]  # before: [False, True] (validated, then built again inside the lock)
    assert registry is gw.admission.registry and registry.get("tenant-q") is not None
    assert sorted(t.id for t in registry.tenants()) == sorted(t["id"] for t in tenants)
    assert admin.last_tenancy == {"tenants": tenants, "operators": operators}
    assert registry.resolve("spiffe://demo.prefixgate.test/tenant-q/app").id == "tenant-q"
