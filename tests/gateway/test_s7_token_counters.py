"""Issue 14 (session 7): the admission's token counters are incremented through children looked up
once per tenant; what they count is unchanged (reserved, charged, refunded per tenant and kind)."""

from __future__ import annotations

from tests.gateway.test_s7_bounds_memo import _admission
from tenancy.registry import Tenant


def _value(adm, name: str, tenant: str, kind: str) -> float | None:  # type: ignore[no-untyped-def]
    return adm.metrics.admin.get_sample_value(f"prefixgate_tenant_tokens_{name}_total", {"tenant": tenant, "kind": kind})


async def test_counts_per_tenant_and_kind() -> None:
    adm = _admission()
    acme, globex = Tenant(id="acme"), Tenant(id="globex")
    for tenant, prompt, used in ((acme, 100, 7), (globex, 40, 3), (acme, 50, 20)):
        res = await adm.check_prompt(tenant, prompt, 1, 30)
        assert _value(adm, "charged", tenant.id, "prompt") in (None, 0.0, 100.0)  # not before its end
        adm.settle(res, usage={"prompt_tokens": prompt, "completion_tokens": used}, progress="unknown",
                   relayed_output=0)
    assert _value(adm, "reserved", "acme", "prompt") == 150
    assert _value(adm, "reserved", "acme", "output") == 60
    assert _value(adm, "charged", "acme", "output") == 27
    assert _value(adm, "refunded", "acme", "output") == 33
    assert _value(adm, "charged", "globex", "prompt") == 40
    assert _value(adm, "refunded", "globex", "output") == 27
    assert adm.metrics.admin.get_sample_value("prefixgate_tenant_charges_total",
                                              {"tenant": "acme", "basis": "usage"}) == 2
