"""The request path of one inference call, top to bottom (DESIGN.md, "the flow").

    authenticate → resolve tenant (+ limits) → parse → prefix keys →
    authorize (PDP) → route → proxy → audit

Each step is a call into a unit that is tested alone; this module only
sequences them, maps their errors to HTTP answers and records what happened
in a :class:`RequestRecord` that becomes exactly one audit event.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
import uuid
from collections.abc import AsyncGenerator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.types import Receive, Scope, Send

from gateway.components import Components
from gateway.errors import GatewayError
from gateway.proxy import UpstreamFailure, UpstreamStream, open_upstream
from gateway.request import Endpoint, InferenceRequest, parse_inference_request, read_body
from gateway.replicas import Attempt
from gateway.sse import SseProtocolError, SseScanner, error_event
from routing.policies import RouteRequest

__all__ = ["InferencePipeline", "RequestRecord", "ClientGone"]

T = TypeVar("T")

UPSTREAM_PATHS: dict[str, str] = {"chat": "/v1/chat/completions", "completions": "/v1/completions"}


@dataclass(slots=True)
class RequestRecord:
    """Everything the audit event of one request needs (never prompt text).

    Times are ``time.perf_counter()`` seconds; latencies are derived in ms.
    ``relayed_output``: output tokens relayed in an SSE answer (estimate, see
    :class:`gateway.sse.SseScanner`); ``settlement``: the token ledger's
    :class:`tenancy.ledger.Settlement` of the request (None: nothing reserved).
    """

    request_id: str
    endpoint: str
    client_addr: str | None
    t0: float
    spiffe_id: str | None = None
    trust_domain: str | None = None
    tenant_id: str | None = None
    model: str | None = None
    stream: bool = False
    prompt_tokens: int | None = None
    sequences: int | None = None
    max_tokens: int | None = None
    output_tokens: int | None = None
    cached_tokens: int | None = None
    decision_id: str | None = None
    reason_code: str | None = None
    reason: str | None = None
    replica: str | None = None
    pool: str | None = None
    routing_policy: str | None = None
    predicted_prefix_tokens: int | None = None
    available_prefix_tokens: int | None = None
    replica_load_tokens: int | None = None
    attempts: int = 0
    status: int | None = None
    outcome: str = "failed"
    error_code: str | None = None
    prefix_fingerprint: str | None = None
    t_auth: float | None = None
    t_policy: float | None = None
    t_route: float | None = None
    t_first_byte: float | None = None
    t_end: float | None = None
    relayed_output: int | None = None
    settlement: Any = None
    extra: dict[str, Any] = field(default_factory=dict)

    def ms(self, start: float | None, end: float | None) -> float | None:
        """Milliseconds between two perf-counter stamps (None if either is missing)."""
        if start is None or end is None:
            return None
        return round((end - start) * 1000.0, 3)


class InferencePipeline:
    """Handles ``/v1/completions`` and ``/v1/chat/completions`` end to end.

    ``components`` holds every collaborator (identity, tenancy, policy,
    routing, upstream session, audit); see :mod:`gateway.components`.
    """

    def __init__(self, components: Components) -> None:
        self.c = components
        self.cfg = components.config

    async def handle(self, request: Request, endpoint: Endpoint) -> Response:
        """Serve one inference request; always returns a response, never raises."""
        c = self.c
        rec = RequestRecord(
            request_id=uuid.uuid4().hex,
            endpoint=UPSTREAM_PATHS[endpoint],
            client_addr=c.authn.source(request),  # behind a trusted proxy: the client it attests
            t0=time.perf_counter(),
        )
        held = _Held()
        c.audit.start_span(rec, request.headers)
        try:
            if not c.audit_accepting():
                raise GatewayError(503, "audit_unavailable", "audit trail unavailable; refusing to serve without it")
            # 1 authenticate
            identity = await c.authn.authenticate(request)
            rec.spiffe_id, rec.trust_domain = str(identity.spiffe_id), identity.trust_domain
            rec.t_auth = time.perf_counter()
            # 2 resolve tenant; rate and concurrency limits before any work
            tenant = c.resolve_tenant(identity)
            rec.tenant_id = tenant.id
            held.lease = c.admit(tenant)
            bounds = c.request_bounds(tenant)
            # 3 parse (message and batch counts are checked before schema validation)
            raw = await read_body(request, self.cfg.limits.max_body_bytes, self.cfg.limits.body_read_timeout_s)
            req = parse_inference_request(raw, endpoint, self.cfg.limits.max_json_depth,
                                          max_messages=bounds.max_messages,
                                          max_batch_prompts=bounds.max_batch_prompts,
                                          max_json_items=self.cfg.limits.max_json_items)
            rec.stream = req.stream
            if req.model not in c.served_models:  # a client-chosen string: never copied into the audit trail
                raise GatewayError(404, "model_not_found", "the requested model does not exist", param="model")
            rec.model = req.model
            rec.sequences = req.sequences
            c.admit_sequences(tenant, held.lease, req.sequences)  # each prompt of a batch is a request
            # 4 prefix keys (byte bound, then tokenize once with early stop; prompt-token limits)
            tokens, prompt_tokens = c.prompt_tokens(bounds, req)
            rec.prompt_tokens = prompt_tokens
            # reserve prompt + max_tokens x sequences before any further work; the end settles it
            output_cap = c.output_cap(req.max_tokens, tenant)
            held.reservation = c.check_prompt(tenant, prompt_tokens, req.sequences, output_cap * req.sequences)
            chains = c.prefix_chains(tenant, tokens)
            rec.prefix_fingerprint = c.prefix_fingerprint(tenant, chains)
            # 5 authorize
            candidates = c.candidates(tenant)
            if not candidates:
                raise GatewayError(503, "no_replica", "no healthy replica is available for this tenant")
            decision = await c.decide(identity, tenant, req, prompt_tokens, candidates, rec)
            rec.t_policy = time.perf_counter()
            max_tokens = c.clamp_max_tokens(req.max_tokens, tenant, decision)
            rec.max_tokens = max_tokens
            c.lower_reservation(held.reservation, max_tokens * req.sequences)
            allowed = c.allowed_candidates(candidates, decision)
            if not allowed:
                raise GatewayError(
                    503, "no_replica", "no healthy replica is allowed for this request",
                    extra={"decision_id": decision.decision_id},
                )
            body = dict(req.body)
            body["max_tokens"] = max_tokens
            user = c.upstream_user(tenant, identity)
            if user is not None:
                body["user"] = user
            if req.stream:
                body["stream_options"] = {"include_usage": True}
            route_req = RouteRequest(
                tenant_id=tenant.id,
                block_keys=chains.current,
                prompt_tokens=prompt_tokens,
                max_tokens=max_tokens * req.sequences,
                block_size=self.cfg.routing.block_size,
                sequences=req.sequences,
            )
            # 6+7 route and proxy, retrying on another replica before the first byte
            return await self._route_and_proxy(request, req, rec, tenant, route_req, chains, allowed, body, held)
        except GatewayError as err:
            rec.status, rec.outcome, rec.error_code = err.status, err.outcome, err.code
            return err.response()
        except ClientGone:
            # The client hung up before any answer: nobody reads a response; 499 is for the record.
            rec.status, rec.outcome, rec.error_code = 499, "cancelled", "client_disconnect"
            return Response(status_code=499)
        except asyncio.CancelledError:
            rec.status, rec.outcome, rec.error_code = 499, "cancelled", "client_disconnect"
            raise
        except Exception:  # a bug: answer 500 but never lose the audit record
            c.log.exception("unhandled error in request %s", rec.request_id)
            rec.status, rec.outcome, rec.error_code = 500, "failed", "internal_error"
            return GatewayError(500, "internal_error", "internal error").response()
        finally:
            # The one exit path: everything the request holds is given back and its audit
            # record written, however it ended; a streaming answer does this when it ends.
            if not held.handed_off:
                self._end(rec, held)

    async def _route_and_proxy(
        self, request: Request, req: InferenceRequest, rec: RequestRecord, tenant: Any,
        route_req: RouteRequest, chains: Any, allowed: list[Any], body: dict[str, Any], held: _Held,
    ) -> Response:
        c = self.c
        ucfg = self.cfg.upstream
        deadline = rec.t0 + ucfg.total_timeout_s
        remaining = list(allowed)
        last: UpstreamFailure | None = None
        budget_used = 0  # connect failures (request never reached a replica) do not use the budget
        while remaining and budget_used < ucfg.max_attempts:
            held.end_attempt()  # the previous attempt's verdict was given; give back what it held
            rec.attempts += 1
            choice, held.ticket = c.router.route(route_req, [r.id for r in remaining], chains.previous_chains())
            held.choice = choice
            replica = c.replica(choice.replica_id)
            held.attempt = c.replica_set.attempt(replica.id)
            rec.replica, rec.pool, rec.routing_policy = replica.id, replica.pool, choice.policy
            rec.predicted_prefix_tokens = choice.predicted_prefix_tokens
            rec.available_prefix_tokens = choice.available_prefix_tokens
            rec.replica_load_tokens = c.router.loads.snapshot(replica.id).tokens
            rec.t_route = time.perf_counter()
            upstream_body = dict(body)
            if replica.cache_salt:
                upstream_body["cache_salt"] = c.cache_salt(tenant)
            headers = c.upstream_headers(rec)
            # a plain answer's first byte comes only after the whole generation: it is bounded by the
            # total deadline, not by first_byte_timeout_s (which would cut off long, legitimate answers
            # and count them against a healthy replica)
            left = deadline - time.perf_counter()
            budget = max(0.001, min(ucfg.first_byte_timeout_s, left) if req.stream else left)
            progress, held.progress = held.progress, "unknown"  # sent: the replica may be working on it
            try:
                up = await _unless_client_leaves(
                    request, open_upstream(c.session, replica.url + rec.endpoint, upstream_body, headers, budget))
            except UpstreamFailure as fail:
                last = fail
                if not fail.reached:
                    held.progress = progress  # no connection: this attempt cost nothing
                elif fail.kind == "status":
                    held.progress = "refused"  # the replica answered an error: no output
                c.upstream_failed(held.attempt, fail)
                if fail.kind != "connect":
                    budget_used += 1
                if not fail.retryable:
                    break
                remaining = [r for r in remaining if r.id != replica.id]
                if time.perf_counter() >= deadline:
                    break
                continue
            held.up = up
            budget_used += 1
            c.upstream_ok(replica.id, up.instance_id)
            rec.t_first_byte = time.perf_counter()
            held.ticket.first_token()
            if req.stream:
                response = self._stream_response(req, rec, held)
                held.handed_off = True
                return response
            return await self._plain_response(request, rec, held)
        raise self._failure_error(last)

    def _failure_error(self, fail: UpstreamFailure | None) -> GatewayError:
        if fail is None:
            return GatewayError(503, "no_replica", "no healthy replica is allowed for this request")
        if fail.kind == "status" and not fail.retryable:
            return _passthrough_error(fail)
        if fail.kind == "timeout":
            return GatewayError(504, "upstream_timeout", "the replica did not answer in time")
        return GatewayError(502, "upstream_error", "the replica failed to answer")

    def _stream_response(self, req: InferenceRequest, rec: RequestRecord, held: _Held) -> Response:
        scanner = SseScanner(keep_usage_chunk=req.include_usage)
        read_timeout = self.cfg.upstream.read_timeout_s
        up = held.up
        assert up is not None and held.attempt is not None

        async def body() -> AsyncGenerator[bytes, None]:
            held.started = True
            held.progress = "streamed"
            rec.outcome, rec.status = "failed", 200
            try:
                first = scanner.feed(up.first_chunk)
                if first:
                    yield first
                while True:
                    async with asyncio.timeout(read_timeout):
                        chunk = await up.read_chunk()
                    if not chunk:
                        break
                    out = scanner.feed(chunk)
                    if out:
                        yield out
                rest = scanner.finish()
                if rest:
                    yield rest
                rec.outcome = "allowed"
                held.attempt.succeeded()
            except Exception as exc:  # broken SSE, read timeout, connection reset
                code = "upstream_timeout" if isinstance(exc, TimeoutError) else "upstream_stream_error"
                rec.error_code = code
                self.c.upstream_failed(held.attempt, UpstreamFailure("protocol", str(exc)))
                if isinstance(exc, SseProtocolError) and exc.forward:
                    yield exc.forward  # the valid events before the bad one
                yield error_event("the replica stream failed before completion", code)
            except BaseException:
                if scanner.done:  # the client hung up after [DONE]: it got the whole answer
                    rec.outcome = "allowed"
                    held.attempt.succeeded()
                else:
                    rec.outcome, rec.status, rec.error_code = "cancelled", 499, "client_disconnect"
                raise
            finally:
                held.usage = scanner.usage
                held.relayed = rec.relayed_output = scanner.output_tokens
                self._end(rec, held)

        def on_call_end() -> None:
            if not held.started:  # the client left between the replica's first byte and the answer's start
                rec.outcome, rec.status, rec.error_code = "cancelled", 499, "client_disconnect"
            self._end(rec, held)

        headers = {"Cache-Control": "no-cache", "X-Request-Id": rec.request_id}
        return _EndingStreamingResponse(body(), on_end=on_call_end, media_type="text/event-stream", headers=headers)

    async def _plain_response(self, request: Request, rec: RequestRecord, held: _Held) -> Response:
        """Read the rest of a plain answer; :meth:`handle`'s exit path ends the request."""
        up = held.up
        assert up is not None and held.attempt is not None

        async def read_rest() -> bytes:
            async with asyncio.timeout(self.cfg.upstream.read_timeout_s):
                rest = await up.read_rest()
            return up.first_chunk + rest

        try:
            data = await _unless_client_leaves(request, read_rest())
            obj = _json_object(data)
        except ClientGone:
            rec.outcome, rec.status, rec.error_code = "cancelled", 499, "client_disconnect"
            return Response(status_code=499)
        except Exception as exc:  # timeout, broken connection, not a JSON object
            self.c.upstream_failed(held.attempt, UpstreamFailure("protocol", str(exc)))
            err = GatewayError(502, "upstream_error", "the replica sent an invalid answer")
            rec.status, rec.outcome, rec.error_code = 502, "failed", err.code
            return err.response()
        held.attempt.succeeded()
        held.usage = obj.get("usage") if isinstance(obj.get("usage"), dict) else None
        rec.status, rec.outcome = 200, "allowed"
        # parsed only to check it and read usage: the replica's bytes go out unchanged
        return Response(data, media_type="application/json", headers={"X-Request-Id": rec.request_id})

    def _end(self, rec: RequestRecord, held: _Held) -> None:
        """End the request (idempotent): give back all it holds, then write its one audit record."""
        if held.ended:
            return
        held.ended = True
        try:
            held.release()
        finally:
            try:
                self._settle(rec, held)
            finally:
                self._complete(rec, held.usage, held.choice)

    def _settle(self, rec: RequestRecord, held: _Held) -> None:
        """Reconcile the request's token reservation with what it used (tenancy/ledger.py)."""
        res = held.reservation
        if res is None:
            return
        try:
            rec.settlement = self.c.settle(res, usage=held.usage, progress=held.progress,
                                           relayed_output=held.relayed)
        except Exception:  # a bug: never lose the audit record; the reservation stays charged in full
            self.c.log.exception("settling the token reservation of request %s failed", rec.request_id)

    def _complete(self, rec: RequestRecord, usage: dict[str, Any] | None, choice: Any) -> None:
        if usage:
            details = usage.get("prompt_tokens_details") or {}
            cached = details.get("cached_tokens") if isinstance(details, dict) else None
            rec.cached_tokens = cached if isinstance(cached, int) else None
            out = usage.get("completion_tokens")
            rec.output_tokens = out if isinstance(out, int) else None
        if rec.cached_tokens is not None and choice is not None:
            self.c.router.observe_delivered(choice, rec.cached_tokens)
        self._finish(rec)

    def _finish(self, rec: RequestRecord) -> None:
        rec.t_end = time.perf_counter()
        self.c.record(rec)


