"""Tenants entries validated by the pydantic schema keep their dotted error locations."""
import pytest

from tenancy.tenant import TenantConfigError, parse_tenant

BASE = {"id": "acme", "spiffe_ids": ["spiffe://prod.example/ns/acme/"]}


@pytest.mark.parametrize("extra, expected", [
    ({"max_output_token": 5}, "tenants.0.max_output_token: unknown field"),
    ({"max_output_token": 5, "rate_rps": -1}, "tenants.0.max_output_token: unknown field"),
    ({"rate_rps": True}, "tenants.0.rate_rps: must be a positive finite number"),
    ({"rate_rps": float("inf")}, "tenants.0.rate_rps: must be a positive finite number"),
    ({"max_concurrency": 2.5}, "tenants.0.max_concurrency: must be a positive integer"),
    ({"models": ["ok", "bad name"]}, "tenants.0.models.1: must be a name"),
    ({"rate_burst": 3}, "tenants.0.rate_burst: needs rate_rps"),
    ({"forward_user": "keep"}, "tenants.0.forward_user: must be 'drop' or 'pseudonym'"),
    ({"spiffe_ids": []}, "tenants.0.spiffe_ids: must be a non-empty list"),
])
def test_bad_entry_names_field(extra, expected):
    with pytest.raises(TenantConfigError) as err:
        parse_tenant({**BASE, **extra}, 0)
    assert str(err.value).startswith(expected)


def test_good_entry_builds_tenant_with_default_bursts():
    t = parse_tenant({**BASE, "rate_rps": 0.5, "prompt_tokens_per_s": 100, "models": ("m1",)}, 3)
    assert t.rate_burst == 1.0 and t.prompt_tokens_burst == 100.0 and isinstance(t.prompt_tokens_per_s, float)
    assert t.models == frozenset({"m1"}) and t.spiffe_ids == ("spiffe://prod.example/ns/acme/",)
