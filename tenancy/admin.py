"""Operator operations on the key ring and the tenant registry.

Each operation exists twice: a plain function (for the CLI) and a Starlette
route (for the admin listener, operators only). Every one returns a *change
record* — a JSON-able dict with no key material (only versions, epochs, key
ids, counts) — which is also handed to ``on_change`` for the audit log.

Routes (all ``POST``; ``authorize(request)`` runs first and must raise
``HTTPException(401/403)`` for non-operators):

* ``/admin/tenants/{tenant_id}/rotate-key``  new prefix-key version
* ``/admin/tenants/{tenant_id}/rotate-salt`` new cache-salt epoch (cache goes cold)
* ``/admin/keys/rotate-master``              new master secret, read by ``master_loader``
  from the configured file/env — never from the request body
* ``/admin/tenants/reload``                  re-read tenants via ``registry_loader``

A failed request of an admitted operator (every error below, and an unexpected
exception, 500 ``internal_error``, re-raised) is handed to ``on_failure`` as one
*failure record* (:func:`failure_record`; session 21, S21-newcomer-3).

Errors have the public API's shape, ``{"error": {"message", "type", "code",
"param"}}`` (:func:`error_body`): 400 bad tenant id or
config (a ``TenantConfigError`` or any ``ValueError`` of the registry
loader, e.g. an unparsable config file; the registry in force stays), 404
unknown tenant, 409 master unchanged, 501 no master source, 500
key-ring/state failure; from an ``on_change`` hook (shared state; the reload is applied here and not shared):
409 ``conflict`` (another instance stored this tenants version first: its registry is adopted here, S22-fixrot-1),
503 ``master_pending`` (a master generation is pending here, S22-review-3), 503 ``state_unavailable`` (Redis
failed before the stored registry could be read, S22-fixrot-2).
"""

from __future__ import annotations

import inspect
import re
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from tenancy.keys import KeyRing, KeyRingError, MasterUnchanged
from tenancy.registry import TenantConfigError, TenantRegistry

__all__ = [
    "AdminError",
    "rotate_tenant_key",
    "rotate_tenant_salt",
    "rotate_master_key",
    "reload_tenants",
    "ReloadResult",
    "admin_routes",
    "error_body",
    "failure_record",
]

Authorize = Callable[[Request], Awaitable[Any]]
OnChange = Callable[[dict], Any]
RegistryLoader = Callable[[], "TenantRegistry | ReloadResult | Awaitable[TenantRegistry | ReloadResult]"]
MasterLoader = Callable[[], bytes]

_TENANT_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
#: error codes whose message is fixed text (or names only a well-formed tenant id): recorded in a
#: failure record; every other message (a config file's parse error, a key-ring or state-file error)
#: may quote config content or paths and is left out
_MESSAGE_RECORDED = frozenset({"invalid_tenant_id", "unknown_tenant", "no_master_source", "master_unchanged"})
#: (action, route template) of each route
_ROUTES = {
    "rotate_key": ("tenant.rotate_key", "/admin/tenants/{tenant_id}/rotate-key"),
    "rotate_salt": ("tenant.rotate_salt", "/admin/tenants/{tenant_id}/rotate-salt"),
    "rotate_master": ("keys.rotate_master", "/admin/keys/rotate-master"),
    "reload": ("tenants.reload", "/admin/tenants/reload"),
}


class AdminError(Exception):
    """An operator request that cannot be carried out; ``status`` is the HTTP code."""

    def __init__(self, status: int, code: str, detail: str) -> None:
        super().__init__(detail)
        self.status = status
        self.code = code
        self.detail = detail


def _record(action: str, **fields: Any) -> dict:
    return {"action": action, "ts": time.time(), **fields}


def rotate_tenant_key(keyring: KeyRing, tenant_id: str) -> dict:
    """Rotate ``tenant_id``'s prefix key; return the change record.

    Record: ``action="tenant.rotate_key"``, ``tenant_id``, ``key_version``,
    ``kid``, ``previous_kid``, ``grace_s``, ``ts`` (Unix seconds). Raises
    :class:`~tenancy.keys.KeyRingError` if the state file cannot be written.
    """
    previous = keyring.current(tenant_id)
    new = keyring.rotate_tenant(tenant_id)
    return _record(
        "tenant.rotate_key",
        tenant_id=tenant_id,
        key_version=new.version,
        kid=new.kid,
        previous_kid=previous.kid,
        grace_s=keyring.grace_s,
    )


def rotate_tenant_salt(keyring: KeyRing, tenant_id: str) -> dict:
    """Bump ``tenant_id``'s cache-salt epoch (its replica cache goes cold).

    Record: ``action="tenant.rotate_salt"``, ``tenant_id``, ``salt_epoch``,
    ``ts``. The salt itself is not included. Raises ``KeyRingError``.
    """
    epoch = keyring.rotate_salt(tenant_id)
    return _record("tenant.rotate_salt", tenant_id=tenant_id, salt_epoch=epoch)