class _Held:
    """What one request holds until it ends, and the verdicts it owes.

    ``lease``: the tenant's concurrency slot; ``ticket``: the router's load
    ticket of the current attempt; ``attempt``: its circuit-breaker attempt;
    ``up``: the open upstream response; ``choice``/``usage``: for the record;
    ``reservation``: the token ledger's reservation, settled by the exit
    path from ``usage``, ``progress`` (``none``: no replica reached yet;
    ``unknown``: sent, outcome unknown; ``refused``: a replica answered an
    error status; ``streamed``: an SSE answer started) and ``relayed``
    (output tokens relayed).
    :meth:`end_attempt` gives back the current attempt's share (closing the
    upstream, finishing the ticket, releasing a breaker attempt that has no
    verdict), :meth:`release` that and the lease. Both are idempotent; the
    request's one exit path (``InferencePipeline._end``) calls them.
    ``handed_off``: a streaming answer owns the ending; ``started``: its body
    began; ``ended``: the request was ended.
    """

    __slots__ = ("lease", "ticket", "attempt", "up", "choice", "usage", "handed_off", "started", "ended",
                 "reservation", "progress", "relayed")

    def __init__(self) -> None:
        self.lease: Any = None
        self.ticket: Any = None
        self.attempt: Attempt | None = None
        self.up: UpstreamStream | None = None
        self.choice: Any = None
        self.usage: dict[str, Any] | None = None
        self.handed_off = False
        self.started = False
        self.ended = False
        self.reservation: Any = None
        self.progress = "none"
        self.relayed = 0

    def end_attempt(self) -> None:
        """Close the upstream response, finish the load ticket, release the breaker attempt."""
        up, self.up = self.up, None
        try:
            if up is not None:
                up.close()
        finally:
            try:
                if self.ticket is not None:
                    self.ticket.finish()
            finally:
                if self.attempt is not None:
                    self.attempt.release()

    def release(self) -> None:
        """:meth:`end_attempt`, then free the tenant's concurrency slot."""
        try:
            self.end_attempt()
        finally:
            if self.lease is not None:
                self.lease.release()


