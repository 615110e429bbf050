"""Operator admin API for policy management (Starlette routes).

Mount on the admin listener only. Every route first awaits
``authorize(request)``, which returns the operator identity (a dict with
``spiffe_id`` or ``id``) or raises ``HTTPException(401|403)``; an identity
without an id is refused with 403 (fail closed).

- ``GET /admin/policies`` -> ``{"result": [{"id", "sha256", "test"}], "version"}``
- ``GET /admin/policies/{id}`` -> ``{"result": {"id", "raw", "sha256"}}`` | 404
- ``PUT /admin/policies/{id}`` (text/plain Rego) -> ``{"result": record}`` |
  400 ``{"error": {"code": "policy_rejected", "errors": [...], "report": str, ...}}``
- ``DELETE /admin/policies/{id}`` -> ``{"result": record}`` | 404 | 400
- ``GET /admin/data/{path}`` -> ``{"result": document}`` | 404
- ``GET /admin/policies/versions?limit=50&before=N`` -> ``{"result": [version entry, newest first], "version",
  "active_set_sha256", "in_force_set_sha256", "drift"}`` (:func:`policy.store_versions.version_entries`: change
  records and set digests, never policy text; session 24; the drift fields: session 25, S25-newcomer-8)
- ``POST /admin/policies/rollback`` (JSON ``{"to": N}``) -> ``{"result": record}`` (``rollback_to`` N, ``target``
  ``*``) | 400 ``invalid_parameter`` | 404 (``version_pruned``: older than the versions kept) | 409
  ``version_not_restorable`` | 501 ``not_supported`` (remote OPA) | 400 ``policy_rejected`` and the other
  change errors below (:meth:`policy.store.PolicyStore.rollback`)
- ``PUT /admin/data/{path}`` (JSON object) -> ``{"result": record}`` | 400
- a ``PUT`` of the text or document in force, or a roll-back to a version whose set is the set in force -> 200
  ``{"result": <the version in force's listing entry>, "unchanged": true}``: no version committed, nothing
  applied or published (session 26, S25-review-8; :class:`policy.store.PolicyUnchanged`); audited as an
  operator event with ``unchanged: true`` since session 27 (``on_unchanged``, S26-policy26-3)
- target failure -> 502 code ``target_refused`` (``target_may_hold_change`` true when the target may have
  applied it before failing: the store gives it its committed set back now, after the push's outcome, R18-1,
  S19-R4, S19-R5)
- shared state: another instance stored the same version first -> 409 code ``conflict`` (this
  instance adopts that set; the operator retries; ``result`` is the change record, ``shared: conflict``)
- shared state, this instance's master pending (a master rotation not provisioned here yet) and the stored set
  unreadable here -> 503 code ``master_pending``: the change is applied on this instance only, not shared; the
  message names the master generation to provision (``result``: the record, ``shared: master_pending``;
  S22-review-3)
- shared state: the change was not stored and Redis failed before the stored set could be read -> 503 code
  ``state_unavailable`` (applied here; whether the stored set replaces it is unknown; S22-fixrot-2)
- a validated change that could not be written -> 500 code ``policy_not_persisted`` (rolled back;
  ``target_may_hold_change`` true when the target may still decide with it, R17-3)

A failed change request (``PUT``/``DELETE``, the roll-back's ``POST``) of an admitted operator, whatever the
error (and an unexpected exception, 500 ``internal_error``, re-raised), is handed to
``on_failure`` as one record (:func:`failure_record`; session 21, S21-newcomer-3); a
failed read is not (reads stay unaudited).

Every error has the public API's shape, ``{"error": {"message", "type",
"code", "param"}}`` (:func:`error_body`; ``errors`` and ``report`` sit inside
``error`` when present), and leaves the store as it
was: 400 ``invalid_parameter`` (bad id or path, non-UTF-8 Rego, bad JSON,
``NaN``/``Infinity``, a number beyond a double such as ``1e400``, nesting too deep, a data document that is not an
object), 400 ``policy_rejected`` (does not compile, a refused built-in, a
Rego test fails, a data document overlapping another), 404, 413
``body_too_large`` (over :data:`MAX_BODY_BYTES`, checked on
``Content-Length`` before reading and while reading), 415
``unsupported_media_type`` (Rego must be ``text/plain`` and data
``application/json`` when a ``Content-Type`` is sent).
"""

