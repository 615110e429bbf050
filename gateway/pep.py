"""The policy enforcement point: ask the decision point (embedded or remote OPA,
behind the decision cache), turn a deny into the client's answer, and narrow
the candidates to the replicas and pools the decision allows.

Fail closed: a decision point that fails answers 503 ``policy_unavailable``;
a deny answers 403 with the policy's reason code and, only for a
configuration gap (:data:`CONFIG_GAP_CODES`), its reason text.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Awaitable, Callable, Sequence
from operator import is_
from typing import TYPE_CHECKING, Any, Protocol

from gateway.auditing import AuditHub
from gateway.config import ConfigError, PolicyConfig
from gateway.errors import GatewayError, model_not_found
from gateway.identity import WorkloadIdentity
from gateway.metrics import GatewayMetrics
from gateway.pep_key import FactsMemo, candidate_docs
from gateway.replicas import Replica
from gateway.request import InferenceRequest
from policy.decision import Decision, PolicyError
from policy.cache import (DEFAULT_KEY_FIELDS, NO_ALERTS, CachedDecisionPoint, alerts_key_part, compose_key,
                          head_key_fields)
from policy.input import build_policy_input
from routing.filters import PolicyDecisionFilter
from routing.load import LoadTracker
from tenancy.registry import Tenant

if TYPE_CHECKING:  # imported only with policy.versions_dir (opa_client)
    from policy.store import PolicyStore

__all__ = ["CONFIG_GAP_CODES", "DecisionPoint", "PolicyEnforcementPoint", "build_decision_point", "denial_message",
           "follow_policy_key", "key_fields_with"]

log = logging.getLogger("prefixgate.policy")

#: Denials caused by a gap in the tenant's configuration or the policy data
#: (rego/authz.rego): their reason names what is missing and is shown to the
#: client; every other reason goes to the audit trail only.
CONFIG_GAP_CODES = frozenset({"tenant_entitlements_missing", "tier_unknown", "residency_missing"})


def denial_message(code: str | None, reason: str | None) -> str:
    """The client message of a policy denial: for a configuration gap (:data:`CONFIG_GAP_CODES`) the
    policy's own reason (printable ASCII, at most 300 characters), else a fixed text."""
    text = "".join(ch for ch in (reason or "") if 0x20 <= ord(ch) < 0x7F)[:300]
    if code in CONFIG_GAP_CODES and text:
        return f"the routing policy denied this request: {text}"
    return "the routing policy denied this request"


class _Decides(Protocol):
    async def decide(self, input: dict[str, Any]) -> Decision: ...


class _Healthy(Protocol):
    async def health(self) -> tuple[bool, str]: ...


async def _nothing() -> None:
    return None


class DecisionPoint:
    """The gateway's decision point with a :class:`gateway.build.Lifecycle`.

    ``dp``: what decides (the cache or the engine); ``inner``: the engine
    (its ``health`` for readiness); ``store``: the policy version store of
    the operator API (None without ``policy.versions_dir``); ``start``/``stop``:
    the engine's own, chosen when it is built.
    """

    def __init__(self, dp: _Decides, inner: _Healthy, *, start: Callable[[], Awaitable[None]],
                 stop: Callable[[], Awaitable[None]], store: PolicyStore | None = None,
                 clear: Callable[[], None] | None = None) -> None:
        self.dp = dp
        self.inner = inner
        self.store = store
        self._start, self._stop, self._clear = start, stop, clear
        #: moves with every change a decision may depend on: an engine change (upload, adopted set,
        #: reload: the engine's change listeners), :meth:`registry_changed` (a tenant registry reload)
        #: and :meth:`clear_cache`; compared right before a request's upstream write with the value read
        #: before its tenant was resolved (S17-6, session 18: gateway/pep_recheck.py)
        self.generation = 0
        add = getattr(inner, "add_change_listener", None)
        if callable(add):
            add(self._changed)

    def _changed(self) -> None:
        self.generation += 1

    async def decide(self, input: dict[str, Any]) -> Decision:
        """One decision (see :class:`policy.decision.DecisionPoint`); raises PolicyError."""
        return await self.dp.decide(input)

    def registry_changed(self) -> None:
        """The tenant registry was replaced (an operator's reload, here or on another instance): the
        tenant facts every decision reads changed. Moves :attr:`generation` (the requests admitted
        before it are authorized again before their upstream write: tenant resolved again, entitlement,
        pools, decision; gateway/pep_recheck.py) and drops every cached decision."""
        self.clear_cache()

    def clear_cache(self) -> None:
        """Drop every cached decision (no-op without a decision cache); moves :attr:`generation`."""
        self.generation += 1
        if self._clear is not None:
            self._clear()

    async def start(self) -> None:
        """Start the engine (a remote OPA's HTTP session; nothing for the embedded engine), then give it
        back what a crash mid-change left it (:meth:`policy.store.PolicyStore.start`; session 20, S19-R10)."""
        await self._start()
        if self.store is not None:
            await self.store.start()

    async def stop(self) -> None:
        """Close the engine (the store's scheduled give-backs cancelled first)."""
        if self.store is not None:
            self.store.close()
        await self._stop()

    async def health(self) -> tuple[bool, str]:
        """``(ok, reason)`` of the engine, for readiness."""
        return await self.inner.health()


