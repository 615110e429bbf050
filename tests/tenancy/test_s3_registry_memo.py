"""The registry remembers resolved SPIFFE IDs per snapshot (the request path resolves every
request, a flood too): a reload is seen at once, and the memory is bounded."""

from __future__ import annotations

from tenancy import registry as reg_mod
from tenancy.registry import TenantRegistry

SID = "spiffe://example.org/team/app"


def _tenant(tid: str, rule: str) -> dict:
    return {"id": tid, "spiffe_ids": [rule]}


def test_a_reload_changes_what_a_remembered_id_resolves_to() -> None:
    reg = TenantRegistry.from_config([_tenant("a", "spiffe://example.org/team/")])
    assert reg.resolve(SID).id == "a" and reg.resolve(SID).id == "a"  # the second from memory
    reg.reload([_tenant("b", SID)])
    assert reg.resolve(SID).id == "b"
    reg.reload([_tenant("c", "spiffe://example.org/other/")])
    assert reg.resolve(SID) is None


def test_unknown_and_malformed_ids_stay_unresolved() -> None:
    reg = TenantRegistry.from_config([_tenant("a", "spiffe://example.org/team/")])
    for sid in ("spiffe://example.org/x", "not a spiffe id", "spiffe://example.org/x"):
        assert reg.resolve(sid) is None


def test_the_memory_is_bounded(monkeypatch) -> None:
    monkeypatch.setattr(reg_mod, "RESOLVE_MEMO_MAX", 8)
    reg = TenantRegistry.from_config([_tenant("a", "spiffe://example.org/team/")])
    for i in range(50):
        assert reg.resolve(f"spiffe://example.org/team/w{i}").id == "a"
    assert reg.memo_size() <= 8