from __future__ import annotations

import asyncio
import json
import re
import time
from collections.abc import Awaitable, Callable
from typing import Any

from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from policy.decision import PolicyError
from policy.json_numbers import NonFiniteLiteral, finite_float, refuse_constant
from policy.loader import compile_errors, sha256_text
from policy.store import (
    ChangeRecord,
    PolicyBaseUnsharedError,
    PolicyConflictError,
    PolicyMasterPendingError,
    PolicyNotFoundError,
    PolicyPersistError,
    PolicyRejectedError,
    PolicyStore,
    PolicyTargetError,
    PolicyUnchanged,
    PolicyVersionError,
)
from policy.store_types import PolicySharedStateError

Authorize = Callable[[Request], Awaitable[dict[str, Any]]]

MAX_BODY_BYTES = 1024 * 1024
#: a target (policy id or data path) recorded in a failure record must match this; another is left out
_TARGET_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_./-]{0,127}$")
#: error codes whose message is fixed text, recorded in a failure record (a compile error or a
#: target's answer may quote the uploaded Rego or data, a persist error paths: never recorded)
_MESSAGE_RECORDED = frozenset({"resource_not_found", "body_too_large", "unsupported_media_type",
                               "version_not_restorable", "version_pruned", "not_supported"})
#: the roll-back route (session 24, S23-newcomer-3), audited under this template
ROLLBACK_ROUTE = "/admin/policies/rollback"


def failure_record(kind: str, op: str, target: str, who: str, status: int, code: str, message: str,
                   client_address: str | None = None, rollback_to: int | None = None) -> dict[str, Any]:
    """The record of an operator's policy or data change that failed (session 21, S21-newcomer-3).

    ``{"action": "policy_change", "outcome": "failed", "kind": policy|data, "op": put|delete,
    "route" (the route template), "actor" (SPIFFE ID), "status" (HTTP), "error_code", "ts"
    (Unix seconds)}`` plus ``target`` (the policy id or data path, only when it matches
    ``_TARGET_RE``), ``message`` only for the codes in ``_MESSAGE_RECORDED`` (fixed texts), and
    ``client_address`` (the request's source, when given: the event's source; session 22,
    S21-fixaudit-1). A failed roll-back (session 24): ``kind`` ``set`` (session 25, as its success record,
    S25-newcomer-7), ``op`` ``rollback``, ``route`` :data:`ROLLBACK_ROUTE`,
    no ``target``, ``rollback_to`` the version asked for when the body named an integer in 0..2**63-1.
    Never recorded: the uploaded Rego or data document, its digest, a compile error or test
    report (they quote the upload), a target's or a persist error's message.
    """
    route = ROLLBACK_ROUTE if op == "rollback" else "/admin/policies/{id}" if kind == "policy" else "/admin/data/{path}"
    record: dict[str, Any] = {"action": "policy_change", "ts": time.time(), "outcome": "failed", "kind": kind,
                              "op": op, "route": route, "actor": who, "status": status, "error_code": code}
    if _TARGET_RE.match(target) and ".." not in target:
        record["target"] = target
    if code in _MESSAGE_RECORDED:
        record["message"] = message
    if isinstance(client_address, str):
        record["client_address"] = client_address
    if isinstance(rollback_to, int) and not isinstance(rollback_to, bool) and 0 <= rollback_to < 2**63:
        record["rollback_to"] = rollback_to  # bounded: the audit encodes 64-bit integers only
    return record


