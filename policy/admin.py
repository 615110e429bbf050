"""Operator admin API for policy management (Starlette routes).

Mount on the admin listener only. Every route first awaits
``authorize(request)``, which returns the operator identity (a dict with
``spiffe_id`` or ``id``) or raises ``HTTPException(401|403)``; an identity
without an id is refused with 403 (fail closed).

- ``GET /admin/policies`` -> ``{"result": [{"id", "sha256", "test"}], "version"}``
- ``GET /admin/policies/{id}`` -> ``{"result": {"id", "raw", "sha256"}}`` | 404
- ``PUT /admin/policies/{id}`` (text/plain Rego) -> ``{"result": record}`` |
  400 ``{"code": "policy_rejected", "errors": [...], "report": str}``
- ``DELETE /admin/policies/{id}`` -> ``{"result": record}`` | 404 | 400
- ``GET /admin/data/{path}`` -> ``{"result": document}`` | 404
- ``PUT /admin/data/{path}`` (JSON object) -> ``{"result": record}`` | 400
- target failure -> 502 ``{"code": "target_refused"}``
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import Any

from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from policy.loader import sha256_text
from policy.store import PolicyNotFoundError, PolicyRejectedError, PolicyStore, PolicyTargetError

Authorize = Callable[[Request], Awaitable[dict[str, Any]]]

MAX_BODY_BYTES = 1024 * 1024


def _err(status: int, code: str, message: str, **extra: Any) -> JSONResponse:
    return JSONResponse({"code": code, "message": message, **extra}, status_code=status)


async def _body(request: Request) -> bytes:
    body = b""
    async for chunk in request.stream():
        body += chunk
        if len(body) > MAX_BODY_BYTES:
            raise HTTPException(413, "body too large")
    return body


def admin_routes(store: PolicyStore, authorize: Authorize) -> list[Route]:
    """Routes of the policy admin API (see the module docstring).

    Args:
        store: the PolicyStore to manage.
        authorize: async ``request -> operator identity`` raising
            ``HTTPException`` 401/403.
    """

    async def operator(request: Request) -> str:
        ident = await authorize(request)
        who = ident.get("spiffe_id") or ident.get("id") if isinstance(ident, dict) else None
        if not isinstance(who, str) or not who:
            raise HTTPException(403, "operator identity required")
        return who

    async def guarded(request: Request, fn: Callable[[str], Awaitable[Response]]) -> Response:
        who = await operator(request)
        try:
            return await fn(who)
        except PolicyNotFoundError:
            return _err(404, "resource_not_found", "no such policy or document")
        except PolicyRejectedError as exc:
            errors = exc.report.errors or [
                {"code": "rego_test_failure", "message": r.name} for r in exc.report.results if r.outcome != "PASS"
            ]
            return _err(400, "policy_rejected", str(exc), errors=errors, report=exc.report.render())
        except PolicyTargetError as exc:
            return _err(502, "target_refused", str(exc))
        except ValueError as exc:
            return _err(400, "invalid_parameter", str(exc))

    async def list_policies(request: Request) -> Response:
        async def run(who: str) -> Response:
            return JSONResponse({"result": store.list_policies(), "version": store.version})

        return await guarded(request, run)

    async def policy(request: Request) -> Response:
        module_id = request.path_params["id"]

        async def run(who: str) -> Response:
            if request.method == "GET":
                raw = store.get_policy(module_id)
                return JSONResponse({"result": {"id": module_id, "raw": raw, "sha256": sha256_text(raw)}})
            if request.method == "PUT":
                try:
                    source = (await _body(request)).decode("utf-8")
                except UnicodeDecodeError:
                    raise ValueError("policy must be UTF-8") from None
                record = await store.put_policy(module_id, source, who)
            else:
                record = await store.delete_policy(module_id, who)
            return JSONResponse({"result": record.to_dict()})

        return await guarded(request, run)

    async def data(request: Request) -> Response:
        path = request.path_params["path"]

        async def run(who: str) -> Response:
            if request.method == "GET":
                return JSONResponse({"result": store.get_data(path)})
            try:
                value = json.loads(await _body(request))
            except json.JSONDecodeError:
                raise ValueError("body must be JSON") from None
            record = await store.put_data(path, value, who)
            return JSONResponse({"result": record.to_dict()})

        return await guarded(request, run)

    return [
        Route("/admin/policies", list_policies, methods=["GET"]),
        Route("/admin/policies/{id}", policy, methods=["GET", "PUT", "DELETE"]),
        Route("/admin/data/{path:path}", data, methods=["GET", "PUT"]),
    ]
