"""Builds the gateway once from its configuration: :func:`build` returns a
:class:`Gateway`, a frozen set of typed collaborators, one per step of the
request flow (docs/architecture.md), started and stopped as :class:`Lifecycle` s.

Raises :class:`gateway.config.ConfigError` for a configuration that cannot
work (no replicas, no trust domain, a salt-less replica in a pool shared by
several tenants, a missing master secret …).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from gateway.admin import Admin
from gateway.admission import Admission
from gateway.auditing import AuditHub
from gateway.authn import Authenticator
from gateway.body_budget import BodyBudget
from gateway.config import ConfigError, GatewayConfig
from gateway.cpu_budget import CpuBudget
from gateway.flow import FlowControl, NotifyingLoadTracker
from gateway.health import HealthChecker
from gateway.identity import (
    FileBundleSource,
    HttpsBundleSource,
    JwtSvidVerifier,
    TrustBundleStore,
)
from gateway.metrics import GatewayMetrics
from gateway.overload import OverloadGuard
from gateway.pep import DecisionPoint, PolicyEnforcementPoint, build_decision_point
from gateway.prefix_keys import PrefixKeys
from gateway.readiness import Readiness
from gateway.recording import Recorder
from gateway.replicas import Replica, ReplicaSet
from gateway.tenant_warnings import entry_warnings, tenant_limit_warnings
from gateway.salt_pools import salt_pool_error
from gateway.prep_thread import PrepThread
from gateway.upstream import Upstream
from routing.calibration import CalibratingLoadTracker, Calibration
from routing.config import policy_from_config
from routing.index import InProcessPrefixIndex, PrefixIndex
from routing.load import InProcessLoadTracker, LoadTracker
from routing.router import Router
from tenancy.keys import KeyRing, KeyStateDirectoryMissing, KeyStateInUse, load_master_secret
from tenancy.ledger import TokenLedger
from tenancy.limits import TenantLimiter
from tenancy.registry import TenantConfigError, TenantRegistry
from tenancy.shared import SharedLimits, StateSetupError, make_limits
from tenancy.shared_failover import FailoverLedger, FailoverLimiter, unavailable_errors
from tenancy.source_limits import SourceLimiter
from tenancy.tiers import TierWeights
from tenancy.tokenizer import get_tokenizer

if TYPE_CHECKING:  # the memory default never imports the shared-state modules
    from gateway.shared_state import SharedState

__all__ = ["Gateway", "Lifecycle", "Lifecycles", "build"]


@runtime_checkable
class Lifecycle(Protocol):
    """A collaborator with I/O to open and close: started once, stopped once, in reverse order."""

    async def start(self) -> None:
        """Open what it needs (may raise: the gateway does not start)."""

    async def stop(self) -> None:
        """Close what it opened (never raises for a clean shutdown)."""


class _AuditLifecycle:
    """The audit hub's ``start``/``close`` as a :class:`Lifecycle`."""

    def __init__(self, hub: AuditHub) -> None:
        self.hub = hub

    async def start(self) -> None:
        await self.hub.start()

    async def stop(self) -> None:
        await self.hub.close()


class _BundlesLifecycle:
    """The trust-bundle sources: fetched on demand, closed at the end."""

    def __init__(self, store: TrustBundleStore) -> None:
        self.store = store

    async def start(self) -> None:
        return None

    async def stop(self) -> None:
        for td in self.store.trust_domains():
            await self.store.source(td).aclose()


class _LimitsLifecycle:
    """The tenant limits and ledger (:func:`tenancy.shared.make_limits`): lease renewal and a
    first ``PING`` at start (Redis down at start is an outage, not a failed start: the
    ``state.on_unavailable`` behaviour applies until it answers); at stop, queued releases
    and settlements get up to ``FLUSH_S`` seconds, then the client closes."""

    FLUSH_S = 2.0

    def __init__(self, limits: SharedLimits) -> None:
        self.limits = limits

    async def start(self) -> None:
        self.limits.start()
        if self.limits.availability is not None:
            try:
                await self.limits.ping()
            except unavailable_errors() as exc:
                self.limits.availability.failed(exc)

    async def stop(self) -> None:
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self.limits.flush(), self.FLUSH_S)
        await self.limits.aclose()