def build_decision_point(pc: PolicyConfig, audit: AuditHub) -> DecisionPoint:
    """The decision point of ``policy``: embedded OPA (default) or remote, behind a decision cache.

    With ``policy.versions_dir`` set, a :class:`policy.store.PolicyStore` manages
    the embedded engine's directory (operator API; every change versioned and audited).
    Raises :class:`gateway.config.ConfigError`.
    """
    from policy.builtin_allowlist import allowed_builtins
    from policy.cache import CachedDecisionPoint, DecisionCache

    allowed = allowed_builtins(pc.allowed_builtins)
    inner: Any
    try:
        if pc.mode == "embedded":
            from policy.embedded import EmbeddedOpa

            embedded = EmbeddedOpa(pc.resolved_dir(), timeout_s=pc.timeout_s, offload=pc.offload,
                                   allowed_builtins=allowed)

            async def stop_embedded() -> None:
                embedded.close()

            inner, start, stop = embedded, _nothing, stop_embedded
        else:
            from policy.remote import RemoteOpa

            if not pc.url:
                raise ConfigError("policy.url is required in remote mode")
            token = os.environ.get(pc.token_env) if pc.token_env else None
            remote = RemoteOpa(pc.url, token=token, ca_file=pc.ca_file, timeout_s=pc.timeout_s,
                               push_timeout_s=pc.push_timeout_s,  # S19-R9: pushes (RemoteOpa.client) only
                               health_interval_s=pc.health_interval_s, health_timeout_s=max(pc.timeout_s, 0.5))
            inner, start, stop = remote, remote.start, remote.close
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
                                versions_keep=pc.versions_keep,
                                on_change=lambda rec: audit.record_operator(rec.audit_form()))  # S25-newcomer-4
        except Exception as exc:  # PolicyCompileError (e.g. a refused built-in), OSError
            raise ConfigError(f"policy: {exc}") from None
        if pc.mode == "embedded":  # the set it loaded is the store's version in force; every change relabels it
            inner.policy_version = store.version  # (S24-newcomer-4: audit events' policy.version)
    if pc.cache_ttl_s <= 0 or pc.cache_max_entries == 0:
        return DecisionPoint(inner, inner, start=start, stop=stop, store=store)
    if pc.mode == "remote" and pc.cache_key_fields is None:  # the gateway cannot read the policy (R10-2)
        log.warning("policy: remote mode without policy.cache_key_fields: decisions are not cached "
                    "(set it to the input paths the remote policy reads, [] for the shipped policy's)")
        return DecisionPoint(inner, inner, start=start, stop=stop, store=store)
    cached = CachedDecisionPoint(inner, DecisionCache(ttl_s=pc.cache_ttl_s, max_entries=pc.cache_max_entries))
    if pc.mode == "embedded":  # the key follows the policy's modules, now and after every change (R10-2)
        follow_policy_key(cached, inner, pc.cache_key_fields or ())
    elif pc.cache_key_fields:
        cached.cache.rekey(key_fields_with(pc.cache_key_fields))
    return DecisionPoint(cached, inner, start=start, stop=stop, store=store, clear=cached.clear)


