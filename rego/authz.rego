# PrefixGate routing authorization (Rego v1).
#
# Query:  data.prefixgate.authz.decision
# Input:  policy.input.build_policy_input, input.version "1" (docs/policy.md)
# Data:   data.prefixgate.config.{tenants, tiers, pools, workloads}
# Output: {"allow", "reason_code", "reason",
#          "allowed_replicas", "allowed_pools", "max_tokens"}  (allow only)
#
# Denials are ranked; the lowest rank is reported. Never reads prompt text
# (the input does not carry it).
package prefixgate.authz

cfg := data.prefixgate.config

tenant := cfg.tenants[input.tenant.id]

regulated if tenant.regulated == true

reserved_pools := {p | some p, _ in cfg.pools.reserved}

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
	some c in input.candidates
	c.labels.data_residency == residency
	c.pool in entitled_pools
}

# Alert kinds that name a hot replica: "replica_concentration" is what the
# gateway's concentration monitor (audit.concentration) raises;
# "concentration" is the generic kind of input version 1.
concentration_kinds := {"concentration", "replica_concentration"}

# Active concentration alerts: global (tenant_id null) or for this tenant.
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

denials contains {"rank": 2, "code": "tenant_unknown", "reason": "tenant has no entitlements"} if {
	not tenant
}

denials contains {"rank": 3, "code": "tier_unknown", "reason": "tenant tier has no token cap"} if {
	tenant
	not tier_cap
}

denials contains {"rank": 4, "code": "model_not_entitled", "reason": "tenant is not entitled to the model"} if {
	tenant
	not input.request.model in tenant.models
}

# A request above the cap is not denied: the decision's max_tokens caps it and
# the gateway (PEP) clamps the upstream max_tokens to min(request, caps).

denials contains {"rank": 6, "code": "no_entitled_replica", "reason": "no candidate replica is entitled for the tenant"} if {
	tenant
	count(allowed_replicas) == 0
}

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
