"""The Starlette applications: the public listener and the admin listener.

Public: ``POST /v1/completions``, ``POST /v1/chat/completions`` (streaming
and plain), ``GET /v1/models`` (authenticated, audited, one unit of the tenant's request rate;
only the tenant's models: gateway/listing.py),
``GET /healthz`` (liveness), ``GET /readyz`` (ready to route), ``GET
/metrics`` (Prometheus, unauthenticated: liveness and overload figures only;
``metrics.public_endpoint: off`` removes it; R3-5).

Admin (a separate listener; every request, whatever its path, needs a JWT-SVID
for the admin audience from a configured operator SPIFFE ID, checked before
routing, anything else 401/403 with the public listener's codes; R3-9):
tenant key and salt rotation, registry reload, policy and data management,
``GET /admin/metrics`` (every metric: request counts, tokens, latencies,
concentration, audit, per replica and tenant), ``GET /admin/replicas``,
``GET /admin/routing``.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from gateway.admin import OPERATOR_SCOPE_KEY, Admin, record_refusal
from gateway.build import Gateway
from gateway.errors import GatewayError
from gateway.exact_path import ExactPath
from gateway.framing import ASGIApp, FramingGuard
from gateway.identity import WorkloadIdentity
from gateway.inference_asgi import InferenceRoutes
from gateway.listing import list_models
from gateway.metrics_worker import with_worker_label
from gateway.pipeline import InferencePipeline
from gateway.protocol_audit import attach_refusal_audit

__all__ = ["build_public_app", "build_admin_app", "UNROUTED_ENDPOINT"]

#: ``endpoint`` of the audit event of a request to an unknown path or with a wrong method
#: (the path itself is client-chosen and never logged)
UNROUTED_ENDPOINT = "unrouted"


def build_public_app(c: Gateway, *, manage_lifecycle: bool = True, worker: str | None = None) -> ASGIApp:
    """Return the public ASGI app over ``c``.

    :class:`gateway.inference_asgi.InferenceRoutes`: the two inference routes
    straight to the pipeline under the framing guard's rules, every other route
    (and the lifespan) to the framing guard in front of a Starlette app.

    With ``manage_lifecycle`` the app's lifespan starts and stops ``c``
    (upstream session, health checks, audit sinks); the CLI turns it off
    when it runs the admin listener beside it and manages ``c`` itself.
    ``worker``: as for :func:`build_admin_app`, on the public ``/metrics``.
    """
    pipeline = InferencePipeline(c)

    async def completions(request: Request) -> Response:
        return await pipeline.handle(request, "completions")

    async def chat(request: Request) -> Response:
        return await pipeline.handle(request, "chat")

    async def models(request: Request) -> Response:
        return await list_models(c, request)  # audited, one rate unit (R5-4)

    async def healthz(request: Request) -> Response:
        return JSONResponse({"status": "ok"})

    async def readyz(request: Request) -> Response:
        problems = await c.readiness.problems()
        if problems:
            return JSONResponse({"status": "not_ready", "problems": problems}, status_code=503)
        return JSONResponse({"status": "ready"})

    async def metrics(request: Request) -> Response:
        c.readiness.refresh_gauges()
        return Response(with_worker_label(generate_latest(c.metrics.public), worker), media_type=CONTENT_TYPE_LATEST)

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        if manage_lifecycle:
            await c.start()
        try:
            yield
        finally:
            if manage_lifecycle:
                await c.stop()

    routes = [
        Route("/v1/completions", completions, methods=["POST"]),
        Route("/v1/chat/completions", chat, methods=["POST"]),
        Route("/v1/models", models, methods=["GET"]),
        Route("/healthz", healthz, methods=["GET"]),
        Route("/readyz", readyz, methods=["GET"]),
    ]
    if c.config.metrics.public_endpoint == "minimal":
        routes.append(Route("/metrics", metrics, methods=["GET"]))
    async def unrouted(request: Request, exc: Exception) -> Response:
        """404/405 (unknown path, wrong method): audited like every refusal (R4-4), with the
        caller's identity and tenant when its credential is valid (the answer stays 404/405)."""
        err = _gateway_error(exc)
        if err.status in (404, 405):
            identity, tenant = None, None
            try:
                identity = await c.authn.authenticate(request)
                tenant = c.admission.resolve_tenant(identity).id
            except GatewayError:
                pass
            record_refusal(c.audit, c.authn, request, UNROUTED_ENDPOINT, err, identity, tenant)
        return err.response()

    starlette = _no_slash_redirects(Starlette(routes=routes, lifespan=lifespan,
                                              exception_handlers={HTTPException: unrouted}))
    limits = c.config.limits
    framed = FramingGuard(starlette, max_drain_bytes=limits.max_drain_bytes,
                          drain_timeout_s=limits.body_read_timeout_s, budget=c.body_budget)
    return attach_refusal_audit(c, InferenceRoutes(framed, pipeline, c.recorder))