def key_fields_with(extra: Sequence[str]) -> tuple[str, ...] | None:
    """:data:`policy.cache.DEFAULT_KEY_FIELDS` plus the ``extra`` paths it does not cover (``None``:
    ``time``, different at every request: nothing cached)."""
    from policy.input_refs import policy_key_fields

    return policy_key_fields({}, extra)


def follow_policy_key(cached: CachedDecisionPoint, engine: Any, extra: Sequence[str]) -> None:
    """Key ``cached`` on the input paths ``engine``'s policy set reads plus ``extra``
    (:func:`policy.input_refs.policy_key_fields`), now and after every policy change (a
    directory reload, an operator upload, a set adopted from shared state). A policy whose
    input use cannot be bounded is not cached (logged once per change)."""
    from policy.input_refs import policy_key_fields

    def rekey() -> None:
        fields = policy_key_fields(engine.policy_set.policies(), extra)
        cached.cache.rekey(fields)
        if fields is None:
            log.warning("policy: the policy reads the input in a way the decision cache cannot key on "
                        "(bare input, input[k], time, ...): decisions are not cached")
        elif fields != DEFAULT_KEY_FIELDS:
            log.info("policy: the decision cache also keys on %s", ", ".join(fields[len(DEFAULT_KEY_FIELDS):]))

    rekey()
    engine.add_change_listener(rekey)


