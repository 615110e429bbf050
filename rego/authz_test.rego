# Unit tests for prefixgate.authz. Run: python -m policy.rego_test_runner rego/
# Each test pins its own operator data with `with data.prefixgate.config as
# ...`, so they do not depend on the shipped data. Tenant entitlements come
# from input.tenant (the gateway's tenant registry), never from data.
package prefixgate.authz_test

import data.prefixgate.authz

# Operator facts only: tier caps, reserved pools, the deny-list.
fixture := {
	"tiers": {"standard": {"max_tokens": 1024}, "premium": {"max_tokens": 4096}},
	"pools": {"reserved": {"eu": {"data_residency": "eu"}}},
	"workloads": {"denied": ["spiffe://td.test/bad"]},
}

# What the registry would put in input.tenant for each test tenant.
tenants := {
	"t-std": {"tier": "standard", "models": ["m1"], "pools": ["default", "eu"], "regulated": false, "data_residency": null},
	"t-reg": {"tier": "premium", "models": ["m1"], "pools": ["default", "eu"], "regulated": true, "data_residency": "eu"},
	"t-odd": {"tier": "gold", "models": ["m1"], "pools": ["default"], "regulated": false, "data_residency": null},
	"t-nores": {"tier": "standard", "models": ["m1"], "pools": ["eu"], "regulated": true, "data_residency": null},
	"t-other": {"tier": "standard", "models": ["m1"], "pools": ["default"], "regulated": false, "data_residency": null},
}

candidates := [
	{"id": "d1", "pool": "default", "labels": {}, "healthy": true, "load": 0},
	{"id": "d2", "pool": "default", "labels": {}, "healthy": true, "load": 0},
	{"id": "e1", "pool": "eu", "labels": {"data_residency": "eu"}, "healthy": true, "load": 0},
	{"id": "e2", "pool": "eu", "labels": {"data_residency": "eu"}, "healthy": true, "load": 0},
]

tenant_input(tenant_id) := object.union(
	{"id": tenant_id, "labels": {}, "max_tokens": null},
	object.get(tenants, tenant_id, {}),
)

mk_input(tenant_id, overrides) := object.union(
	{
		"version": "1",
		"identity": {"spiffe_id": "spiffe://td.test/app", "trust_domain": "td.test", "claims": {}},
		"tenant": tenant_input(tenant_id),
		"request": {"endpoint": "/v1/chat/completions", "model": "m1", "prompt_tokens": 10, "max_tokens": null, "stream": false, "sequences": 1},
		"candidates": candidates,
		"alerts": [],
		"time": {"now": 0},
	},
	overrides,
)

decide(inp) := d if {
	d := authz.decision with input as inp with data.prefixgate.config as fixture
}

test_entitled_request_allowed if {
	d := decide(mk_input("t-std", {}))
	d.allow == true
	d.reason_code == "allowed"
	d.allowed_replicas == {"d1", "d2"}
	d.max_tokens == 1024
}

test_missing_tenant_fields_named if {
	d := decide(mk_input("nobody", {}))
	d.allow == false
	d.reason_code == "tenant_entitlements_missing"
	d.reason == "policy input lacks tenant.models, tenant.pools, tenant.tier (the gateway's tenant registry supplies it)"
}

test_entitlements_come_from_input_not_data if {
	# a stale tenants document in data (the old layout) grants nothing
	stale := object.union(fixture, {"tenants": {"t-std": {"tier": "standard", "models": ["m2"], "pools": ["default"]}}})
	inp := mk_input("t-std", {"request": {"endpoint": "/v1/completions", "model": "m2", "prompt_tokens": 1, "max_tokens": null, "stream": false}})
	d := authz.decision with input as inp with data.prefixgate.config as stale
	d.reason_code == "model_not_entitled"
	d2 := authz.decision with input as mk_input("t-std", {}) with data.prefixgate.config as stale
	d2.allow == true
}

test_revoked_model_denied_at_once if {
	t := object.union(tenant_input("t-std"), {"models": []})
	d := decide(mk_input("t-std", {"tenant": t}))
	d.reason_code == "model_not_entitled"
}

test_model_not_entitled if {
	d := decide(mk_input("t-std", {"request": {"endpoint": "/v1/completions", "model": "m2", "prompt_tokens": 1, "max_tokens": null, "stream": false}}))
	d.allow == false
	d.reason_code == "model_not_entitled"
}

test_denied_workload if {
	d := decide(mk_input("t-std", {"identity": {"spiffe_id": "spiffe://td.test/bad", "trust_domain": "td.test", "claims": {}}}))
	d.allow == false
	d.reason_code == "workload_denied"
}

test_denied_workload_outranks_other_denials if {
	d := decide(mk_input("t-odd", {"identity": {"spiffe_id": "spiffe://td.test/bad", "trust_domain": "td.test", "claims": {}}}))
	d.reason_code == "workload_denied"
}

test_non_regulated_never_reaches_reserved_pool if {
	d := decide(mk_input("t-std", {}))
	d.allowed_pools == {"default"}
	not "e1" in d.allowed_replicas
	not "e2" in d.allowed_replicas
}

test_non_regulated_denied_when_only_reserved_candidates if {
	eu_only := [c | some c in candidates; c.pool == "eu"]
	d := decide(mk_input("t-std", {"candidates": eu_only}))
	d.allow == false
	d.reason_code == "no_entitled_replica"
}

test_regulated_only_matching_residency if {
	d := decide(mk_input("t-reg", {}))
	d.allow == true
	d.allowed_replicas == {"e1", "e2"}
}

test_regulated_rejects_mismatched_residency_label if {
	us := [{"id": "u1", "pool": "eu", "labels": {"data_residency": "us"}, "healthy": true, "load": 0}]
	d := decide(mk_input("t-reg", {"candidates": us}))
	d.allow == false
	d.reason_code == "no_entitled_replica"
	contains(d.reason, `labels.data_residency "eu"`)
}

