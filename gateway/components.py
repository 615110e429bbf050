"""Wiring: builds every collaborator of the pipeline from a :class:`GatewayConfig`.

:class:`Components` is the one object the HTTP layer talks to. It owns the
lifecycle of the I/O edges (upstream session, health checks, trust-bundle
sources, decision point, audit sinks) and exposes small methods, one per
pipeline step, so that :mod:`gateway.pipeline` reads top to bottom.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import inspect
import logging
import time
import uuid
from collections.abc import Sequence
from typing import Any

import aiohttp
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.routing import BaseRoute

from gateway.auditing import AuditHub
from gateway.authn import Authenticator
from gateway.config import ConfigError, GatewayConfig
from gateway.errors import GatewayError
from gateway.identity import (
    FileBundleSource,
    HttpsBundleSource,
    JwtSvidVerifier,
    TrustBundleStore,
    WorkloadIdentity,
)
from gateway.metrics import GatewayMetrics
from gateway.proxy import UpstreamFailure, make_session
from gateway.engine_metrics import EngineMetricsPoller
from gateway.health import HealthChecker
from routing.index import InProcessPrefixIndex
from routing.load import InProcessLoadTracker
from routing.calibration import CalibratingLoadTracker, Calibration
from routing.config import policy_from_config
from routing.filters import HealthFilter, PolicyDecisionFilter, TenantPoolFilter
from gateway.replicas import Attempt, Replica, ReplicaSet
from routing.router import Router
from policy.decision import Decision, PolicyError
from policy.cache import decide_from_facts
from tenancy.bounds import RequestBounds, request_bounds
from tenancy.keys import KeyRing, PrefixChains, load_master_secret
from tenancy.ledger import InProcessLedger, Reservation, Settlement, TokenLedger, charge_for
from tenancy.limits import ConcurrencyLimited, RateLimited, SourceLimiter, TenantLimiter, clamp_max_tokens
from tenancy.registry import Tenant, TenantConfigError, TenantRegistry
from tenancy.tokenizer import get_tokenizer

__all__ = ["Components", "ChainView"]

log = logging.getLogger("prefixgate")


class ChainView:
    """The prefix chains of one request: ``current`` (indexed) and the
    previous key versions' chains (looked up only, during the rotation grace)."""

    __slots__ = ("current", "kid", "_prev")

    def __init__(self, chains: PrefixChains) -> None:
        self.current = chains.current
        self.kid = chains.kid
        self._prev = tuple(chain for _, chain in chains.previous)

    def previous_chains(self) -> tuple[tuple[bytes, ...], ...]:
        """Chains under older key versions still in their grace period."""
        return self._prev


