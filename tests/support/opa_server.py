"""A small server speaking the subset of OPA's REST API that PrefixGate uses.

For tests, the benchmark and demos only: no OPA server binary can be
installed from this project's package registries. PRODUCTION USES A REAL OPA
(``opa run --server``), reached through :class:`policy.remote.RemoteOpa`.

Endpoints (shapes as in https://www.openpolicyagent.org/docs/rest-api/):

- ``POST /v1/data/{path}`` body ``{"input": ...}`` and ``GET /v1/data/{path}``
  -> 200 ``{"result": ...}`` (``result`` omitted when undefined), plus
  ``"decision_id"`` when decision logging is on, plus ``"provenance"`` with
  ``?provenance=true``; evaluation error -> 500 ``{"code": "internal_error",
  "message": ...}``. A POST without ``input`` adds OPA's ``warning``.
- ``PUT /v1/data/{path}`` (JSON) -> 204; ``DELETE /v1/data/{path}`` -> 204/404.
- ``PUT /v1/policies/{id}`` (text/plain Rego) -> 200 ``{}``; compile error ->
  400 ``{"code": "invalid_parameter", "message": "error(s) occurred while
  compiling module(s)", "errors": [{"code", "message", "location"}]}``.
- ``GET /v1/policies`` -> ``{"result": [{"id", "raw", "ast"}]}``;
  ``GET /v1/policies/{id}`` -> ``{"result": {"id", "raw", "ast"}}``;
  ``DELETE /v1/policies/{id}`` -> 200 ``{}``; unknown id -> 404
  ``{"code": "resource_not_found", "message": ...}``.
- ``GET /health`` -> 200 ``{}``.

Every change compiles a new embedded engine and swaps it in; a change that
does not compile is refused and the active set stays.

Run: ``python -m tests.support.opa_server --port P --policy-dir rego/``.
"""

from __future__ import annotations

import asyncio
import copy
import json
import re
import uuid
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import click
import uvicorn
from opa_bindings import OpaEngine, OpaError, OpaUndefinedError
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from policy.decision import PolicyCompileError
from policy.loader import build_engine, compile_errors, load_policy_dir
from sim.click_options import ClickOptions

MAX_BODY_BYTES = 8 * 1024 * 1024
_IDENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def _error(status: int, code: str, message: str, errors: list[dict[str, Any]] | None = None) -> JSONResponse:
    body: dict[str, Any] = {"code": code, "message": message}
    if errors:
        body["errors"] = errors
    return JSONResponse(body, status_code=status)


def _bool_param(request: Request, name: str) -> bool:
    """OPA's boolean query parameters: present and empty, or ``true``."""
    values = request.query_params.getlist(name)
    return any(v == "" or v.lower() == "true" for v in values)


def _segments(path: str) -> list[str]:
    return [s for s in path.strip("/").split("/") if s]


class OpaServerState:
    """Modules and data of the server plus the compiled engine.

    Args:
        modules: id -> Rego source.
        data: the data tree.
        decision_logs: include ``decision_id`` in Data API answers, as OPA
            does when decision logging is enabled.
        builtins: None (default) serves every built-in, like ``opa run``
            without ``--capabilities`` (so tests can show what the gateway's
            own check keeps out); an iterable restricts modules to those
            built-ins, like ``--capabilities`` (:mod:`policy.builtins`).

    Raises:
        PolicyCompileError: the initial set does not compile.
    """

    def __init__(self, modules: dict[str, str] | None = None, data: dict[str, Any] | None = None,
                 *, decision_logs: bool = True, builtins: Iterable[str] | None = None) -> None:
        self.modules: dict[str, str] = dict(modules or {})
        self.data: dict[str, Any] = copy.deepcopy(data or {})
        self.decision_logs = decision_logs
        self.revision = 0
        self.lock = asyncio.Lock()
        self.builtins = None if builtins is None else frozenset(builtins)
        self.engine: OpaEngine = self._build(self.modules, self.data)

    def _build(self, modules: dict[str, str], data: dict[str, Any]) -> OpaEngine:
        return build_engine(modules, data, allowed_builtins=self.builtins, check_builtins=self.builtins is not None)

    def swap(self, modules: dict[str, str], data: dict[str, Any]) -> None:
        """Compile and activate a new set (raises PolicyCompileError)."""
        engine = self._build(modules, data)
        self.engine, self.modules, self.data = engine, modules, data
        self.revision += 1

    def evaluate(self, segments: list[str], input: Any, has_input: bool) -> Any:
        """Value of ``data.<segments>``; raises OpaUndefinedError/OpaError."""
        inp = input if has_input else None
        if all(_IDENT.match(s) for s in segments):
            return self.engine.eval_document(".".join(segments), inp)
        ref = "data" + "".join(f"[{json.dumps(s)}]" for s in segments)
        rows = self.engine.eval_query(f"x := {ref}", inp)
        if not rows:
            raise OpaUndefinedError(ref)
        return rows[0]["x"]

    def module_ast(self, module_id: str) -> Any:
        """The module's AST as OPA's ``rego.parse_module`` renders it."""
        rows = self.engine.eval_query(
            "m := rego.parse_module(input.id, input.src)", {"id": module_id, "src": self.modules[module_id]}
        )
        return rows[0]["m"]