class _EndingStreamingResponse(StreamingResponse):
    """A streaming answer that ends its request however its ASGI call ends.

    The body generator ends the request in its own ``finally``; but when the
    generator never started — the first ``send`` failed because the client
    was gone (ASGI 2.4: ``OSError``), or the sending task was cancelled
    before its first step — that ``finally`` never runs, and a generator left
    suspended at a ``yield`` only runs it whenever it is garbage-collected.
    So the call closes the generator (running its ending now if it stopped
    mid-way) and then calls ``on_end`` (idempotent), whatever way it ended.
    """

    def __init__(self, content: AsyncGenerator[bytes, None], *, on_end: Callable[[], None], **kw: Any) -> None:
        super().__init__(content, **kw)
        self._on_end = on_end
        self._content = content

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            try:
                await self._content.aclose()
            finally:
                self._on_end()


class ClientGone(Exception):
    """The client disconnected before the answer started (its upstream call is cancelled)."""


async def _unless_client_leaves(request: Request, work: Awaitable[T]) -> T:
    """Await ``work`` unless the client disconnects first: then cancel it and raise :class:`ClientGone`.

    Call only after the request body was read (it listens on ``receive``).
    """
    task = asyncio.ensure_future(work)
    watcher = asyncio.ensure_future(_wait_disconnect(request))
    try:
        done, _ = await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watcher.cancel()
    if task in done:
        return task.result()
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError, Exception):
        await task
    raise ClientGone()


async def _wait_disconnect(request: Request) -> None:
    """Return when the client disconnects (consumes no body: call after reading it)."""
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return


def _json_object(data: bytes) -> dict[str, Any]:
    obj = json.loads(data)
    if not isinstance(obj, dict):
        raise ValueError("not a JSON object")
    return obj


def _passthrough_error(fail: UpstreamFailure) -> GatewayError:
    """A replica's 4xx (the client's fault) is passed on with its message, never its raw body."""
    message = "the replica rejected the request"
    try:
        obj = _json_object(fail.body)
        m = obj.get("error", {}).get("message")
        if isinstance(m, str) and len(m) <= 500:
            message = m
    except (ValueError, AttributeError):
        pass
    return GatewayError(fail.status or 400, "upstream_rejected", message)