class Components:
    """Everything the gateway needs, built from ``config``.

    Raises :class:`gateway.config.ConfigError` for a configuration that
    cannot work (no replicas, no trust domain, a salt-less replica in a
    pool shared by several tenants, a missing master secret …).
    """

    def __init__(self, config: GatewayConfig, *, audit: AuditHub | None = None) -> None:
        self.config = config
        self.log = log
        self.metrics = GatewayMetrics()
        if not config.replicas:
            raise ConfigError("at least one replica must be configured")
        if not config.identity.trust_domains:
            raise ConfigError("identity.trust_domains: at least one trust domain is required "
                              "(unauthenticated inference is never allowed)")
        # tenancy
        try:
            secret = load_master_secret(config.tenancy.master_secret_file, config.tenancy.master_secret_env)
            self.keyring = KeyRing(secret, grace_s=config.tenancy.key_grace_s, state_path=config.tenancy.state_file)
            self.registry = TenantRegistry.from_config(config.tenancy.tenants, operators=config.tenancy.operators)
        except TenantConfigError as exc:
            raise ConfigError(f"invalid configuration: tenancy.{exc}") from None
        except Exception as exc:  # KeyRingError: messages never hold secrets
            raise ConfigError(str(exc)) from None
        del secret
        self._check_salt_pools()
        self.limiter = TenantLimiter()
        self.ledger: TokenLedger = InProcessLedger()
        self.source_limiter = SourceLimiter(
            rate=config.identity.unauthenticated_rps, burst=config.identity.unauthenticated_burst
        )
        self.tokenizer = get_tokenizer(config.routing.tokenizer)
        self.served_models = frozenset(config.models)
        # identity
        self.bundles = TrustBundleStore()
        for td, tdc in config.identity.trust_domains.items():
            if tdc.bundle_file:
                self.bundles.add(FileBundleSource(td, tdc.bundle_file, max_stale_s=tdc.max_stale_s))
            else:
                self.bundles.add(HttpsBundleSource(td, tdc.bundle_url, default_refresh_s=tdc.refresh_s,
                                                   max_stale_s=tdc.max_stale_s))
        ic = config.identity
        # the admin listener has its own failed-authentication buckets: a flood of bad
        # tokens on the public port must not lock operators out
        self.admin_source_limiter = SourceLimiter(rate=ic.unauthenticated_rps, burst=ic.unauthenticated_burst)
        try:
            # one verifier, hence one verified-token cache, per listener and audience
            cache = {"cache_size": ic.verified_token_cache_size, "cache_max_ttl_s": ic.verified_token_cache_max_ttl_s}
            self.verifier = JwtSvidVerifier(self.bundles, ic.audience, ic.trust_domains.keys(), ic.leeway_s,
                                            ic.max_lifetime_s, **cache)
            self.admin_verifier = JwtSvidVerifier(self.bundles, ic.admin_audience, ic.trust_domains.keys(),
                                                  ic.leeway_s, ic.max_lifetime_s, **cache)
            self.authn = Authenticator(self.verifier, self.source_limiter, ic.trusted_proxies)
            self.admin_authn = Authenticator(self.admin_verifier, self.admin_source_limiter, ic.trusted_proxies)
        except ValueError as exc:  # also caught by load_config; a config built otherwise lands here
            raise ConfigError(f"identity: {exc}") from None
        # routing
        rc = config.routing
        policy = policy_from_config(rc.policy)  # validated by the config schema
        self.replica_set = ReplicaSet(
            [Replica(r.id, r.url, r.pool, dict(r.labels), r.cache_salt) for r in config.replicas],
            failure_threshold=config.health.breaker_failures,
            cooldown_s=config.health.breaker_cooldown_s,
        )
        self.index = InProcessPrefixIndex(rc.index_capacity_blocks)
        # calibration (issue 15): first-byte times and engine metrics, only when the policy asks
        self.calibration: Calibration | None = None
        loads: Any = InProcessLoadTracker()
        if getattr(rc.policy, "calibrate", False):
            self.calibration = Calibration(prior_rate=rc.policy.prefill_tokens_per_s)
            loads = CalibratingLoadTracker(loads, self.calibration, time.monotonic)
        self.router = Router(policy, self.index, loads, rc.block_size, self.calibration)
        self.engine_metrics: EngineMetricsPoller | None = None
        # audit first (policy changes are audited), then the decision point
        try:
            self.audit = audit or AuditHub.from_config(config.audit, router_factor=getattr(policy, "load_factor", 1.25),
                                                       tracing=config.tracing.model_dump())
        except (ValueError, OSError, KeyError) as exc:
            raise ConfigError(f"audit: {exc}") from None
        monitor = getattr(self.audit, "monitor", None)
        if monitor is not None:  # so traffic piling onto one replica is judged against all of its pool
            for pool in {r.pool for r in config.replicas}:
                monitor.set_pool_members(pool, [r.id for r in config.replicas if r.pool == pool])
        self.pdp = _build_pdp(config, self.audit)
        self.session: aiohttp.ClientSession | None = None  # type: ignore[assignment]
        self.health: HealthChecker | None = None
        self._started = False

    # ---------------------------------------------------------------- lifecycle
    async def start(self) -> None:
        """Open the upstream session, start health checks, the PDP and audit sinks."""
        if self._started:
            return
        u = self.config.upstream
        self.session = make_session(u.pool_size, u.connect_timeout_s, u.read_timeout_s)
        try:
            await self.pdp.start()
            await self.audit.start()
        except BaseException:
            # e.g. the audit directory is in use: release what was opened, then fail
            await self.session.close()
            with contextlib.suppress(Exception):
                await self.pdp.close()
            with contextlib.suppress(Exception):
                await self.audit.close()
            raise
        h = self.config.health
        self.health = HealthChecker(
            self.replica_set, self.session, interval_s=h.interval_s, timeout_s=h.timeout_s,
            unhealthy_after=h.unhealthy_after, healthy_after=h.healthy_after, on_restart=self._on_restart,
        )
        await self.health.check_once()
        self.health.start()
        if self.calibration is not None:
            self.engine_metrics = EngineMetricsPoller(self.replica_set, self.session, self.calibration,
                                                      interval_s=h.interval_s, timeout_s=h.timeout_s)
            self.engine_metrics.start()
        self._started = True

    async def stop(self) -> None:
        """Stop health checks, flush audit (final checkpoint), close sessions."""
        if not self._started:
            return
        self._started = False
        if self.health is not None:
            await self.health.stop()
        if self.engine_metrics is not None:
            await self.engine_metrics.stop()
        await self.pdp.close()
        await self.audit.close()
        for td in self.bundles.trust_domains():
            await self.bundles.source(td).aclose()
        if self.session is not None:
            await self.session.close()

    def _on_restart(self, replica_id: str) -> None:
        self.router.forget_replica(replica_id)
        self.log.info("replica %s restarted: its prefix index entries are dropped", replica_id)

    # ------------------------------------------------------------ pipeline steps
    def audit_accepting(self) -> bool:
        """False when the audit trail cannot take more events (fail closed → 503)."""
        return self.audit.accepting

    def resolve_tenant(self, identity: WorkloadIdentity) -> Tenant:
        """Map a workload to its tenant; raises 403 for an unmapped workload."""
        tenant = self.registry.resolve(str(identity.spiffe_id))
        if tenant is None:
            raise GatewayError(403, "unknown_workload", "this workload is not mapped to any tenant")
        return tenant

    def admit(self, tenant: Tenant) -> Any:
        """Check the tenant's request rate and concurrency; returns a lease (release it)."""
        try:
            return self.limiter.admit(tenant, time.monotonic())
        except RateLimited as exc:
            raise _too_many(exc.retry_after_s, "rate_limited", "tenant request rate exceeded") from None
        except ConcurrencyLimited as exc:
            raise _too_many(getattr(exc, "retry_after_s", 1.0), "concurrency_limited",
                            "tenant concurrent request limit reached") from None

    def request_bounds(self, tenant: Tenant) -> RequestBounds:
        """The tenant's effective per-request bounds (see :mod:`tenancy.bounds`)."""
        return request_bounds(tenant, self.tokenizer, max_messages_ceiling=self.config.limits.max_messages)

    def admit_sequences(self, tenant: Tenant, lease: Any, sequences: int) -> None:
        """A batch of ``sequences`` prompts takes that many request units and concurrency slots
        (the first was taken by :meth:`admit`); 429 when they are not available."""
        try:
            self.limiter.add_sequences(tenant, lease, sequences - 1, time.monotonic())
        except RateLimited as exc:
            raise _too_many(exc.retry_after_s, "rate_limited", "tenant request rate exceeded") from None
        except ConcurrencyLimited as exc:
            raise _too_many(exc.retry_after_s, "concurrency_limited",
                            "tenant concurrent request limit reached (each prompt of a batch takes a slot)") from None

    def prompt_tokens(self, bounds: RequestBounds, req: Any) -> tuple[list[int], int]:
        """Size-check and tokenize each sequence of ``req``; return (tokens to hash, total prompt tokens).

        Cheapest first: each sequence's UTF-8 size (with the chat request's
        tools and other token-bearing fields, ``req.extra_text``) against
        ``max_prompt_bytes`` (400 ``prompt_too_large``, nothing tokenized),
        then tokens with early stop at ``max_prompt_tokens + 1`` (400
        ``context_length_exceeded``). The tokens to hash are the prompt's
        own (``extra_text`` is counted, never hashed).
        """
        limit, max_bytes = bounds.max_prompt_tokens, bounds.max_prompt_bytes
        if max_bytes is not None:
            for size in req.prompt_bytes:
                if size > max_bytes:
                    raise GatewayError(400, "prompt_too_large",
                                       f"prompt has {size} bytes; this tenant's limit is {max_bytes}", param=None)
        hashed: list[int] = []
        total = 0
        for i, text in enumerate(req.prompts):
            ids = self.tokenizer.encode(text, limit)
            n = len(ids)
            if i == 0 and req.extra_text:
                n += len(self.tokenizer.encode(req.extra_text, None if limit is None else max(0, limit - n)))
            if limit is not None and n > limit:
                raise GatewayError(400, "context_length_exceeded",
                                   f"prompt has more than {limit} tokens; this tenant's limit is {limit}"
                                   + (" per prompt" if len(req.prompts) > 1 else ""))
            hashed.extend(ids)
            total += n
        return hashed, total

    def check_prompt(self, tenant: Tenant, prompt_tokens: int, sequences: int = 1,
                     output_tokens: int = 0) -> Reservation:
        """Per-request prompt size, then reserve the request's tokens in the ledger (400 / 429).

        ``prompt_tokens`` is the total of all ``sequences`` (the per-sequence
        limit was checked while counting, :meth:`prompt_tokens`);
        ``output_tokens``: the most output it may produce (``max_tokens`` x
        sequences, before the policy may lower it: :meth:`Reservation.lower_output`).
        Returns the :class:`~tenancy.ledger.Reservation` the request's end
        settles (:meth:`settle`); 429 ``token_rate_limited`` when the tenant's
        prompt- or output-token bucket cannot cover it (nothing is taken then).
        """
        if prompt_tokens == 0:
            raise GatewayError(400, "invalid_request", "prompt must not be empty", param="prompt")
        limit = tenant.max_prompt_tokens
        if limit is not None and prompt_tokens > limit * max(1, sequences):
            raise GatewayError(400, "context_length_exceeded",
                               f"prompt has {prompt_tokens} tokens; this tenant's limit is {limit}")
        try:
            res = self.ledger.reserve(tenant, prompt_tokens, output_tokens, time.monotonic())
        except RateLimited as exc:
            what = "output" if exc.reason == "tenant_output_tokens" else "prompt"
            raise _too_many(exc.retry_after_s, "token_rate_limited",
                            f"tenant {what}-token rate exceeded") from None
        m = self.metrics
        m.tenant_tokens_reserved.labels(tenant.id, "prompt").inc(prompt_tokens)
        m.tenant_tokens_reserved.labels(tenant.id, "output").inc(output_tokens)
        return res

    def output_cap(self, requested: int | None, tenant: Tenant) -> int:
        """The most output tokens per sequence before the policy decision (its cap can only lower it)."""
        cap = clamp_max_tokens(requested, tenant.max_output_tokens, None, default=self.config.limits.max_output_tokens)
        return max(1, min(cap, self.config.limits.max_output_tokens))

    def lower_reservation(self, res: Reservation, output_tokens: int) -> None:
        """The policy lowered ``max_tokens``: hold only ``output_tokens`` (the rest refunded now)."""
        before = res.output_tokens
        res.lower_output(output_tokens)
        if res.output_tokens < before:
            self.metrics.tenant_tokens_refunded.labels(res.tenant_id, "output").inc(before - res.output_tokens)

    def settle(self, res: Reservation, *, usage: dict[str, Any] | None, progress: str,
               relayed_output: int) -> Settlement:
        """Reconcile a request's reservation when it ends, however it ended (see
        :func:`tenancy.ledger.charge_for`); counts the charge and refund per tenant."""
        prompt, output, basis = charge_for(res.prompt_tokens, res.output_tokens, usage=usage,
                                           progress=progress, relayed_output=relayed_output)
        already = res.settlement
        s = res.settle(prompt, output, basis)
        if already is None:
            m, tid = self.metrics, res.tenant_id
            m.tenant_tokens_charged.labels(tid, "prompt").inc(s.charged_prompt)
            m.tenant_tokens_charged.labels(tid, "output").inc(s.charged_output)
            m.tenant_tokens_refunded.labels(tid, "prompt").inc(s.refunded_prompt)
            m.tenant_tokens_refunded.labels(tid, "output").inc(s.refunded_output)
            m.tenant_charges.labels(tid, s.basis).inc()
        return s

    def upstream_user(self, tenant: Tenant, identity: WorkloadIdentity) -> str | None:
        """The ``user`` field sent upstream: None (dropped, the default) or the workload's stable pseudonym
        (``forward_user: pseudonym``, per tenant or in ``tenancy``); never the client's own value."""
        mode = tenant.forward_user or self.config.tenancy.forward_user
        if mode != "pseudonym":
            return None
        return self.keyring.user_pseudonym(tenant.id, str(identity.spiffe_id))

    def prefix_chains(self, tenant: Tenant, tokens: Sequence[int]) -> ChainView:
        """The tenant-keyed HMAC block-hash chains of ``tokens`` (current + grace versions)."""
        rc = self.config.routing
        limit = rc.max_prefix_blocks * rc.block_size
        return ChainView(self.keyring.prefix_chain(tenant.id, tokens[:limit], rc.block_size))

    def prefix_fingerprint(self, tenant: Tenant, chains: ChainView) -> str | None:
        """A keyed, truncated (64-bit) fingerprint of the request's first full block.

        It is an HMAC of a chain key that is itself keyed per tenant, so two
        tenants' fingerprints of the same prompt never match; audit events use
        it to group requests of one tenant sharing a prefix, never raw hashes.
        """
        if not chains.current:
            return None
        return hmac.new(chains.current[0], b"pg-audit-fp-v1", hashlib.sha256).hexdigest()[:16]

    def listed_models(self, tenant: Tenant) -> list[str]:
        """The models ``GET /v1/models`` lists for ``tenant``: served by the gateway and in the
        tenant's registry entitlement (sorted). The policy decides entitlement from the same
        registry entry (``input.tenant.models``), so the two cannot disagree
        (tests/quickstart/test_i13_one_source.py)."""
        return sorted(m for m in self.served_models if m in tenant.models)

    def candidates(self, tenant: Tenant) -> list[Replica]:
        """Replicas currently routable (healthy, breaker closed) in the tenant's configured
        pools (all pools when the tenant lists none). Only these go to the PDP: a policy can
        narrow them, never widen them (defence in depth against a policy omitting both lists)."""
        in_pools = TenantPoolFilter(tenant.pools).filter(self.replica_set.all())
        return HealthFilter(self.replica_set.routable_ids()).filter(in_pools)

    async def decide(self, identity: WorkloadIdentity, tenant: Tenant, req: Any, prompt_tokens: int,
                     candidates: list[Replica], rec: Any) -> Decision:
        """Ask the PDP; a deny raises 403, a PDP failure 503 (fail closed)."""
        loads = self.router.loads
        cand_docs = [
            {"id": r.id, "pool": r.pool, "labels": dict(r.labels), "healthy": True,
             "load": loads.snapshot(r.id).running_requests}
            for r in candidates
        ]
        tview = tenant.policy_view()
        tview["max_tokens"] = tenant.max_output_tokens
        try:  # issue 14: on a decision-cache hit the input document is never built
            decision = await decide_from_facts(
                getattr(self.pdp, "dp", self.pdp),
                {"spiffe_id": str(identity.spiffe_id), "trust_domain": identity.trust_domain, "claims": identity.claims},
                tview,
                {"endpoint": rec.endpoint, "model": req.model, "prompt_tokens": prompt_tokens,
                 "max_tokens": req.max_tokens, "stream": req.stream, "sequences": req.sequences},
                cand_docs,
                self.audit.active_alerts(),
                time.time(),
            )
        except PolicyError:
            rec.reason_code = "policy_unavailable"
            raise GatewayError(503, "policy_unavailable", "the policy decision point is unavailable") from None
        self.metrics.policy_cache.labels("hit" if decision.cached else "miss").inc()
        rec.decision_id, rec.reason_code, rec.reason = decision.decision_id, decision.reason_code, decision.reason
        if not decision.allow:
            raise GatewayError(403, decision.reason_code or "denied",
                               _denial_message(decision.reason_code, decision.reason),
                               extra={"decision_id": decision.decision_id}, outcome="denied")
        return decision

    def clamp_max_tokens(self, requested: int | None, tenant: Tenant, decision: Decision) -> int:
        """Output-token cap: request → min(tenant cap, policy cap, gateway cap); absent → that cap."""
        cap = clamp_max_tokens(requested, tenant.max_output_tokens, decision.max_tokens,
                               default=self.config.limits.max_output_tokens)
        return max(1, min(cap, self.config.limits.max_output_tokens))

    def allowed_candidates(self, candidates: list[Replica], decision: Decision) -> list[Replica]:
        """Enforce the decision: keep the candidates the policy allows (replica ids and/or pools)."""
        return PolicyDecisionFilter(decision.allowed_replicas, decision.allowed_pools).filter(candidates)

    def replica(self, replica_id: str) -> Replica:
        """The configured replica with this id."""
        return self.replica_set.get(replica_id)

    def cache_salt(self, tenant: Tenant) -> str:
        """The tenant's upstream ``cache_salt`` (keyed, versioned; see docs/tenancy.md)."""
        return self.keyring.cache_salt(tenant.id)

    def upstream_headers(self, rec: Any) -> dict[str, str]:
        """Headers sent to a replica: request id and trace context (never client credentials)."""
        headers = {"X-Request-Id": rec.request_id}
        self.audit.inject_trace_headers(headers, rec)
        return headers

    def upstream_failed(self, attempt: Attempt, fail: UpstreamFailure) -> None:
        """Count a failed call and settle its breaker attempt: a replica fault
        (5xx, timeout, connect error, reset, broken answer) is a failure; an
        answer below 500 (the client's fault, 429 included) shows the replica
        alive and is a success (docs/routing.md, "Circuit breaker")."""
        self.metrics.upstream_failures.labels(fail.kind).inc()
        if fail.replica_fault:
            attempt.failed()
        else:
            attempt.succeeded()

    def upstream_ok(self, replica_id: str, instance_id: str | None) -> None:
        """A replica started answering; a changed instance id means it restarted.
        (The breaker verdict waits for the end of the answer: see the pipeline.)"""
        if instance_id and self.replica_set.observe_instance(replica_id, instance_id):
            self._on_restart(replica_id)

    def record(self, rec: Any) -> None:
        """Metrics + one audit event + concentration monitor for a finished request."""
        m = self.metrics
        m.requests.labels(rec.endpoint, str(rec.status), rec.outcome).inc()
        m.request_seconds.labels(rec.endpoint).observe((rec.t_end or rec.t0) - rec.t0)
        if rec.tenant_id:
            m.tenant_requests.labels(rec.tenant_id, rec.outcome).inc()
        if rec.replica and rec.t_first_byte is not None:
            m.ttft_seconds.labels(rec.endpoint).observe(rec.t_first_byte - rec.t0)
            m.replica_requests.labels(rec.replica, rec.pool or "").inc()
            m.prompt_tokens.inc(rec.prompt_tokens or 0)
            m.prefix_tokens.labels("available").inc(rec.available_prefix_tokens or 0)
            m.prefix_tokens.labels("predicted").inc(rec.predicted_prefix_tokens or 0)
            if rec.cached_tokens is not None:
                m.prefix_tokens.labels("delivered").inc(rec.cached_tokens)
        self.audit.record_request(rec)

    def record_refusal(self, request: Request, endpoint: str, err: GatewayError,
                       identity: WorkloadIdentity | None = None) -> None:
        """Audit a refusal on a non-inference endpoint (``/v1/models``, the admin listener)."""
        from gateway.pipeline import RequestRecord

        rec = RequestRecord(request_id=_rid(), endpoint=endpoint[:128],
                            client_addr=self.authn.source(request), t0=time.perf_counter())
        if identity is not None:
            rec.spiffe_id, rec.trust_domain = str(identity.spiffe_id), identity.trust_domain
        rec.status, rec.outcome, rec.error_code, rec.t_end = err.status, err.outcome, err.code, time.perf_counter()
        self.audit.record_request(rec)

    # ---------------------------------------------------------------- admin
    async def authorize_operator(self, request: Request) -> WorkloadIdentity:
        """Admin listener guard: a JWT-SVID for the admin audience from an operator.

        Raises ``HTTPException`` 401 (no/invalid credential) or 403 (not an operator).
        """
        try:
            identity = await self.admin_authn.authenticate(request)
        except GatewayError as err:
            self.record_refusal(request, "admin", err)  # the path is client-chosen: not recorded
            raise HTTPException(err.status, err.message, headers=err.headers) from None
        if not self.registry.is_operator(str(identity.spiffe_id)):
            err = GatewayError(403, "not_an_operator", "operator identity required")
            self.record_refusal(request, "admin", err, identity=identity)
            raise HTTPException(403, "operator identity required")
        return identity

    def admin_routes(self) -> list[BaseRoute]:
        """Operator routes of tenancy (keys, salts, registry) and policy management."""
        from tenancy.admin import admin_routes as tenancy_routes

        async def authorize(request: Request) -> dict[str, Any]:
            ident = await self.authorize_operator(request)
            return {"spiffe_id": str(ident.spiffe_id), "trust_domain": ident.trust_domain}

        routes: list[BaseRoute] = []
        tc = self.config.tenancy
        routes += tenancy_routes(
            self.keyring, self._reload_registry, authorize,
            master_loader=lambda: load_master_secret(tc.master_secret_file, tc.master_secret_env),
            on_change=self.audit.record_operator, registry=self.registry,
        )
        store = getattr(self.pdp, "store", None)
        if store is not None:
            from policy.admin import admin_routes as policy_routes

            routes += policy_routes(store, authorize)
        return routes

    def _reload_registry(self) -> TenantRegistry:
        from gateway.config import load_config

        fresh = load_config(self.config_path) if getattr(self, "config_path", None) else self.config
        self.registry = self.registry.reload(fresh.tenancy.tenants, operators=fresh.tenancy.operators)
        self.pdp.clear_cache()  # tenant facts reach the policy through its input: no decision outlives them
        keep = {t.id for t in self.registry.tenants()}
        self.limiter.forget(keep)  # free removed tenants' buckets
        self.ledger.forget(keep)
        return self.registry

    async def readiness(self) -> list[str]:
        """:meth:`readiness_problems` plus the decision point's health
        (remote OPA: a cached ``/health`` probe or the last decision's outcome;
        embedded: a policy is loaded). Empty list: ready."""
        problems = self.readiness_problems()
        if self._started:
            ok, reason = await self.pdp.health()
            if not ok:
                problems.append(f"policy decision point unavailable: {reason}")
        return problems

    def readiness_problems(self) -> list[str]:
        """Why the gateway cannot route now (empty list: ready)."""
        problems = []
        if not self._started:
            problems.append("not started")
        if not self.replica_set.routable_ids():
            problems.append("no healthy replica")
        if not self.audit.accepting:
            problems.append("audit trail not accepting events")
        return problems

    def refresh_gauges(self) -> None:
        """Update gauges before a scrape."""
        m = self.metrics
        routable = set(self.replica_set.routable_ids())
        m.healthy_replicas.set(len(routable))
        for r in self.replica_set.all():
            m.replica_healthy.labels(r.id).set(1 if r.id in routable else 0)
            m.replica_load_tokens.labels(r.id).set(self.router.loads.snapshot(r.id).tokens)
        m.audit_dropped.set(self.audit.dropped)

    def admin_metrics_text(self) -> bytes:
        """Extra admin-only exposition (audit and concentration registries)."""
        return self.audit.admin_metrics_text()

    def replica_status(self) -> list[dict[str, Any]]:
        """Per-replica health, breaker and load, for operators."""
        out = []
        routable = set(self.replica_set.routable_ids())
        for r in self.replica_set.all():
            load = self.router.loads.snapshot(r.id)
            out.append({"id": r.id, "pool": r.pool, "labels": dict(r.labels), "routable": r.id in routable,
                        "running": load.running_requests, "load_tokens": load.tokens,
                        "index_blocks": self.index.replica_blocks(r.id)})
        return out

    def routing_status(self) -> dict[str, Any]:
        """Router counters: available / predicted / delivered prefix tokens."""
        c = self.router.counters()
        return {k: getattr(c, k) for k in c.__dataclass_fields__}

    def configuration_warnings(self) -> list[str]:
        """Tenant entries that load but cannot be served as written (logged at start, never fatal):
        a model the gateway does not serve, a pool no replica is in, a regulated tenant without a
        replica labelled with its ``data_residency``."""
        out: list[str] = []
        pools = {r.pool for r in self.config.replicas}
        for t in self.registry.tenants():
            for m in sorted(t.models - self.served_models):
                out.append(f"tenant {t.id}: model {m!r} is not in `models` (requests for it answer 404)")
            for p in sorted(t.pools - pools):
                out.append(f"tenant {t.id}: no replica is in pool {p!r}")
            if t.regulated and not any(
                r.pool in t.pools and r.labels.get("data_residency") == t.data_residency for r in self.config.replicas
            ):
                out.append(f"tenant {t.id}: regulated, but no replica in its pools has labels.data_residency "
                           f"{t.data_residency!r} (its requests are denied no_entitled_replica)")
        return out

    def _check_salt_pools(self) -> None:
        for r in self.config.replicas:
            if r.cache_salt:
                continue
            users = [t.id for t in self.registry.tenants() if r.pool in t.pools]
            if len(users) > 1:
                raise ConfigError(
                    f"replica {r.id} has cache_salt off but its pool {r.pool!r} serves several tenants "
                    f"({', '.join(sorted(users))}); a salt-less replica may only serve one tenant"
                )