async def _read_body(request: Request) -> bytes | None:
    body = b""
    async for chunk in request.stream():
        body += chunk
        if len(body) > MAX_BODY_BYTES:
            return None
    return body


def create_app(state: OpaServerState) -> Starlette:
    """Starlette app serving ``state`` over OPA's REST API subset."""

    def _provenance() -> dict[str, Any]:
        return {"version": "prefixgate-opa-server", "revision": str(state.revision)}

    async def data_query(request: Request) -> Response:
        segments = _segments(request.path_params.get("path", ""))
        has_input, value = False, None
        warning = None
        if request.method == "POST":
            raw = await _read_body(request)
            if raw is None:
                return _error(413, "invalid_parameter", "request body too large")
            if raw.strip():
                try:
                    doc = json.loads(raw)
                except ValueError as exc:
                    return _error(400, "invalid_parameter", f"body contains malformed input document: {exc}")
                if not isinstance(doc, dict):
                    return _error(400, "invalid_parameter", "body must be an object")
                has_input, value = "input" in doc, doc.get("input")
            if not has_input:
                warning = {"code": "api_usage_warning", "message": "'input' key missing from the request"}
        body: dict[str, Any] = {}
        try:
            body["result"] = state.evaluate(segments, value, has_input)
        except OpaUndefinedError:
            pass
        except OpaError as exc:
            return _error(500, "internal_error", exc.message)
        if state.decision_logs:
            body["decision_id"] = str(uuid.uuid4())
        if _bool_param(request, "provenance"):
            body["provenance"] = _provenance()
        if warning:
            body["warning"] = warning
        return JSONResponse(body)

    async def data_put(request: Request) -> Response:
        segments = _segments(request.path_params.get("path", ""))
        raw = await _read_body(request)
        if raw is None:
            return _error(413, "invalid_parameter", "request body too large")
        try:
            value = json.loads(raw)
        except ValueError as exc:
            return _error(400, "invalid_parameter", f"body contains malformed JSON: {exc}")
        async with state.lock:
            data = copy.deepcopy(state.data)
            if not segments:
                if not isinstance(value, dict):
                    return _error(400, "invalid_parameter", "root document must be an object")
                data = value
            else:
                node = data
                for seg in segments[:-1]:
                    nxt = node.setdefault(seg, {})
                    if not isinstance(nxt, dict):
                        return _error(409, "resource_conflict", f"storage_write_conflict_error: /{'/'.join(segments)}")
                    node = nxt
                node[segments[-1]] = value
            try:
                state.swap(dict(state.modules), data)
            except PolicyCompileError as exc:
                return _error(400, "invalid_parameter", str(exc))
        return Response(status_code=204)

    async def data_delete(request: Request) -> Response:
        segments = _segments(request.path_params.get("path", ""))
        async with state.lock:
            data = copy.deepcopy(state.data)
            node: Any = data
            for seg in segments[:-1]:
                node = node.get(seg) if isinstance(node, dict) else None
            if not segments or not isinstance(node, dict) or segments[-1] not in node:
                return _error(404, "resource_not_found", f"storage_not_found_error: /{'/'.join(segments)}: document missing")
            del node[segments[-1]]
            try:
                state.swap(dict(state.modules), data)
            except PolicyCompileError as exc:
                return _error(400, "invalid_parameter", str(exc))
        return Response(status_code=204)

    def _not_found(module_id: str) -> JSONResponse:
        return _error(404, "resource_not_found", f'storage_not_found_error: policy id "{module_id}"')

    async def policy_list(request: Request) -> Response:
        result = [{"id": k, "raw": v, "ast": state.module_ast(k)} for k, v in sorted(state.modules.items())]
        return JSONResponse({"result": result})

    async def policy_get(request: Request) -> Response:
        module_id = request.path_params["id"]
        if module_id not in state.modules:
            return _not_found(module_id)
        raw = state.modules[module_id]
        return JSONResponse({"result": {"id": module_id, "raw": raw, "ast": state.module_ast(module_id)}})

    async def policy_put(request: Request) -> Response:
        module_id = request.path_params["id"]
        raw = await _read_body(request)
        if raw is None:
            return _error(413, "invalid_parameter", "request body too large")
        try:
            source = raw.decode("utf-8")
        except UnicodeDecodeError:
            return _error(400, "invalid_parameter", "policy is not UTF-8")
        async with state.lock:
            try:
                state.swap({**state.modules, module_id: source}, state.data)
            except PolicyCompileError as exc:
                errors = getattr(exc, "errors", compile_errors(str(exc)))
                return _error(400, "invalid_parameter", "error(s) occurred while compiling module(s)", errors)
        return JSONResponse({})

    async def policy_delete(request: Request) -> Response:
        module_id = request.path_params["id"]
        async with state.lock:
            if module_id not in state.modules:
                return _not_found(module_id)
            modules = {k: v for k, v in state.modules.items() if k != module_id}
            try:
                state.swap(modules, state.data)
            except PolicyCompileError as exc:
                errors = getattr(exc, "errors", compile_errors(str(exc)))
                return _error(400, "invalid_parameter", "error(s) occurred while compiling module(s)", errors)
        return JSONResponse({})

    async def health(request: Request) -> Response:
        return JSONResponse({})

    routes = [
        Route("/health", health, methods=["GET"]),
        Route("/v1/policies", policy_list, methods=["GET"]),
        Route("/v1/policies/", policy_list, methods=["GET"]),
        Route("/v1/policies/{id:path}", policy_get, methods=["GET"]),
        Route("/v1/policies/{id:path}", policy_put, methods=["PUT"]),
        Route("/v1/policies/{id:path}", policy_delete, methods=["DELETE"]),
        Route("/v1/data", data_query, methods=["GET", "POST"]),
        Route("/v1/data/{path:path}", data_query, methods=["GET", "POST"]),
        Route("/v1/data/{path:path}", data_put, methods=["PUT"]),
        Route("/v1/data/{path:path}", data_delete, methods=["DELETE"]),
    ]
    return Starlette(routes=routes)


def state_from_dir(policy_dir: str | Path, *, decision_logs: bool = True) -> OpaServerState:
    """Server state with a policy directory's modules (tests excluded) and data."""
    ps = load_policy_dir(policy_dir)
    return OpaServerState(ps.policies(), ps.data_tree(), decision_logs=decision_logs)


def main(argv: list[str] | None = None) -> None:
    """CLI: ``python -m tests.support.opa_server --port P --policy-dir DIR``."""
    parser = ClickOptions(description="OPA REST API subset on the embedded engine (tests only)")
    parser.option("--host", default="127.0.0.1")
    parser.option("--port", type=int, default=8181)
    parser.option("--policy-dir", default=None)
    parser.option("--decision-logs", type=click.Choice(("on", "off")), default="on")
    args = parser.parse(argv)
    logs = args.decision_logs == "on"
    state = state_from_dir(args.policy_dir, decision_logs=logs) if args.policy_dir else OpaServerState(decision_logs=logs)
    uvicorn.run(create_app(state), host=args.host, port=args.port, log_level="warning", access_log=False)


if __name__ == "__main__":
    main()
