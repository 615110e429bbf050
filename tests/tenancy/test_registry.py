from __future__ import annotations

import pytest

from tenancy.registry import Tenant, TenantConfigError, TenantRegistry, is_valid_spiffe_id


def _cfg() -> list[dict]:
    return [
        {
            "id": "acme",
            "spiffe_ids": ["spiffe://prod.example/ns/acme/", "spiffe://prod.example/batch/acme-etl"],
            "models": ["llama-3-8b"],
            "pools": ["general"],
            "tier": "gold",
            "labels": {"team": "search"},
            "rate_rps": 10,
            "prompt_tokens_per_s": 5000,
            "max_concurrency": 4,
            "max_prompt_tokens": 8192,
            "max_output_tokens": 1024,
            "regulated": True,
            "data_residency": "eu",
        },
        {"id": "beta", "spiffe_ids": ["spiffe://prod.example/ns/acme-two/"]},
        {"id": "gamma", "spiffe_ids": ["spiffe://prod.example/ns/acme/special/one"]},
    ]


def test_prefix_matches_whole_segments_only() -> None:
    with pytest.raises(TenantConfigError):  # gamma overlaps acme's prefix
        TenantRegistry.from_config(_cfg())
    reg = TenantRegistry.from_config(_cfg()[:2])
    assert reg.resolve("spiffe://prod.example/ns/acme/sa/web").id == "acme"
    assert reg.resolve("spiffe://prod.example/ns/acme/a/b/c").id == "acme"
    assert reg.resolve("spiffe://prod.example/ns/acme-two/sa/x").id == "beta"
    assert reg.resolve("spiffe://prod.example/ns/acmex/sa/x") is None
    assert reg.resolve("spiffe://prod.example/ns/acme") is None  # prefix covers strictly below
    assert reg.resolve("spiffe://prod.example/batch/acme-etl").id == "acme"
    assert reg.resolve("spiffe://prod.example/batch/acme-etl/x") is None  # exact rule
    assert reg.resolve("spiffe://prod.example/batch/acme-etlx") is None
    assert reg.resolve("spiffe://other.example/ns/acme/sa/web") is None


def test_exact_rule_does_not_match_longer_name() -> None:
    reg = TenantRegistry.from_config([{"id": "a", "spiffe_ids": ["spiffe://td/ns/a"]}])
    assert reg.resolve("spiffe://td/ns/a").id == "a"
    assert reg.resolve("spiffe://td/ns/ab") is None
    assert reg.resolve("spiffe://td/ns/a/x") is None


def test_unknown_and_malformed_ids_resolve_to_none() -> None:
    reg = TenantRegistry.from_config(_cfg()[:2])
    for bad in [
        "spiffe://prod.example/ns/acme/../x",
        "spiffe://prod.example/ns/acme//x",
        "spiffe://prod.example/ns/acme/x?q=1",
        "spiffe://PROD.example/ns/acme/x",
        "http://prod.example/ns/acme/x",
        "spiffe://prod.example/ns/acme/",
        "",
    ]:
        assert reg.resolve(bad) is None, bad
    assert reg.get("nope") is None
    assert is_valid_spiffe_id("spiffe://td/a/b") and not is_valid_spiffe_id("spiffe://td/a/")


def test_longest_match_within_one_tenant_and_exact_wins() -> None:
    reg = TenantRegistry.from_config(
        [
            {"id": "a", "spiffe_ids": ["spiffe://td/", "spiffe://td/ns/a/"]},
        ]
    )
    assert reg.resolve("spiffe://td/anything").id == "a"
    # Same tenant may hold nested rules; another tenant may not.
    with pytest.raises(TenantConfigError, match=r"tenants\.1\.spiffe_ids.*overlaps"):
        TenantRegistry.from_config(
            [
                {"id": "a", "spiffe_ids": ["spiffe://td/"]},
                {"id": "b", "spiffe_ids": ["spiffe://td/ns/b"]},
            ]
        )


@pytest.mark.parametrize(
    "rules_a,rules_b",
    [
        (["spiffe://td/x"], ["spiffe://td/x"]),
        (["spiffe://td/ns/"], ["spiffe://td/ns/b/"]),
        (["spiffe://td/ns/b/c"], ["spiffe://td/ns/"]),
    ],
)
def test_overlap_across_tenants_refused(rules_a: list[str], rules_b: list[str]) -> None:
    with pytest.raises(TenantConfigError, match="overlaps"):
        TenantRegistry.from_config([{"id": "a", "spiffe_ids": rules_a}, {"id": "b", "spiffe_ids": rules_b}])


