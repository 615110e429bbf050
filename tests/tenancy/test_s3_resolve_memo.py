"""Issue 14: SPIFFE ID -> tenant resolution is looked up once per ID and registry snapshot
(bounded), and a reload takes effect for the very next request."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import tenancy.registry as registry_mod
from tenancy.registry import TenantRegistry

TENANTS = [{"id": "a", "spiffe_ids": ["spiffe://td/a/"]}, {"id": "b", "spiffe_ids": ["spiffe://td/b/x"]}]


def test_repeated_id_is_matched_once(monkeypatch: pytest.MonkeyPatch) -> None:
    reg = TenantRegistry.from_config(TENANTS)
    calls: list[str] = []
    real = registry_mod._match
    monkeypatch.setattr(registry_mod, "_match", lambda sid, *a: (calls.append(sid), real(sid, *a))[1])
    for _ in range(3):
        assert reg.resolve("spiffe://td/a/app").id == "a"
        assert reg.resolve("spiffe://td/c/app") is None
    assert calls == ["spiffe://td/a/app", "spiffe://td/c/app"]


def test_reload_applies_at_once() -> None:
    reg = TenantRegistry.from_config(TENANTS)
    assert reg.resolve("spiffe://td/a/app").id == "a"
    reg.reload([{"id": "z", "spiffe_ids": ["spiffe://td/a/"]}])
    assert reg.resolve("spiffe://td/a/app").id == "z"
    reg.reload_section({"tenants": TENANTS})
    assert reg.resolve("spiffe://td/a/app").id == "a"
    assert reg.resolve("spiffe://td/b/x").id == "b"


@settings(max_examples=200, deadline=None)
@given(st.lists(st.sampled_from(["spiffe://td/a/app", "spiffe://td/a", "spiffe://td/b/x", "spiffe://td/b/x/y",
                                 "spiffe://td/b", "spiffe://other/a/app", "not-an-id", "spiffe://td/a/app/"]),
                max_size=30))
def test_memo_answers_as_a_fresh_registry(ids: list[str]) -> None:
    reg = TenantRegistry.from_config(TENANTS)
    for sid in ids:
        fresh = TenantRegistry.from_config(TENANTS).resolve(sid)
        got = reg.resolve(sid)
        assert (got.id if got else None) == (fresh.id if fresh else None)


def test_memo_is_bounded() -> None:
    reg = TenantRegistry.from_config(TENANTS)
    for i in range(3 * registry_mod.RESOLVE_MEMO_MAX):
        reg.resolve(f"spiffe://td/a/app{i}")
    assert reg.memo_size() <= registry_mod.RESOLVE_MEMO_MAX