def error_body(status: int, code: str, message: str, **extra: Any) -> dict[str, Any]:
    """The admin error body: the public API's OpenAI-style shape (gateway/errors.py),
    ``{"error": {"message", "type", "code", "param", **extra}}``; ``type`` follows the status
    (401 authentication_error, 403 permission_error, 429 rate_limit_error, 5xx server_error,
    else invalid_request_error). Kept here because ``policy`` never imports ``gateway``; a
    test (tests/quickstart/test_i13_admin_errors.py) pins it to the gateway's shape."""
    if status >= 500:
        err_type = "server_error"
    else:
        err_type = {401: "authentication_error", 403: "permission_error", 429: "rate_limit_error"}.get(
            status, "invalid_request_error")
    return {"error": {"message": message, "type": err_type, "code": code, "param": None, **extra}}


def unchanged_record(kind: str, op: str, target: str, who: str, version: int, client_address: str | None = None,
                     rollback_to: int | None = None) -> dict[str, Any]:
    """The operator record of a write that changed nothing (session 27, S26-policy26-3 / S27-review27-4): as
    :func:`failure_record`'s fields (``action``, ``kind``, ``op``, ``route``, ``actor``, ``ts``, ``target``
    when it matches ``_TARGET_RE``, ``client_address``, ``rollback_to``) with ``"outcome": "succeeded"``,
    ``"unchanged": true`` and ``version`` (the version in force, which stays). Never the upload or its digest."""
    record = failure_record(kind, op, target, who, 200, "", "", client_address, rollback_to)
    for key in ("status", "error_code"):
        del record[key]
    record.update(outcome="succeeded", unchanged=True, version=version)
    return record


def _written(record: ChangeRecord | PolicyUnchanged, request: Request) -> JSONResponse:
    """200 ``{"result": record}``; a write that changed nothing (session 26, S25-review-8) answers the version in
    force's entry with ``"unchanged": true`` (no version committed) and marks ``request.state.unchanged_version``
    for the operator record (session 27)."""
    if isinstance(record, PolicyUnchanged):
        request.state.unchanged_version = record.version
        return JSONResponse({"result": record.to_dict(), "unchanged": True})
    return JSONResponse({"result": record.to_dict()})


def _err(status: int, code: str, message: str, **extra: Any) -> JSONResponse:
    return JSONResponse(error_body(status, code, message, **extra), status_code=status)