def _build_pdp(config: GatewayConfig, audit: AuditHub) -> Any:
    """The decision point of ``config.policy``: embedded OPA (default) or remote, behind a decision cache.

    With ``policy.versions_dir`` set, a :class:`policy.store.PolicyStore` manages
    the embedded engine's directory (operator API; every change versioned and audited).
    """
    from policy.cache import CachedDecisionPoint, DecisionCache

    from policy.builtins import allowed_builtins

    pc = config.policy
    allowed = allowed_builtins(pc.allowed_builtins)
    try:
        if pc.mode == "embedded":
            from policy.embedded import EmbeddedOpa

            inner: Any = EmbeddedOpa(pc.resolved_dir(), timeout_s=pc.timeout_s, offload=pc.offload,
                                     allowed_builtins=allowed)
        else:
            import os

            from policy.remote import RemoteOpa

            if not pc.url:
                raise ConfigError("policy.url is required in remote mode")
            token = os.environ.get(pc.token_env) if pc.token_env else None
            inner = RemoteOpa(pc.url, token=token, ca_file=pc.ca_file, timeout_s=pc.timeout_s,
                              health_interval_s=pc.health_interval_s,
                              health_timeout_s=max(pc.timeout_s, 0.5))
    except ConfigError:
        raise
    except Exception as exc:
        raise ConfigError(f"policy: {exc}") from None
    store = None
    if pc.versions_dir:
        from policy.store import PolicyStore, RemoteOpaTarget

        target = inner if pc.mode == "embedded" else RemoteOpaTarget(inner.client, on_applied=inner.notify_change)
        try:
            store = PolicyStore(pc.resolved_dir(), pc.versions_dir, target=target, allowed_builtins=allowed,
                                on_change=lambda rec: audit.record_operator({"action": "policy_change",
                                                                             **rec.to_dict()}))
        except Exception as exc:  # PolicyCompileError (e.g. a refused built-in), OSError
            raise ConfigError(f"policy: {exc}") from None
    if pc.cache_ttl_s <= 0 or pc.cache_max_entries == 0:
        return _Lifecycle(inner, store=store)
    cached = CachedDecisionPoint(inner, DecisionCache(ttl_s=pc.cache_ttl_s, max_entries=pc.cache_max_entries))
    return _Lifecycle(cached, inner, store=store)


