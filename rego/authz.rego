# PrefixGate routing authorization (Rego v1).
#
# Query:  data.prefixgate.authz.decision
# Input:  policy.input.build_policy_input, input.version "1" (docs/policy.md)
# Data:   data.prefixgate.config.{tiers, pools, workloads}: operator facts the
#         tenant registry does not hold (tier token caps, reserved pools, the
#         workload deny-list). Every tenant fact (models, pools, tier,
#         regulated, data_residency, max_tokens) comes from input.tenant, i.e.
#         from the gateway's tenant registry (the YAML `tenancy.tenants`),
#         its single source (docs/tenancy.md, "Where each tenant fact lives").
# Output: {"allow", "reason_code", "reason",
#          "allowed_replicas", "allowed_pools", "max_tokens"}  (allow only)
#
# Denials are ranked; the lowest rank is reported. A denial caused by
# missing input or data names what is missing in its reason. Never reads
# prompt text (the input does not carry it).
package prefixgate.authz

cfg := data.prefixgate.config

tenant := input.tenant

regulated if tenant.regulated == true

reserved_pools := {p | some p, _ in cfg.pools.reserved}

# Fields of input.tenant the decision needs (input version 1 always has them).
required_tenant_fields := ["id", "tier", "models", "pools"]

missing_tenant_fields contains f if {
	some f in required_tenant_fields
	object.get(object.get(input, "tenant", {}), f, null) == null
}

# ---------------------------------------------------------------- pools

# A non-regulated tenant never reaches a reserved pool, even if its
# entitlement lists one; a regulated tenant keeps all its entitled pools
# (residency is then checked per replica).
entitled_pools contains p if {
	some p in tenant.pools
	pool_permitted(p)
}

pool_permitted(_) if regulated

pool_permitted(p) if {
	not regulated
	not p in reserved_pools
}

# ---------------------------------------------------------------- replicas

# A non-regulated tenant: every candidate in an entitled pool. A regulated
# tenant: only replicas whose data_residency label equals its residency.
entitled_replicas contains c.id if {
	not regulated
	some c in input.candidates
	c.pool in entitled_pools
}

entitled_replicas contains c.id if {
	regulated
	residency := tenant.data_residency
	is_string(residency)
	residency != ""
	some c in input.candidates
	c.labels.data_residency == residency
	c.pool in entitled_pools
}

# Alert kinds that name a hot replica: "replica_concentration" is what the
# gateway's concentration monitor (audit.concentration) raises;
# "concentration" is the generic kind of input version 1.
concentration_kinds := {"concentration", "replica_concentration"}

# Active concentration alerts: global (tenant_id null) or for this tenant.
# The monitor attributes a replica's concentration to the few tenants that
# cause it (R3-14: tenant_id set, one alert per tenant), so their requests are
# steered away and other tenants keep the replica (and their warm prefixes on
# it); it raises a global alert only when no small set of tenants explains the
# concentration (docs/audit.md, "Concentration alerts").
alerted_replicas contains a.replica_id if {
	some a in input.alerts
	a.kind in concentration_kinds
	is_string(a.replica_id)
	alert_applies(a)
}

alert_applies(a) if a.tenant_id == null

alert_applies(a) if a.tenant_id == input.tenant.id

# Is there a healthy, unalerted, entitled candidate? (a boolean: evaluation
# stops at the first one)
some_healthy_unalerted if {
	some c in input.candidates
	c.healthy == true
	c.id in entitled_replicas
	not c.id in alerted_replicas
}

# An alerted replica leaves the allowed set only if another healthy,
# unalerted, entitled candidate remains. No alert (the common case): the
# entitled set as is.
allowed_replicas := entitled_replicas if {
	count(alerted_replicas) == 0
} else := entitled_replicas - alerted_replicas if {
	some_healthy_unalerted
} else := entitled_replicas

# ---------------------------------------------------------------- tokens

tier_cap := cfg.tiers[tenant.tier].max_tokens

token_caps contains tier_cap

token_caps contains input.tenant.max_tokens if is_number(input.tenant.max_tokens)

max_tokens := min(token_caps) if tier_cap

# ---------------------------------------------------------------- denials

denials contains {"rank": 0, "code": "input_version_unsupported", "reason": "policy input version is not 1"} if {
	input.version != "1"
}

denials contains {"rank": 1, "code": "workload_denied", "reason": "workload SPIFFE ID is on the deny-list"} if {
	input.identity.spiffe_id in cfg.workloads.denied
}

denials contains {
	"rank": 2, "code": "tenant_entitlements_missing",
	"reason": sprintf("policy input lacks tenant.%s (the gateway's tenant registry supplies it)",
		[concat(", tenant.", sort(missing_tenant_fields))]),
} if {
	count(missing_tenant_fields) > 0
}

denials contains {
	"rank": 3, "code": "tier_unknown",
	"reason": sprintf("tier %q of the tenant has no max_tokens in data.prefixgate.config.tiers", [tenant.tier]),
} if {
	count(missing_tenant_fields) == 0
	not tier_cap
}

denials contains {"rank": 4, "code": "model_not_entitled", "reason": "tenant is not entitled to the model (tenancy.tenants[].models)"} if {
	count(missing_tenant_fields) == 0
	not input.request.model in tenant.models
}

# A request above the cap is not denied: the decision's max_tokens caps it and
# the gateway (PEP) clamps the upstream max_tokens to min(request, caps).

denials contains {"rank": 5, "code": "residency_missing", "reason": "the tenant is regulated but has no data_residency (tenancy.tenants[].data_residency)"} if {
	count(missing_tenant_fields) == 0
	regulated
	not residency_given
}

residency_given if {
	is_string(tenant.data_residency)
	tenant.data_residency != ""
}

denials contains {"rank": 6, "code": "no_entitled_replica", "reason": no_replica_reason} if {
	count(missing_tenant_fields) == 0
	count(allowed_replicas) == 0
}

no_replica_reason := sprintf("no candidate replica is in the tenant's pools %v with labels.data_residency %q", [sort(entitled_pools), tenant.data_residency]) if {
	regulated
	residency_given
} else := sprintf("no candidate replica is in the tenant's permitted pools %v (tenant pools %v; reserved pools %v are for regulated tenants only)", [sort(entitled_pools), sort(tenant.pools), sort(reserved_pools)])

first_denial := d if {
	some d in denials
	every o in denials {
		o.rank >= d.rank
	}
}

# ---------------------------------------------------------------- decision

decision := {
	"allow": false,
	"reason_code": first_denial.code,
	"reason": first_denial.reason,
} if {
	count(denials) > 0
} else := {
	"allow": true,
	"reason_code": "allowed",
	"reason": "entitled",
	"allowed_replicas": allowed_replicas,
	"allowed_pools": entitled_pools,
	"max_tokens": max_tokens,
}