class Lifecycles:
    """Starts its members in order and stops them in reverse; a failed start stops what had started."""

    def __init__(self, members: list[Lifecycle]) -> None:
        self.members = members
        self.started = False
        self._up: list[Lifecycle] = []

    async def start(self) -> None:
        """Start every member (idempotent); re-raises a member's failure after stopping the others."""
        if self.started:
            return
        try:
            for m in self.members:
                self._up.append(m)  # a member whose start failed may hold something half-opened
                await m.start()
        except BaseException:
            await self._stop_all()
            raise
        self.started = True

    async def stop(self) -> None:
        """Stop every started member, last first (idempotent)."""
        if not self.started:
            return
        self.started = False
        await self._stop_all()

    async def _stop_all(self) -> None:
        up, self._up = self._up, []
        first: BaseException | None = None
        for m in reversed(up):
            try:
                await m.stop()
            except Exception as exc:  # stop the others anyway, then report the first failure
                first = first or exc
        if first is not None:
            raise first


@dataclass(frozen=True, slots=True)
class Gateway:
    """Every collaborator of the gateway, built once by :func:`build`.

    One per step: ``authn`` (authenticate), ``admission`` (tenant, limits,
    prompt checks, ledger), ``keys`` (prefix keys), ``pep`` (policy),
    ``router`` + ``replica_set`` (route), ``upstream`` (proxy, health),
    ``recorder`` (metrics + audit); ``flow`` (per-tenant queues and fair release, None when
    ``flow.enabled`` is off) and ``overload`` (shedding); ``admin`` and ``readiness`` serve the
    admin listener and ``/readyz``; ``lifecycles`` starts and stops them.
    """

    config: GatewayConfig
    metrics: GatewayMetrics
    audit: AuditHub
    keyring: KeyRing
    bundles: TrustBundleStore
    verifier: JwtSvidVerifier
    authn: Authenticator
    admin_authn: Authenticator
    admission: Admission
    keys: PrefixKeys
    pdp: DecisionPoint
    pep: PolicyEnforcementPoint
    replica_set: ReplicaSet
    index: InProcessPrefixIndex
    router: Router
    calibration: Calibration | None
    upstream: Upstream
    recorder: Recorder
    admin: Admin
    readiness: Readiness
    flow: FlowControl | None
    overload: OverloadGuard
    lifecycles: Lifecycles = field(repr=False)
    #: each tenant's budget of CPU for refused requests (``limits.refused_cpu_ms_per_s``; gateway/cpu_budget.py)
    cpu_budget: CpuBudget = field(repr=False)
    #: the Redis-shared state (``state.backend: redis``), else None
    shared: SharedState | None = None
    #: request-body bytes being read, both listeners (``limits.max_buffered_body_bytes``; gateway/framing.py)
    body_budget: BodyBudget | None = None
    #: the thread long prompts are tokenized on (``hf:`` tokenizers only; gateway/tokenize_thread.py, R12-3)
    tokenize_thread: PrepThread | None = None
    #: the thread heavy bodies are prepared on (the tokenizer's if any; gateway/prep_thread.py); None: on the loop
    prep_thread: PrepThread | None = None

    # the state that changes while running lives in its owner; these read it
    @property
    def registry(self) -> TenantRegistry:
        """The tenant registry in force (replaced on an operator's reload)."""
        return self.admission.registry

    @property
    def limiter(self) -> TenantLimiter | FailoverLimiter:
        """The tenants' request-rate and concurrency limiter: the in-process :class:`TenantLimiter`
        (``state.backend: memory``, synchronous) or the shared one (``redis``, async methods)."""
        return self.admission.limiter

    @property
    def ledger(self) -> TokenLedger | FailoverLedger:
        """The tenants' token ledger: in process (``memory``) or shared (``redis``, async ``reserve``)."""
        return self.admission.ledger

    @property
    def health(self) -> HealthChecker | None:
        """The active health checker (None before :meth:`start`)."""
        return self.upstream.health

    async def start(self) -> None:
        """Open the upstream session and health checks, start the PDP and the audit sinks."""
        await self.lifecycles.start()

    async def stop(self) -> None:
        """Stop health checks, flush audit (final checkpoint), close sessions."""
        await self.lifecycles.stop()

    def configuration_warnings(self) -> list[str]:
        """Tenant entries that load but cannot be served as written (:func:`gateway.tenant_warnings.entry_warnings`)."""
        return entry_warnings(self.registry, self.config, self.admission.served_models)

    def limit_warnings(self) -> list[str]:
        """Tenants without a prompt-token limit or whose one request may pass their prompt-token burst
        (:func:`gateway.tenant_warnings.tenant_limit_warnings`)."""
        return tenant_limit_warnings(self.registry, self.config)