class _Lifecycle:
    """Gives any decision point ``start``/``close`` (no-ops where it has none)."""

    def __init__(self, dp: Any, inner: Any | None = None, store: Any | None = None) -> None:
        self.dp = dp
        self.inner = inner or dp
        self.store = store

    async def decide(self, input: dict[str, Any]) -> Decision:
        return await self.dp.decide(input)

    def clear_cache(self) -> None:
        """Drop every cached decision (no-op without a decision cache)."""
        from policy.cache import CachedDecisionPoint

        if isinstance(self.dp, CachedDecisionPoint):
            self.dp.clear()

    async def start(self) -> None:
        await _maybe_await(getattr(self.inner, "start", None))

    async def health(self) -> tuple[bool, str]:
        """``(ok, reason)`` of the decision point (its own ``health`` if it has one)."""
        fn = getattr(self.inner, "health", None)
        if fn is None:
            return True, ""
        return await fn()

    async def close(self) -> None:
        await _maybe_await(getattr(self.inner, "close", None))


async def _maybe_await(fn: Any) -> None:
    if fn is None:
        return
    res = fn()
    if inspect.isawaitable(res):
        await res


#: Denials caused by a gap in the tenant's configuration or the policy data
#: (rego/authz.rego): their reason names what is missing and is shown to the
#: client; every other reason goes to the audit trail only.
CONFIG_GAP_CODES = frozenset({"tenant_entitlements_missing", "tier_unknown", "residency_missing"})


def _denial_message(code: str | None, reason: str | None) -> str:
    """The client message of a policy denial: for a configuration gap (:data:`CONFIG_GAP_CODES`) the
    policy's own reason (printable ASCII, at most 300 characters), else a fixed text."""
    text = "".join(ch for ch in (reason or "") if 0x20 <= ord(ch) < 0x7F)[:300]
    if code in CONFIG_GAP_CODES and text:
        return f"the routing policy denied this request: {text}"
    return "the routing policy denied this request"


def _too_many(retry_after_s: float, code: str, message: str) -> GatewayError:
    return GatewayError(429, code, message, headers={"Retry-After": str(max(1, int(retry_after_s + 0.999)))},
                        outcome="rate_limited")


def _rid() -> str:
    return uuid.uuid4().hex