def build_admin_app(c: Gateway, *, worker: str | None = None) -> Starlette:
    """Return the operator-only admin Starlette app over ``c`` (no lifespan of its own). ``worker``: this
    process's index under ``serve --workers N``, put as a ``worker`` label on every sample of
    ``/admin/metrics`` (gateway/metrics_worker.py, S24-newcomer-1); None for one process (no label)."""

    async def admin_metrics(request: Request) -> Response:
        await c.admin.authorize_operator(request)
        c.readiness.refresh_gauges()
        text = generate_latest(c.metrics.public) + generate_latest(c.metrics.admin) + c.audit.admin_metrics_text()
        return Response(with_worker_label(text, worker), media_type=CONTENT_TYPE_LATEST)

    async def replicas(request: Request) -> Response:
        await c.admin.authorize_operator(request)
        return JSONResponse({"replicas": c.admin.replica_status()})

    async def routing(request: Request) -> Response:
        await c.admin.authorize_operator(request)
        return JSONResponse(c.admin.routing_status())

    routes = [
        Route("/admin/metrics", admin_metrics, methods=["GET"]),
        Route("/admin/replicas", replicas, methods=["GET"]),
        Route("/admin/routing", routing, methods=["GET"]),
        *c.admin.routes(),
    ]
    async def unrouted(request: Request, exc: Exception) -> Response:
        """An admitted operator's 404 / 405 (unknown admin path, wrong method: Starlette's router
        answers them, no route runs) is a refusal of endpoint ``admin`` with the operator's identity,
        like the gate's 401 / 403 / 415 (session 22, S21-fixaudit-2: before, no event); the path is
        client-chosen and never logged. Other statuses (a route's guard) are answered as they were."""
        err = _gateway_error(exc)
        if err.status in (404, 405):
            identity = request.scope.get(OPERATOR_SCOPE_KEY)
            record_refusal(c.audit, c.authn, request, "admin", err,
                           identity if isinstance(identity, WorkloadIdentity) else None)
        return err.response()

    middleware = [*_middleware(c), Middleware(OperatorGate, admin=c.admin), Middleware(ExactPath)]
    return attach_refusal_audit(c, _no_slash_redirects(Starlette(routes=routes, middleware=middleware,
                                         exception_handlers={HTTPException: unrouted, Exception: _internal_error})))


class OperatorGate:
    """ASGI middleware of the admin listener: authenticate the operator before routing (R3-9).

    Every HTTP request, whatever its path or method, first passes
    :meth:`gateway.admin.Admin.authenticate_operator`; a failure is answered here with its
    :class:`GatewayError` (the public listener's status and code for the same failure), so an
    unknown path and a real one answer alike until the caller is an operator. Routing (404,
    405) happens only after. Sits inside the framing guard (bodies drained before early answers).
    """

    def __init__(self, app: ASGIApp, admin: Admin) -> None:
        self.app = app
        self.admin = admin

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            try:
                await self.admin.authenticate_operator(Request(scope, receive))
            except GatewayError as err:
                await err.response()(scope, receive, send)
                return
        await self.app(scope, receive, send)


async def _internal_error(request: Request, exc: Exception) -> Response:
    """Last resort of the admin listener: a JSON 500 (never a traceback or plain text)."""
    return GatewayError(500, "internal_error", "internal error").response()


def _middleware(c: Gateway) -> list[Middleware]:
    """The framing guard (gateway/framing.py) of both listeners, sized from ``limits``."""
    limits = c.config.limits
    return [Middleware(FramingGuard, max_drain_bytes=limits.max_drain_bytes,
                       drain_timeout_s=limits.body_read_timeout_s, budget=c.body_budget)]


def _no_slash_redirects(app: Starlette) -> Starlette:
    """Turn off Starlette's trailing-slash redirect: it answers ``/v1/completions/``
    with a 307 to a URL built from the client's ``Host`` header (issue 10, finding 4).
    A path with an extra or missing slash is 404 like any other unknown path."""
    app.router.redirect_slashes = False
    return app


def _gateway_error(exc: Exception) -> GatewayError:
    """The :class:`GatewayError` of a Starlette ``HTTPException`` (routing's 404/405, a guard's 401/403)."""
    assert isinstance(exc, HTTPException)
    code = {401: "unauthenticated", 403: "forbidden", 404: "not_found", 405: "method_not_allowed"}.get(
        exc.status_code, "error"
    )
    return GatewayError(exc.status_code, code, str(exc.detail), headers=dict(exc.headers or {}))

