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


def _pairwise(tenants: list[dict[str, Any]]) -> str | None:
    """The build's overlap rule as it was (every pair of rules): the first error's message, or None."""
    from tenancy.tenant import parse_tenant

    owner: dict[str, str] = {}
    for i, doc in enumerate(tenants):
        t = parse_tenant(doc, i)
        for rule in t.spiffe_ids:
            for other, other_tid in owner.items():
                if other_tid != t.id and (registry_module._covers(rule, other) or registry_module._covers(other, rule)):
                    return f"rule {rule!r} overlaps rule {other!r} of tenant {other_tid!r}"
            owner[rule] = t.id
    return None


def test_the_overlap_rule_is_unchanged() -> None:
    """Random rule sets: the same sets refused, with the same pair named, as the pairwise search."""
    import random

    rng = random.Random(31)
    segments = ["a", "b", "ab"]
    refused = 0
    for _ in range(400):
        tenants = []
        for n in range(rng.randint(1, 5)):
            rules = []
            for _ in range(rng.randint(1, 3)):
                path = "/".join(rng.choice(segments) for _ in range(rng.randint(1, 3)))
                rules.append(f"spiffe://td.test/{path}" + ("/" if rng.random() < 0.5 else ""))
            tenants.append({"id": f"t{n}", "spiffe_ids": rules, "models": ["m"]})
        expected = _pairwise(tenants)
        try:
            registry_module.TenantRegistry.from_config(tenants)
            got = None
        except registry_module.TenantConfigError as exc:
            got = str(exc)
        if expected is None:
            assert got is None, (tenants, got)
        else:
            refused += 1
            assert got is not None and got.endswith(expected), (tenants, got, expected)
    assert 50 < refused < 390  # both outcomes exercised


def test_a_build_checks_no_pair_of_rules_when_none_overlaps(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = [0]
    inner = registry_module._covers

    def counting(rule: str, other: str) -> bool:
        calls[0] += 1
        return inner(rule, other)

    monkeypatch.setattr(registry_module, "_covers", counting)
    tenants = [{"id": f"t{i}", "spiffe_ids": [f"spiffe://td.test/ns/t{i}/", f"spiffe://td.test/solo/t{i}"],
                "models": ["m"]} for i in range(300)]
    assert len(registry_module.TenantRegistry.from_config(tenants).tenants()) == 300
    assert calls[0] == 0  # before: ~360,000 (every pair of the 600 rules, both ways)