def rotate_master_key(keyring: KeyRing, new_secret: bytes) -> dict:
    """Switch the key ring to ``new_secret`` (old keys kept for the grace period).

    Record: ``action="keys.rotate_master"``, ``master_generation``,
    ``grace_s``, ``ts``. Raises ``KeyRingError`` (short or unchanged secret).
    """
    generation = keyring.rotate_master(new_secret)
    return _record("keys.rotate_master", master_generation=generation, grace_s=keyring.grace_s)


@dataclass(frozen=True)
class ReloadResult:
    """What a registry loader may return instead of the bare registry (S23-newcomer-5): the registry
    now in force, the names of the re-read file's settings that changed but were not applied (a reload
    applies tenants and operators only), and the warning lines logged about the new tenants."""

    registry: TenantRegistry
    not_applied: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)


async def reload_tenants(registry_loader: RegistryLoader) -> dict:
    """Call ``registry_loader`` (re-reads config and swaps the registry; may be
    async) and return the record ``action="tenants.reload"``, ``tenants``
    (count), ``tenant_ids`` (sorted), ``ts``; when the loader returns a :class:`ReloadResult`,
    also ``not_applied`` (setting names) and ``warnings`` (lines). Propagates ``TenantConfigError``."""
    if inspect.iscoroutinefunction(registry_loader):
        result = await registry_loader()
    else:
        result = await run_in_threadpool(registry_loader)
    if inspect.isawaitable(result):
        result = await result
    extra: dict[str, Any] = {}
    if isinstance(result, ReloadResult):
        extra = {"not_applied": list(result.not_applied), "warnings": list(result.warnings)}
        result = result.registry
    ids = [t.id for t in result.tenants()]
    return _record("tenants.reload", tenants=len(ids), tenant_ids=ids, **extra)


def failure_record(action: str, route: str, actor: str | None, status: int, code: str, message: str,
                   tenant_id: str | None = None, client_address: str | None = None) -> dict:
    """The record of an operator's change request that failed (session 21, S21-newcomer-3).

    ``{"action", "outcome": "failed", "route" (the route template, never the raw path), "actor"
    (SPIFFE ID), "status" (HTTP), "error_code", "ts" (Unix seconds)}`` plus ``tenant_id`` (the
    target, only when it matches the tenant-id pattern: a malformed id is not recorded) and
    ``message`` only for the codes in ``_MESSAGE_RECORDED`` (fixed texts), and ``client_address``
    (the request's source, when ``authorize`` gave one: the event's source; session 22,
    S21-fixaudit-1). Never recorded: the message of ``invalid_config`` (a config file's parse
    error may quote its content) or of ``key_ring_error`` / ``internal_error``, any key, salt or
    master secret, any request body.
    """
    record = _record(action, outcome="failed", route=route, actor=actor, status=status, error_code=code)
    if tenant_id is not None and _TENANT_ID_RE.match(tenant_id):
        record["tenant_id"] = tenant_id
    if code in _MESSAGE_RECORDED:
        record["message"] = message
    if isinstance(client_address, str):
        record["client_address"] = client_address
    return record


def _client_address(principal: Any) -> str | None:
    """The request's source address that ``authorize`` returned with the operator (a mapping's
    ``client_address``, as the gateway's authorize gives it), else None."""
    address = principal.get("client_address") if isinstance(principal, Mapping) else None
    return address if isinstance(address, str) else None


def _actor(principal: Any) -> str | None:
    """The operator's SPIFFE ID from whatever ``authorize`` returned: a string,
    a mapping with ``spiffe_id`` (the gateway's authorize), or an object with a
    ``spiffe_id`` attribute (``WorkloadIdentity``, whose ``spiffe_id`` may be a
    ``SpiffeId`` value; its ``str`` is the ID)."""
    if isinstance(principal, str):
        return principal
    if isinstance(principal, Mapping):
        spiffe_id = principal.get("spiffe_id")
    else:
        spiffe_id = getattr(principal, "spiffe_id", None)
    if spiffe_id is None:
        return None
    return spiffe_id if isinstance(spiffe_id, str) else str(spiffe_id)


def error_body(status: int, code: str, message: str) -> dict[str, Any]:
    """The admin error body: the public API's OpenAI-style shape (gateway/errors.py),
    ``{"error": {"message", "type", "code", "param"}}``; ``type`` follows the status
    (401 authentication_error, 403 permission_error, 429 rate_limit_error, 5xx server_error,
    else invalid_request_error). Kept here because ``tenancy`` never imports ``gateway``; a
    test (tests/quickstart/test_i13_admin_errors.py) pins it to the gateway's shape."""
    if status >= 500:
        err_type = "server_error"
    else:
        err_type = {401: "authentication_error", 403: "permission_error", 429: "rate_limit_error"}.get(
            status, "invalid_request_error")
    return {"error": {"message": message, "type": err_type, "code": code, "param": None}}


def _error(status: int, code: str, message: str) -> JSONResponse:
    return JSONResponse(error_body(status, code, message), status_code=status)


