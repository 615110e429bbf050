"""A tenant that alone can reach the overload-shedding bound is named at start (issue 17 review).

Shedding runs before authentication, so it cannot tell tenants apart: a tenant without
``max_concurrency`` (or whose concurrency plus queue reaches the bound) can make the gateway
answer 503 to every tenant. The gateway logs it when it starts.
"""
from __future__ import annotations

from gateway.readiness import shedding_warnings
from tenancy.registry import TenantRegistry


def _registry(*tenants: dict) -> TenantRegistry:
    return TenantRegistry.from_config(list(tenants))


def _tenant(tid: str, **kw: object) -> dict:
    return {"id": tid, "spiffe_ids": [f"spiffe://example.org/{tid}"], **kw}


def test_a_tenant_without_max_concurrency_is_named() -> None:
    reg = _registry(_tenant("free"), _tenant("bounded", max_concurrency=8))
    out = shedding_warnings(reg, 1024, 128)
    assert len(out) == 1 and out[0].startswith("tenant free: no max_concurrency") and "503 overloaded" in out[0]


def test_concurrency_plus_queue_reaching_the_bound_is_named() -> None:
    reg = _registry(_tenant("big", max_concurrency=900), _tenant("small", max_concurrency=895))
    out = shedding_warnings(reg, 1024, 128)
    assert [w.split(":")[0] for w in out] == ["tenant big"], out


def test_bounded_tenants_give_no_warning() -> None:
    assert shedding_warnings(_registry(_tenant("a", max_concurrency=16), _tenant("b", max_concurrency=4)),
                             1024, 128) == []
