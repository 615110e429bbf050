"""The admin listener's rules: operator authorization, the operator routes of
tenancy (keys, salts, registry reload) and policy management, and the
operator views of replicas and routing.

Every admin request, whatever its path, needs a JWT-SVID for the admin audience
from a configured operator SPIFFE ID, checked before routing (R3-9); anything
else is 401/403 with the public listener's codes and is audited as a refusal.
An operator's request with a ``Content-Encoding`` other than ``identity`` (a policy,
data or registry upload, or any other) is then refused 415 ``unsupported_content_encoding``
before its body is read, as on the public listener (gateway/content_coding.py, R9-4; session
10), and audited the same way.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Awaitable, Callable
from typing import Any

from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.routing import BaseRoute

from gateway.admission import Admission
from gateway.auditing import AuditHub
from gateway.authn import Authenticator
from gateway.config import GatewayConfig, load_config
from gateway.content_coding import refuse_content_coding
from gateway.errors import GatewayError
from gateway.identity import WorkloadIdentity
from gateway.pep import DecisionPoint
from gateway.record import refusal_record
from gateway.reload_sections import not_applied_sections
from gateway.replicas import ReplicaSet
from gateway.salt_pools import salt_pool_error
from gateway.tenant_warnings import tenant_warnings
from routing.index import PrefixIndex
from routing.router import Router
from tenancy.admin import ReloadResult
from tenancy.keys import KeyRing, load_master_secret
from tenancy.registry import TenantConfigError, TenantRegistry

log = logging.getLogger("prefixgate")

__all__ = ["Admin", "record_refusal", "OPERATOR_SCOPE_KEY"]

#: ASGI scope key where the admin gate leaves the operator it admitted (set by no client)
OPERATOR_SCOPE_KEY = "prefixgate.operator"


def record_refusal(audit: AuditHub, authn: Authenticator, request: Request, endpoint: str, err: GatewayError,
                   identity: WorkloadIdentity | None = None, tenant: str | None = None) -> None:
    """Audit a refusal on a non-inference endpoint (``/v1/models``, the admin listener, an
    unrouted path) and give ``err`` the event's ``X-Request-Id`` header (R4-5): build its answer
    after this call. ``tenant``: the caller's tenant when resolved (the event's ``tenant``)."""
    sid, td = (str(identity.spiffe_id), identity.trust_domain) if identity is not None else (None, None)
    rec = refusal_record(endpoint, authn.source(request), err.status, err.outcome, err.code, sid, td)
    rec.tenant_id = tenant
    err.headers = {**err.headers, "X-Request-Id": rec.request_id}
    audit.record_request(rec)


class Admin:
    """Operator rules over the collaborators they manage.

    ``config_path``: the file :meth:`reload_registry` reads the tenants from
    (None: the configuration the gateway was built with).
    """

    def __init__(self, config: GatewayConfig, config_path: str | None, authn: Authenticator, admission: Admission,
                 keyring: KeyRing, pdp: DecisionPoint, audit: AuditHub, replica_set: ReplicaSet, router: Router,
                 index: PrefixIndex) -> None:
        self.config = config
        self.config_path = config_path
        self.authn = authn
        self.admission = admission
        self.keyring = keyring
        self.pdp = pdp
        self.audit = audit
        self.replica_set = replica_set
        self.router = router
        self.index = index
        #: awaited with every tenancy change record after it is audited (shared state publishes here)
        self.change_hooks: list[Callable[[dict[str, Any]], Awaitable[None]]] = []
        #: the last tenants section applied (``{"tenants", "operators"}``), None before any reload
        self.last_tenancy: dict[str, Any] | None = None
        #: the last tenants section a reload here applied (:meth:`reload_registry`; None before any): shared state
        #: publishes a reload only while :attr:`last_tenancy` is still it, not a version adopted since (S31-review31-1)
        self.last_reload: dict[str, Any] | None = None
        #: held from the registry's swap to :attr:`last_tenancy`'s update: a reload applies in a worker thread, a
        #: version adopted from another instance on the event loop; both name the same registry (S31-review31-2)
        self._apply_lock = threading.Lock()

    async def authenticate_operator(self, request: Request) -> WorkloadIdentity:
        """The admin listener's gate, run before routing (R3-9): a JWT-SVID for the admin
        audience from an operator, whatever the path, so an unknown path and a real one answer alike.

        Raises :class:`GatewayError` with the public listener's status and code for the same
        failure (401 ``missing_token`` / ``audience`` / ...; 403 ``not_an_operator``), audited
        as a refusal of endpoint ``admin`` (the path is client-chosen). Then an operator's request with a
        ``Content-Encoding`` other than ``identity``: 415 ``unsupported_content_encoding`` with
        ``Accept-Encoding: identity``, before any body byte is read, audited the same way with the
        operator's identity (session 10: the R9-4 rule of the public listener; the uploads were read
        as identity whatever the field said)."""
        try:
            identity = await self.authn.authenticate(request)
        except GatewayError as err:
            record_refusal(self.audit, self.authn, request, "admin", err)
            raise
        if not self.admission.registry.is_operator(str(identity.spiffe_id)):
            err = GatewayError(403, "not_an_operator", "operator identity required")
            record_refusal(self.audit, self.authn, request, "admin", err, identity=identity)
            raise err
        try:
            refuse_content_coding(request.scope["headers"])
        except GatewayError as err:
            record_refusal(self.audit, self.authn, request, "admin", err, identity=identity)
            raise
        request.scope[OPERATOR_SCOPE_KEY] = identity
        return identity

    async def authorize_operator(self, request: Request) -> WorkloadIdentity:
        """Admin route guard: the operator the gate (:meth:`authenticate_operator`) admitted,
        else the same check here.

        Raises ``HTTPException`` 401 (no/invalid credential) or 403 (not an operator).
        """
        identity = request.scope.get(OPERATOR_SCOPE_KEY)
        if isinstance(identity, WorkloadIdentity):
            return identity
        try:
            return await self.authenticate_operator(request)
        except GatewayError as err:
            raise HTTPException(err.status, err.message, headers=err.headers) from None

    def routes(self) -> list[BaseRoute]:
        """Operator routes of tenancy (keys, salts, registry) and policy management."""
        from tenancy.admin import admin_routes as tenancy_routes

        async def authorize(request: Request) -> dict[str, Any]:
            ident = await self.authorize_operator(request)
            # client_address: the request's source (the peer, or the client a trusted proxy attests), put
            # into a failure record by the routes (session 22, S21-fixaudit-1)
            return {"spiffe_id": str(ident.spiffe_id), "trust_domain": ident.trust_domain,
                    "client_address": self.authn.source(request)}

        async def on_change(record: dict[str, Any]) -> None:
            self.audit.record_operator(record)
            for hook in self.change_hooks:
                await hook(record)

        def on_failure(record: dict[str, Any]) -> None:  # S21-newcomer-3: failed changes are audited too
            self.audit.record_operator(record)

        routes: list[BaseRoute] = []
        tc = self.config.tenancy
        # with shared state the others follow through the master-generation record (tenancy/shared_keys.py)
        def master_loader() -> bytes:
            return load_master_secret(tc.master_secret_file, tc.master_secret_env)

        routes += tenancy_routes(
            self.keyring, self.reload_registry, authorize, master_loader=master_loader,
            on_change=on_change, registry=self.admission.registry, on_failure=on_failure,
        )
        if self.pdp.store is not None:
            from policy.admin import admin_routes as policy_routes

            # a write that changed nothing is audited too (session 27, S26-policy26-3): same sink
            routes += policy_routes(self.pdp.store, authorize, on_failure=on_failure, on_unchanged=on_failure)
        return routes

    def reload_registry(self) -> ReloadResult:
        """Re-read the tenants from ``config_path``; no decision or limit state outlives a removed tenant.

        Returns the registry now in force, the names of the file's sections that differ from the
        running configuration and were NOT applied (a reload applies ``tenancy.tenants`` and
        ``tenancy.operators`` only; the rest needs a restart), and the warnings logged about the new
        tenants (S23-newcomer-5: before, other changes were ignored without a word and a reload logged
        two of start-up's four kinds of warning). Raises as :meth:`apply_registry`; ``ConfigError``
        (a ``ValueError``) for a file that does not load.
        """
        fresh = load_config(self.config_path) if self.config_path else self.config
        registry, warnings = self._apply(fresh.tenancy.tenants, fresh.tenancy.operators, reloaded=True)
        return ReloadResult(registry, not_applied_sections(self.config, fresh), warnings)

    def apply_registry(self, tenants: list[dict[str, Any]], operators: list[str]) -> TenantRegistry:
        """Serve these tenants and operators (a reload here or on another instance); clears every decision.

        The new tenants are checked against the live replica set first with the start-up's
        salt-pool rule (:func:`gateway.salt_pools.salt_pool_error`, R10-1): a salt-less replica
        may serve only one tenant's pool. Then the warnings start-up logs about its tenants
        (:func:`gateway.tenant_warnings.tenant_warnings`) are logged for the new set, one WARNING each.

        Raises :class:`tenancy.registry.TenantConfigError` (the registry in force stays): an
        invalid tenant list, or one that breaks the salt-pool rule (the reload answers 400).
        """
        return self._apply(tenants, operators)[0]

    def _apply(self, tenants: list[dict[str, Any]], operators: list[str],
               reloaded: bool = False) -> tuple[TenantRegistry, list[str]]:
        """:meth:`apply_registry`, also returning the warning lines it logged; ``reloaded``: a reload here
        (:attr:`last_reload`)."""
        fresh = TenantRegistry.from_config(tenants, operators=operators)  # validates; the one in force stays
        error = salt_pool_error(self.replica_set.all(), fresh.tenants())
        if error is not None:
            raise TenantConfigError(f"tenants: {error}")
        with self._apply_lock:  # S31-review31-2: the registry in force and last_tenancy change together
            # S31-review31b-3: the table validated above, swapped in (a second build here held the lock for O(rules²))
            registry = self.admission.registry.replace_with(fresh)
            self.admission.replace_registry(registry)
            self.pdp.registry_changed()  # generation moved, cache dropped: no decision outlives the old facts
            self.last_tenancy = applied = {"tenants": list(tenants), "operators": list(operators)}
            if reloaded:
                self.last_reload = applied
        warnings = tenant_warnings(registry, self.config, self.admission.served_models)  # as at start (S23-newcomer-5)
        for line in warnings:
            log.warning("%s", line)
        return registry, warnings

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