def test_non_overlapping_siblings_accepted() -> None:
    reg = TenantRegistry.from_config(
        [{"id": "a", "spiffe_ids": ["spiffe://td/ns/a/"]}, {"id": "b", "spiffe_ids": ["spiffe://td/ns/ab/"]}]
    )
    assert reg.resolve("spiffe://td/ns/ab/x").id == "b"
    assert reg.resolve("spiffe://td/ns/a/x").id == "a"


def test_tenant_fields_and_defaults() -> None:
    reg = TenantRegistry.from_config(_cfg()[:2])
    t = reg.get("acme")
    assert isinstance(t, Tenant)
    assert t.models == frozenset({"llama-3-8b"}) and t.pools == frozenset({"general"})
    assert t.rate_rps == 10.0 and t.rate_burst == 10.0
    assert t.prompt_tokens_burst == 5000.0
    assert t.max_concurrency == 4 and t.regulated and t.data_residency == "eu"
    assert t.policy_view()["labels"] == {"team": "search"}
    b = reg.get("beta")
    assert b.rate_rps is None and b.max_concurrency is None and b.tier == "standard"
    with pytest.raises(TypeError):
        t.labels["x"] = "y"  # type: ignore[index]


@pytest.mark.parametrize(
    "patch,field",
    [
        ({"id": "bad id"}, "id"),
        ({"id": "t:x"}, "id"),
        ({"rate_rps": -1}, "rate_rps"),
        ({"rate_rps": True}, "rate_rps"),
        ({"rate_rps": float("inf")}, "rate_rps"),
        ({"rate_burst": 5}, "rate_burst"),
        ({"max_concurrency": 1.5}, "max_concurrency"),
        ({"max_prompt_tokens": 0}, "max_prompt_tokens"),
        ({"models": "llama"}, "models"),
        ({"pools": [""]}, "pools"),
        ({"labels": {"a": 1}}, "labels"),
        ({"regulated": "yes"}, "regulated"),
        ({"spiffe_ids": []}, "spiffe_ids"),
        ({"spiffe_ids": ["spiffe://td/../x"]}, "spiffe_ids.0"),
        ({"max_tokenz": 5}, "max_tokenz"),
    ],
)
def test_validation_names_bad_field(patch: dict, field: str) -> None:
    doc = {"id": "t1", "spiffe_ids": ["spiffe://td/t1"]} | patch
    with pytest.raises(TenantConfigError) as ei:
        TenantRegistry.from_config([doc])
    assert field in str(ei.value)


def test_duplicate_ids_refused() -> None:
    with pytest.raises(TenantConfigError, match="duplicate"):
        TenantRegistry.from_config(
            [{"id": "a", "spiffe_ids": ["spiffe://td/a"]}, {"id": "a", "spiffe_ids": ["spiffe://td/b"]}]
        )


def test_operators() -> None:
    reg = TenantRegistry.from_section(
        {
            "tenants": _cfg()[:1],
            "operators": ["spiffe://prod.example/ns/ops/sa/admin", "spiffe://prod.example/ops-team/"],
        }
    )
    assert reg.is_operator("spiffe://prod.example/ns/ops/sa/admin")
    assert reg.is_operator("spiffe://prod.example/ops-team/alice")
    assert not reg.is_operator("spiffe://prod.example/ns/ops/sa/admin2")
    assert not reg.is_operator("spiffe://prod.example/ns/acme/sa/web")
    assert not reg.is_operator("garbage")
    with pytest.raises(TenantConfigError, match=r"operators\.0"):
        TenantRegistry.from_section({"tenants": [], "operators": ["not-spiffe"]})
    with pytest.raises(TenantConfigError, match="unknown"):
        TenantRegistry.from_section({"tenants": [], "operatorz": []})


def test_reload_is_atomic_and_keeps_operators() -> None:
    reg = TenantRegistry.from_config(_cfg()[:1], operators=["spiffe://td/ops"])
    with pytest.raises(TenantConfigError):
        reg.reload([{"id": "x", "spiffe_ids": ["spiffe://td/x"]}, {"id": "x", "spiffe_ids": ["spiffe://td/y"]}])
    assert reg.get("acme") is not None and len(reg) == 1  # old snapshot still in force
    reg.reload([{"id": "x", "spiffe_ids": ["spiffe://td/x"]}])
    assert reg.get("acme") is None and reg.resolve("spiffe://td/x").id == "x"
    assert reg.is_operator("spiffe://td/ops")
    reg.reload([], operators=[])
    assert not reg.is_operator("spiffe://td/ops") and len(reg) == 0