class PolicyEnforcementPoint:
    """Builds the policy input, asks the decision point, enforces its answer."""

    def __init__(self, pdp: DecisionPoint, loads: LoadTracker, audit: AuditHub, metrics: GatewayMetrics) -> None:
        self.pdp = pdp
        self.loads = loads
        self.audit = audit
        self.metrics = metrics
        #: the decision-cache hit's counter child, looked up once (session 17: no ``labels`` call per hit)
        self._hit_count = metrics.policy_cache.labels("hit") if metrics is not None else None
        self._memo = FactsMemo()  # tenant facts and key parts per Tenant, candidate key parts per Replica list
        # the last allowed_candidates answer: (decision, candidates, allowed), compared by identity
        self._allowed: tuple[Decision, tuple[Replica, ...], tuple[Replica, ...]] | None = None

    async def decide(self, identity: WorkloadIdentity, tenant: Tenant, req: InferenceRequest, prompt_tokens: int,
                     candidates: list[Replica], endpoint: str, queued_requests: int = 0) -> Decision:
        """Ask the PDP; returns its decision, allow or deny (:meth:`enforce` answers a deny).

        ``queued_requests``: the tenant's requests waiting in the gateway's queue now
        (``input.request.queued_requests``; flow control, docs/policy.md). :meth:`decide_now`, awaited
        when it does not answer at once.

        Raises :class:`GatewayError` 503 ``policy_unavailable`` when the decision point fails (fail closed).
        """
        got = self.decide_now(identity, tenant, req, prompt_tokens, candidates, endpoint, queued_requests)
        return got if type(got) is Decision else await got  # type: ignore[misc]

    def decide_now(self, identity: WorkloadIdentity, tenant: Tenant, req: InferenceRequest, prompt_tokens: int,
                   candidates: list[Replica], endpoint: str, queued_requests: int = 0,
                   ) -> Decision | Awaitable[Decision]:
        """:meth:`decide`'s decision at once on a decision-cache hit, else the awaitable that gets it
        (await it; it raises :class:`GatewayError` 503 ``policy_unavailable`` when the decision point fails).

        On a hit neither the input document nor the candidates' documents are built, and no coroutine
        (issue 14; the key's tenant and candidate parts are kept per object: gateway/pep_key.py; session 16:
        the hit is the key, one cache lookup and its count, nothing built). The key is computed once: a miss hands it to
        the awaitable (the lookup counted the miss once).
        """
        tview, tpart = self._memo.tenant(tenant)
        sid, td, claims = identity.spiffe_id.uri, identity.trust_domain, identity.claims
        model, max_tokens, stream = req.model, req.max_tokens, req.stream
        prompts = req.prompts  # = req.sequences, without the property's call
        sequences = len(prompts) if prompts else 1
        alerts = self.audit.active_alerts()
        dp = self.pdp.dp
        key = None
        if tpart is not None and isinstance(dp, CachedDecisionPoint) and dp.cache.key_fields == DEFAULT_KEY_FIELDS:
            # head_key_part of build()'s identity and request facts, without the dicts
            head = head_key_fields(sid, td, claims or {}, endpoint, model, prompt_tokens, max_tokens, stream,
                                   sequences, queued_requests)
            cpart = self._memo.candidates(candidates)
            apart = alerts_key_part(alerts) if alerts else NO_ALERTS
            if head is not None and cpart is not None and apart is not None:
                key = compose_key(head, tpart, cpart, apart)
                # a hit: no input document, no closure, no coroutine (session 9; = decide_keyed's hit)
                hit = dp.cache.get(key)
                if hit is not None:
                    self._hit_count.inc()  # type: ignore[union-attr]
                    return hit if hit.cached else hit.as_cached()  # put() stores it marked: itself

        def build() -> dict[str, Any]:  # the input document: on a miss or a mistyped fact only (issue 14)
            return build_policy_input(
                {"spiffe_id": sid, "trust_domain": td, "claims": claims}, tview,
                {"endpoint": endpoint, "model": model, "prompt_tokens": prompt_tokens, "max_tokens": max_tokens,
                 "stream": stream, "sequences": sequences, "queued_requests": queued_requests},
                candidate_docs(candidates, self.loads), alerts, time.time())

        return self._decide_missed(dp, key, build)

    async def _decide_missed(self, dp: Any, key: tuple[Any, ...] | None, build: Callable[[], dict[str, Any]]) -> Decision:
        """The decision point's answer for a request :meth:`decide_now` did not answer (``key``: its cache key,
        whose miss was counted; ``None``: no cache or a mistyped fact, the built document's validation decides)."""
        try:
            if key is None:
                decision = await dp.decide(build())
            else:  # the miss get() just counted: the document is built now
                decision = await dp.decide_missed(key, build)
        except PolicyError:
            raise GatewayError(503, "policy_unavailable", "the policy decision point is unavailable") from None
        self.metrics.policy_cache.labels("hit" if decision.cached else "miss").inc()
        return decision

    def tenant_facts(self, tenant: Tenant) -> dict[str, Any]:
        """``tenant.policy_view()`` plus ``max_tokens`` (the policy input's tenant facts), built once per
        Tenant object (frozen; a registry reload hands out new ones) and kept per tenant id. The
        dict is shared: callers only read it (``build_policy_input`` copies what it uses)."""
        return self._memo.tenant(tenant)[0]

    @staticmethod
    def enforce(decision: Decision) -> None:
        """Raise the client's 403 for a deny (its reason code; :func:`denial_message`). A
        ``model_not_entitled`` deny (a policy stricter than ``tenancy.tenants[].models``, which
        :meth:`gateway.admission.Admission.check_model` already enforces) answers the unknown
        model's 404 ``model_not_found`` body instead (R3-7); the audit keeps the decision."""
        if not decision.allow:
            if decision.reason_code == "model_not_entitled":
                raise model_not_found(outcome="denied")
            raise GatewayError(403, decision.reason_code or "denied",
                               denial_message(decision.reason_code, decision.reason),
                               extra={"decision_id": decision.decision_id}, outcome="denied")

    def allowed_candidates(self, candidates: list[Replica], decision: Decision) -> list[Replica]:
        """Enforce the decision: keep the candidates the policy allows (replica ids and/or pools); a new list.

        The last answer is kept with its decision and candidates (session 15): a decision-cache hit returns
        the same frozen :class:`Decision` object, and the candidates are the same frozen ``Replica`` objects
        while the replica set does not change, so the same inputs (by identity) give the same list without
        building the filter again."""
        last = self._allowed
        if (last is not None and last[0] is decision and len(last[1]) == len(candidates)
                and all(map(is_, last[1], candidates))):
            return list(last[2])
        out = PolicyDecisionFilter(decision.allowed_replicas, decision.allowed_pools).filter(candidates)
        self._allowed = (decision, tuple(candidates), tuple(out))
        return out