test_regulated_without_residency_denied_and_named if {
	d := decide(mk_input("t-nores", {}))
	d.allow == false
	d.reason_code == "residency_missing"
	contains(d.reason, "data_residency")
}

test_tier_cap_applied if {
	decide(mk_input("t-std", {})).max_tokens == 1024
	decide(mk_input("t-reg", {})).max_tokens == 4096
}

test_tenant_setting_lowers_tier_cap if {
	d := decide(mk_input("t-std", {"tenant": object.union(tenant_input("t-std"), {"max_tokens": 256})}))
	d.max_tokens == 256
}

test_max_tokens_over_cap_allowed_and_capped if {
	d := decide(mk_input("t-std", {"request": {"endpoint": "/v1/chat/completions", "model": "m1", "prompt_tokens": 1, "max_tokens": 2048, "stream": false}}))
	d.allow == true
	d.max_tokens == 1024
}

test_max_tokens_at_cap_allowed if {
	d := decide(mk_input("t-std", {"request": {"endpoint": "/v1/chat/completions", "model": "m1", "prompt_tokens": 1, "max_tokens": 1024, "stream": false}}))
	d.allow == true
}

test_unknown_tier_denied if {
	d := decide(mk_input("t-odd", {}))
	d.allow == false
	d.reason_code == "tier_unknown"
	d.reason == `tier "gold" of the tenant has no max_tokens in data.prefixgate.config.tiers`
}

test_missing_tiers_data_named if {
	d := authz.decision with input as mk_input("t-std", {}) with data.prefixgate.config as {}
	d.reason_code == "tier_unknown"
	contains(d.reason, "data.prefixgate.config.tiers")
}

test_non_regulated_reserved_only_reason_names_pools if {
	t := object.union(tenant_input("t-std"), {"pools": ["eu"]})
	d := decide(mk_input("t-std", {"tenant": t}))
	d.reason_code == "no_entitled_replica"
	contains(d.reason, `reserved pools ["eu"]`)
}

test_concentration_alert_removes_replica if {
	alerts := [{"id": "a1", "kind": "concentration", "replica_id": "d1", "tenant_id": null}]
	d := decide(mk_input("t-std", {"alerts": alerts}))
	d.allow == true
	d.allowed_replicas == {"d2"}
}

test_concentration_alert_kept_when_no_other_healthy if {
	alerts := [{"id": "a1", "kind": "concentration", "replica_id": "d1", "tenant_id": null}]
	cands := [
		{"id": "d1", "pool": "default", "labels": {}, "healthy": true, "load": 9},
		{"id": "d2", "pool": "default", "labels": {}, "healthy": false, "load": 0},
	]
	d := decide(mk_input("t-std", {"alerts": alerts, "candidates": cands}))
	d.allow == true
	"d1" in d.allowed_replicas
}

test_concentration_alert_for_other_tenant_ignored if {
	alerts := [{"id": "a1", "kind": "concentration", "replica_id": "d1", "tenant_id": "t-reg"}]
	d := decide(mk_input("t-std", {"alerts": alerts}))
	d.allowed_replicas == {"d1", "d2"}
}

test_monitor_replica_concentration_alert_removes_replica if {
	alerts := [{"id": "replica_concentration:default:d1", "kind": "replica_concentration", "replica_id": "d1", "tenant_id": null}]
	d := decide(mk_input("t-std", {"alerts": alerts}))
	d.allow == true
	not "d1" in d.allowed_replicas
}

# R3-14: the monitor attributes a replica's concentration to the tenant(s) causing
# it (tenant_id set, id "replica_concentration:<pool>:<replica>:<tenant>"); only
# their requests are steered away, every other tenant keeps the replica.
attributed_alerts := [{"id": "replica_concentration:default:d1:t-std", "kind": "replica_concentration", "replica_id": "d1", "tenant_id": "t-std"}]

test_attributed_replica_concentration_steers_the_named_tenant if {
	d := decide(mk_input("t-std", {"alerts": attributed_alerts}))
	d.allow == true
	d.allowed_replicas == {"d2"}
}

test_attributed_replica_concentration_keeps_the_replica_for_other_tenants if {
	d := decide(mk_input("t-other", {"alerts": attributed_alerts}))
	d.allow == true
	d.allowed_replicas == {"d1", "d2"}
}

test_attributed_and_global_alerts_together if {
	alerts := array.concat(attributed_alerts, [{"id": "replica_concentration:default:d2", "kind": "replica_concentration", "replica_id": "d2", "tenant_id": null}])
	other := decide(mk_input("t-other", {"alerts": alerts}))
	other.allowed_replicas == {"d1"}

	# t-std has both replicas alerted: no unalerted one remains, so it keeps both
	named := decide(mk_input("t-std", {"alerts": alerts}))
	named.allowed_replicas == {"d1", "d2"}
}

test_pool_concentration_alert_without_replica_ignored if {
	alerts := [{"id": "pool_concentration:default:", "kind": "pool_concentration", "replica_id": null, "tenant_id": null}]
	d := decide(mk_input("t-std", {"alerts": alerts}))
	"d1" in d.allowed_replicas
}

test_other_alert_kinds_ignored if {
	alerts := [{"id": "a1", "kind": "cache_miss", "replica_id": "d1", "tenant_id": null}]
	d := decide(mk_input("t-std", {"alerts": alerts}))
	d.allowed_replicas == {"d1", "d2"}
}

test_unsupported_input_version_denied if {
	d := decide(mk_input("t-std", {"version": "2"}))
	d.allow == false
	d.reason_code == "input_version_unsupported"
}