class _BadRequest(Exception):
    """An admin request refused before it reaches the store."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status, self.code, self.message = status, code, message


def _media_type(request: Request, allowed: tuple[str, ...]) -> None:
    raw = request.headers.get("content-type")
    if raw is None:
        return
    mt = raw.split(";", 1)[0].strip().lower()
    if mt not in allowed:
        raise _BadRequest(415, "unsupported_media_type", f"Content-Type must be one of {', '.join(allowed)}")


async def _body(request: Request) -> bytes:
    length = request.headers.get("content-length")
    if length is not None and (not length.isdigit() or int(length) > MAX_BODY_BYTES):
        raise _BadRequest(413, "body_too_large", f"body over {MAX_BODY_BYTES} bytes")
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > MAX_BODY_BYTES:
            raise _BadRequest(413, "body_too_large", f"body over {MAX_BODY_BYTES} bytes")
    return bytes(body)


def _int_param(request: Request, name: str, default: int | None) -> int | None:
    """Query parameter ``name`` as a decimal integer >= 0 (``default`` when absent). Raises ValueError."""
    raw = request.query_params.get(name)
    if raw is None:
        return default
    if not (raw.isascii() and raw.isdigit()) or len(raw) > 9:
        raise ValueError(f"{name} must be a decimal integer")
    return int(raw)


def _json(raw: bytes) -> Any:
    """Strict JSON: no NaN/Infinity and no number beyond a double (``1e400``: the gateway's rule,
    :mod:`policy.json_numbers`; session 23, S22-fixops-1), bounded nesting (ValueError otherwise)."""
    try:
        return json.loads(raw, parse_constant=refuse_constant, parse_float=finite_float)
    except NonFiniteLiteral as exc:
        raise ValueError(f"body is not valid JSON: {exc}") from None
    except RecursionError:
        raise ValueError("body nests too deeply") from None
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise ValueError("body must be JSON") from None


def admin_routes(store: PolicyStore, authorize: Authorize,
                 on_failure: Callable[[dict[str, Any]], Any] | None = None,
                 on_unchanged: Callable[[dict[str, Any]], Any] | None = None) -> list[Route]:
    """Routes of the policy admin API (see the module docstring).

    Args:
        store: the PolicyStore to manage.
        authorize: async ``request -> operator identity`` (a dict with ``spiffe_id`` or ``id``, and
            optionally ``client_address``, the request's source, recorded in a failure record)
            raising ``HTTPException`` 401/403.
        on_failure: called (sync) with one :func:`failure_record` for each
            failed ``PUT``/``DELETE`` of an authorized operator (its successes
            reach the audit as the store's change records, which carry the request's
            ``client_address`` too: the store's writes take it; session 23, S22-fixsec-2).
        on_unchanged: called (sync) with one :func:`unchanged_record` for each write of an authorized
            operator that changed nothing (200 ``unchanged``; session 27, S26-policy26-3): no version, but
            the SIEM sees every admin write.
    """

    async def operator(request: Request) -> tuple[str, str | None]:
        """The operator's SPIFFE ID and the request's source address (``client_address`` of what
        ``authorize`` returned, when a string; session 22, S21-fixaudit-1)."""
        ident = await authorize(request)
        who = ident.get("spiffe_id") or ident.get("id") if isinstance(ident, dict) else None
        if not isinstance(who, str) or not who:
            raise HTTPException(403, "operator identity required")
        source = ident.get("client_address") if isinstance(ident, dict) else None
        return who, source if isinstance(source, str) else None

    async def guarded(request: Request, fn: Callable[[str, str | None], Awaitable[Response]]) -> Response:
        """``fn(operator's SPIFFE ID, request's source)``'s answer; a failed change request audited."""
        who, source = await operator(request)
        try:
            response = await _answer(fn, who, source)
        except Exception:
            _failed(request, who, source, 500, "internal_error", "")
            raise
        if response.status_code >= 400:
            error = json.loads(response.body)["error"]  # the error_body this module just rendered
            _failed(request, who, source, response.status_code, error["code"], error["message"])
        elif on_unchanged is not None and (version := getattr(request.state, "unchanged_version", None)) is not None:
            kind, op, target = _what(request)
            to = getattr(request.state, "rollback_to", None)
            on_unchanged(unchanged_record(kind, op, target, who, version, source, to if op == "rollback" else None))
        return response

    def _what(request: Request) -> tuple[str, str, str]:
        """``(kind, op, target)`` of a write request: ``("set", "rollback", "")`` for the roll-back."""
        if request.method == "POST":
            return "set", "rollback", ""
        params = request.path_params
        kind, target = ("policy", params["id"]) if "id" in params else ("data", params.get("path", ""))
        return kind, "delete" if request.method == "DELETE" else "put", target

    def _failed(request: Request, who: str, source: str | None, status: int, code: str, message: str) -> None:
        if on_failure is None or request.method not in ("PUT", "DELETE", "POST"):
            return  # reads are not audited
        kind, op, target = _what(request)
        to = getattr(request.state, "rollback_to", None) if op == "rollback" else None  # S25-newcomer-7
        on_failure(failure_record(kind, op, target, who, status, code, message, source, to))

    async def _answer(fn: Callable[[str, str | None], Awaitable[Response]], who: str, source: str | None) -> Response:
        try:
            return await fn(who, source)
        except _BadRequest as exc:
            return _err(exc.status, exc.code, exc.message)
        except PolicyVersionError as exc:  # a roll-back that cannot be made (session 24)
            return _err(exc.status, exc.code, str(exc))
        except PolicyNotFoundError:
            return _err(404, "resource_not_found", "no such policy or document")
        except PolicyRejectedError as exc:
            errors = exc.report.errors or [
                {"code": "rego_test_failure", "message": r.name} for r in exc.report.results if r.outcome != "PASS"
            ]
            return _err(400, "policy_rejected", str(exc), errors=errors, report=exc.report.render())
        except PolicyTargetError as exc:
            return _err(502, "target_refused", str(exc), target_may_hold_change=exc.target_may_hold_change)
        except PolicyBaseUnsharedError as exc:  # S27-review27-6: not built on a set that lost in shared state
            return _err(exc.status, exc.code, str(exc))
        except PolicyConflictError as exc:  # SF17-1: another instance's change at this version won
            return _err(409, "conflict", str(exc), result=exc.record.to_dict())
        except PolicyMasterPendingError as exc:  # S22-review-3: in force here only, not shared, nothing to adopt
            return _err(503, "master_pending", str(exc), result=exc.record.to_dict())
        except PolicySharedStateError as exc:  # S22-fixrot-2: refused, then Redis failed: fail closed
            return _err(503, "state_unavailable", str(exc), result=exc.record.to_dict())
        except PolicyPersistError as exc:  # R17-3: rolled back; says whether the target may still hold it
            return _err(500, "policy_not_persisted", str(exc), target_may_hold_change=exc.target_may_hold_change)
        except ValueError as exc:
            return _err(400, "invalid_parameter", str(exc))
        except PolicyError as exc:  # e.g. PolicyCompileError: the change does not build
            errors = getattr(exc, "errors", None) or compile_errors(str(exc))
            return _err(400, "policy_rejected", str(exc), errors=errors)

    async def list_policies(request: Request) -> Response:
        async def run(who: str, address: str | None) -> Response:
            return JSONResponse({"result": store.list_policies(), "version": store.version})

        return await guarded(request, run)

    async def policy(request: Request) -> Response:
        module_id = request.path_params["id"]

        async def run(who: str, address: str | None) -> Response:
            if request.method == "GET":
                raw = store.get_policy(module_id)
                return JSONResponse({"result": {"id": module_id, "raw": raw, "sha256": sha256_text(raw)}})
            if request.method == "PUT":
                _media_type(request, ("text/plain",))
                try:
                    source = (await _body(request)).decode("utf-8")
                except UnicodeDecodeError:
                    raise ValueError("policy must be UTF-8") from None
                record = await store.put_policy(module_id, source, who, client_address=address)
            else:
                record = await store.delete_policy(module_id, who, client_address=address)
            return _written(record, request)

        return await guarded(request, run)

    async def data(request: Request) -> Response:
        path = request.path_params["path"]

        async def run(who: str, address: str | None) -> Response:
            if request.method == "GET":
                return JSONResponse({"result": store.get_data(path)})
            _media_type(request, ("application/json",))
            value = _json(await _body(request))
            record = await store.put_data(path, value, who, client_address=address)
            return _written(record, request)

        return await guarded(request, run)

    async def versions(request: Request) -> Response:
        async def run(who: str, address: str | None) -> Response:
            limit = _int_param(request, "limit", 50)
            before = _int_param(request, "before", None)
            listed = await asyncio.to_thread(store.versions, limit=limit, before=before)  # reads files: off the loop
            drift = await asyncio.to_thread(store.drift)  # S25-newcomer-8: the set in force vs its record
            return JSONResponse({"result": listed, "version": store.version, **drift})

        return await guarded(request, run)

    async def rollback(request: Request) -> Response:
        async def run(who: str, address: str | None) -> Response:
            _media_type(request, ("application/json",))
            body = _json(await _body(request))
            if not isinstance(body, dict) or set(body) != {"to"}:
                raise ValueError('the body must be {"to": <version>}')
            request.state.rollback_to = body["to"]
            record = await store.rollback(body["to"], who, client_address=address)
            return _written(record, request)

        return await guarded(request, run)

    return [  # the two fixed paths before /admin/policies/{id}
        Route("/admin/policies/versions", versions, methods=["GET"]),
        Route(ROLLBACK_ROUTE, rollback, methods=["POST"]),
        Route("/admin/policies", list_policies, methods=["GET"]),
        Route("/admin/policies/{id}", policy, methods=["GET", "PUT", "DELETE"]),
        Route("/admin/data/{path:path}", data, methods=["GET", "PUT"]),
    ]