def build(config: GatewayConfig, *, audit: AuditHub | None = None, config_path: str | None = None) -> Gateway:
    """Build the gateway of ``config`` (not started: call :meth:`Gateway.start`).

    ``audit``: a prebuilt audit hub (tests, benches), else one from ``config.audit``;
    ``config_path``: the file the registry is reloaded from (None: ``config`` itself).
    Raises :class:`gateway.config.ConfigError`.
    """
    if not config.replicas:
        raise ConfigError("invalid configuration: replicas: at least one replica must be configured")
    if not config.identity.trust_domains:
        raise ConfigError("invalid configuration: identity.trust_domains: at least one trust domain is required "
                          "(unauthenticated inference is never allowed)")
    metrics = GatewayMetrics()
    # tenancy
    try:
        secret = load_master_secret(config.tenancy.master_secret_file, config.tenancy.master_secret_env)
        keyring = KeyRing(secret, grace_s=config.tenancy.key_grace_s, state_path=config.tenancy.state_file)
        registry = TenantRegistry.from_config(config.tenancy.tenants, operators=config.tenancy.operators)
    except TenantConfigError as exc:
        raise ConfigError(f"invalid configuration: tenancy.{exc}") from None
    except (KeyStateInUse, KeyStateDirectoryMissing) as exc:  # an offline `keys` write holds it (R11-1); its
        raise ConfigError(f"tenancy.state_file: {exc}") from None  # directory is missing (S21-newcomer-2)
    except Exception as exc:  # KeyRingError: messages never hold secrets
        where = "tenancy.master_secret_file" if config.tenancy.master_secret_file else "tenancy.master_secret_env"
        raise ConfigError(f"invalid configuration: {where}: {exc}") from None
    shared: SharedState | None = None
    if config.state.backend == "redis":  # the memory default never imports the shared-state modules
        from gateway.shared_state import SharedState

        try:
            shared = SharedState(config, secret, keyring, metrics.admin)  # operators only (R3-5)
        except Exception as exc:  # StateSetupError: messages never hold the password
            raise ConfigError(f"invalid configuration: state: {exc}") from None
    del secret
    _check_salt_pools(config, registry)
    try:
        limits = make_limits(config.state, failover=True, on_change=lambda up: metrics.state_available.set(int(up)))
    except StateSetupError as exc:
        raise ConfigError(f"invalid configuration: {exc}") from None
    if limits.availability is not None:  # count what was decided locally during an outage
        limits.availability.on_local_decision = metrics.state_unavailable_admissions.labels("local").inc
        metrics.watch_state(limits)
    tokenizer = get_tokenizer(config.routing.tokenizer)
    admission = Admission(registry, limits, tokenizer, config.models, metrics, max_messages=config.limits.max_messages,
                          default_max_prompt_tokens=config.limits.max_prompt_tokens,
                          max_output_tokens=config.limits.max_output_tokens)
    rc = config.routing
    keys = PrefixKeys(keyring, block_size=rc.block_size, max_prefix_blocks=rc.max_prefix_blocks,
                      forward_user=config.tenancy.forward_user)
    # identity
    ic = config.identity
    bundles = TrustBundleStore()
    for td, tdc in ic.trust_domains.items():
        if tdc.bundle_file:
            bundles.add(FileBundleSource(td, tdc.bundle_file, max_stale_s=tdc.max_stale_s))
        else:
            bundles.add(HttpsBundleSource(td, tdc.bundle_url, default_refresh_s=tdc.refresh_s,
                                          max_stale_s=tdc.max_stale_s))
    # the admin listener has its own failed-authentication buckets: a flood of bad
    # tokens on the public port must not lock operators out
    source_limiter = SourceLimiter(rate=ic.unauthenticated_rps, burst=ic.unauthenticated_burst)
    admin_source_limiter = SourceLimiter(rate=ic.unauthenticated_rps, burst=ic.unauthenticated_burst)
    try:
        # one verifier, hence one verified-token cache, per listener and audience
        cache = {"cache_size": ic.verified_token_cache_size, "cache_max_ttl_s": ic.verified_token_cache_max_ttl_s}
        verifier = JwtSvidVerifier(bundles, ic.audience, ic.trust_domains.keys(), ic.leeway_s,
                                   ic.max_lifetime_s, **cache)
        admin_verifier = JwtSvidVerifier(bundles, ic.admin_audience, ic.trust_domains.keys(),
                                         ic.leeway_s, ic.max_lifetime_s, **cache)
        authn = Authenticator(verifier, source_limiter, ic.trusted_proxies,
                              unmapped_limiter=SourceLimiter(rate=ic.unmapped_rps, burst=ic.unmapped_burst),
                              mapped=lambda sid: admission.registry.resolve(sid))  # R6-4; the tenant (s19)
        admin_authn = Authenticator(admin_verifier, admin_source_limiter, ic.trusted_proxies,
                                    unmapped_limiter=SourceLimiter(rate=ic.unmapped_rps, burst=ic.unmapped_burst),
                                    mapped=lambda sid: admission.registry.is_operator(sid))
    except ValueError as exc:  # also caught by load_config; a config built otherwise lands here
        raise ConfigError(f"identity: {exc}") from None
    # routing
    policy = policy_from_config(rc.policy)  # validated by the config schema
    replica_set = ReplicaSet(
        [Replica(r.id, r.url, r.pool, dict(r.labels), r.cache_salt) for r in config.replicas],
        failure_threshold=config.health.breaker_failures,
        cooldown_s=config.health.breaker_cooldown_s,
        tenant_window_s=config.health.breaker_tenant_window_s,
    )
    index = InProcessPrefixIndex(rc.index_capacity_blocks)
    route_index: PrefixIndex = index
    # calibration (issue 15): first-byte times and engine metrics, only when the policy asks
    calibration: Calibration | None = None
    loads: LoadTracker = InProcessLoadTracker()
    if shared is not None:  # the other instances' chains and load, through Redis
        route_index, loads = shared.wrap_routing(index, loads, [r.id for r in config.replicas], batcher=limits.batcher)
    if getattr(rc.policy, "calibrate", False):
        calibration = Calibration(prior_rate=rc.policy.prefill_tokens_per_s)
        calibration.defer_observations(True)  # applied after the answer is sent (pipeline _complete) or on a read
        loads = CalibratingLoadTracker(loads, calibration, time.monotonic)
    notifying = NotifyingLoadTracker(loads)  # wakes the flow-control dispatcher when a replica gains room
    router = Router(policy, route_index, notifying, rc.block_size, calibration)
    flow: FlowControl | None = None
    if config.flow.enabled:
        flow = FlowControl(config.flow, router, replica_set, metrics, TierWeights(config.tenancy.tier_weights),
                           calibration)
        notifying.on_release = flow.on_load_released
    overload = OverloadGuard(config.flow, metrics)
    # audit first (policy changes are audited), then the decision point
    try:
        hub = audit or AuditHub.from_config(config.audit, router_factor=getattr(policy, "load_factor", 1.25),
                                            tracing=config.tracing.model_dump())
    except (ValueError, OSError, KeyError) as exc:
        raise ConfigError(f"audit: {exc}") from None
    if hub.monitor is not None:  # so traffic piling onto one replica is judged against all of its pool
        for pool in {r.pool for r in config.replicas}:
            hub.monitor.set_pool_members(pool, [r.id for r in config.replicas if r.pool == pool])
    pdp = build_decision_point(config.policy, hub)
    upstream = Upstream(replica_set, router, metrics, config.upstream, config.health, calibration,
                        probe_model=config.models[0] if config.models else None)  # S9-L4 verification
    admin = Admin(config, config_path, admin_authn, admission, keyring, pdp, hub, replica_set, router, index)
    members: list[Lifecycle] = [_LimitsLifecycle(limits), upstream, pdp, _AuditLifecycle(hub),
                                _BundlesLifecycle(bundles), overload, *([flow] if flow is not None else [])]
    # R12-3: long prompts of a tokenizer that releases the GIL are tokenized off the event loop
    tokenize_thread = PrepThread() if getattr(tokenizer, "releases_gil", False) else None
    prep_thread = tokenize_thread or PrepThread()  # session 31: heavy bodies prepared off the loop, one thread
    members.append(prep_thread)
    if shared is not None:  # first: an instance whose master secret differs refuses to start
        shared.attach(admin, pdp, hub)
        members.insert(0, shared)
    lifecycles = Lifecycles(members)
    return Gateway(
        config=config, metrics=metrics, audit=hub, keyring=keyring, bundles=bundles, verifier=verifier,
        authn=authn, admin_authn=admin_authn, admission=admission, keys=keys, pdp=pdp,
        pep=PolicyEnforcementPoint(pdp, router.loads, hub, metrics), replica_set=replica_set, index=index,
        router=router, calibration=calibration, upstream=upstream, recorder=Recorder(metrics, hub),
        admin=admin,
        readiness=Readiness(lambda: lifecycles.started, replica_set, hub, pdp, router.loads, metrics, bundles,
                            limits.availability, overload=overload, flow=flow),
        flow=flow, overload=overload, lifecycles=lifecycles, shared=shared,
        body_budget=BodyBudget(config.limits.max_buffered_body_bytes, config.limits.max_buffered_body_bytes_per_tenant),
        cpu_budget=CpuBudget(config.limits, metrics=metrics), tokenize_thread=tokenize_thread, prep_thread=prep_thread,
    )


def _check_salt_pools(config: GatewayConfig, registry: TenantRegistry) -> None:
    """A replica without ``cache_salt`` may only serve one tenant (ConfigError otherwise;
    :func:`gateway.salt_pools.salt_pool_error`, also run by every registry change, R10-1)."""
    error = salt_pool_error(config.replicas, registry.tenants())
    if error is not None:
        raise ConfigError(error)