def admin_routes(
    keyring: KeyRing,
    registry_loader: RegistryLoader,
    authorize: Authorize,
    *,
    master_loader: MasterLoader | None = None,
    on_change: OnChange | None = None,
    registry: TenantRegistry | None = None,
    on_failure: OnChange | None = None,
) -> list[Route]:
    """Return the operator routes (see module doc) for the admin listener.

    ``authorize(request)`` is awaited before anything else; whatever it
    returns (a ``WorkloadIdentity``, a SPIFFE ID string, or a mapping with
    ``spiffe_id`` and optionally ``client_address``) is recorded as ``actor``
    (and ``client_address`` in the change or failure record; session 23, S22-fixsec-2: successes too). ``registry_loader()`` re-reads the tenants and returns the
    registry now in force. ``master_loader()`` returns the new master secret
    (e.g. ``lambda: load_master_secret(file, env)``). ``on_change(record)``
    (sync or async) receives every change record, for audit; if it raises,
    the change has already happened and the error propagates (HTTP 500), except an :class:`AdminError`,
    answered with its status and code and handed to ``on_failure`` (the change is made: e.g. not shared).
    ``registry``, when given, makes rotations of unknown tenants a 404.
    ``on_failure(record)`` (sync or async) receives one :func:`failure_record` for
    each request of an authorized operator that fails (not for a 401/403 of
    ``authorize``, audited by it); if it raises, the error propagates (HTTP 500).
    """

    async def _failed(name: str, principal: Any, tenant_id: str | None, status: int, code: str,
                      message: str) -> None:
        if on_failure is not None:
            action, route = _ROUTES[name]
            res = on_failure(failure_record(action, route, _actor(principal), status, code, message, tenant_id,
                                            _client_address(principal)))
            if inspect.isawaitable(res):
                await res

    async def _run(request: Request, op: Callable[[str | None], Awaitable[dict]], name: str) -> JSONResponse:
        principal = await authorize(request)
        tenant_id = request.path_params.get("tenant_id")
        record: dict | None = None
        try:
            record = await op(tenant_id)
        except AdminError as exc:
            status, code, message = exc.status, exc.code, exc.detail
        except (TenantConfigError, ValueError) as exc:
            # ValueError: the registry loader's own config errors (e.g. the
            # gateway's ConfigError for a broken config file); nothing changed
            status, code, message = 400, "invalid_config", str(exc)
        except KeyRingError as exc:
            status, code, message = 500, "key_ring_error", str(exc)
        except Exception:
            await _failed(name, principal, tenant_id, 500, "internal_error", "")
            raise
        if record is None:
            await _failed(name, principal, tenant_id, status, code, message)
            return _error(status, code, message)
        record["actor"] = _actor(principal)
        if (address := _client_address(principal)) is not None:  # the source of a success too (S22-fixsec-2)
            record["client_address"] = address
        if on_change is not None:
            try:
                res = on_change(record)
                if inspect.isawaitable(res):
                    await res
            except AdminError as exc:  # made here, and a hook says how it fell short (S22-review-3: not shared)
                await _failed(name, principal, tenant_id, exc.status, exc.code, exc.detail)
                return _error(exc.status, exc.code, exc.detail)
        return JSONResponse(record)

    def _tenant(tenant_id: str | None) -> str:
        if tenant_id is None or not _TENANT_ID_RE.match(tenant_id):
            raise AdminError(400, "invalid_tenant_id", "tenant id is malformed")
        if registry is not None and registry.get(tenant_id) is None:
            raise AdminError(404, "unknown_tenant", f"no tenant {tenant_id!r}")
        return tenant_id

    async def rotate_key(request: Request) -> JSONResponse:
        async def op(tid: str | None) -> dict:
            return await run_in_threadpool(rotate_tenant_key, keyring, _tenant(tid))

        return await _run(request, op, "rotate_key")

    async def rotate_salt(request: Request) -> JSONResponse:
        async def op(tid: str | None) -> dict:
            return await run_in_threadpool(rotate_tenant_salt, keyring, _tenant(tid))

        return await _run(request, op, "rotate_salt")

    async def rotate_master(request: Request) -> JSONResponse:
        async def op(_: str | None) -> dict:
            if master_loader is None:
                raise AdminError(501, "no_master_source", "no master secret source configured")
            secret = await run_in_threadpool(master_loader)
            try:
                return await run_in_threadpool(rotate_master_key, keyring, secret)
            except MasterUnchanged as exc:
                raise AdminError(409, "master_unchanged", str(exc)) from exc

        return await _run(request, op, "rotate_master")

    async def reload(request: Request) -> JSONResponse:
        async def op(_: str | None) -> dict:
            return await reload_tenants(registry_loader)

        return await _run(request, op, "reload")

    return [
        Route("/admin/tenants/reload", reload, methods=["POST"]),
        Route("/admin/tenants/{tenant_id}/rotate-key", rotate_key, methods=["POST"]),
        Route("/admin/tenants/{tenant_id}/rotate-salt", rotate_salt, methods=["POST"]),
        Route("/admin/keys/rotate-master", rotate_master, methods=["POST"]),
    ]
