"""Session 4 (issue 14): the PEP builds a tenant's policy facts once per Tenant object (not per
request), and a new Tenant object (a registry reload) gets fresh facts."""
from __future__ import annotations

from dataclasses import replace
from typing import Any

from gateway.pep import PolicyEnforcementPoint
from tenancy.registry import Tenant


def _pep() -> PolicyEnforcementPoint:
    return PolicyEnforcementPoint(None, None, None, None)  # type: ignore[arg-type]


def test_facts_are_built_once_per_tenant_object(monkeypatch: Any) -> None:
    calls = []
    real = Tenant.policy_view
    monkeypatch.setattr(Tenant, "policy_view", lambda self: calls.append(self.id) or real(self))
    pep = _pep()
    t = Tenant(id="acme", models=frozenset({"m"}), pools=frozenset({"default"}), max_output_tokens=64)
    first = pep.tenant_facts(t)
    assert pep.tenant_facts(t) is first and calls == ["acme"]
    assert first == {**real(t), "max_tokens": 64}
    reloaded = replace(t, max_output_tokens=32, tier="gold")
    facts = pep.tenant_facts(reloaded)
    assert calls == ["acme", "acme"] and facts["max_tokens"] == 32 and facts["tier"] == "gold"
