"""The answer half of one inference call (moved out of :mod:`gateway.pipeline`, session 7):
relay a streamed (SSE) or plain answer from the replica, and the client's error when no
replica answered. The pipeline sequences the steps; these functions only read the upstream
response it opened and write the request's :class:`RequestRecord` and :class:`Held`.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncGenerator, Awaitable, Callable, Iterable, Sequence
from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from gateway import json_fast
from gateway.answer_cost import STREAM_METER_BYTES, UNSENT_MIN_BYTES, StreamCharge
from gateway.client_io import ClientGone, EndingStreamingResponse, unless_client_leaves
from gateway.errors import GatewayError
from gateway.answer_cost import metered_rewrite
from gateway.held import Held
from gateway.proxy import UpstreamFailure, UpstreamStream
from gateway.read_deadline import ReadDeadline
from gateway.record import RequestRecord
from gateway.request import InferenceRequest
from gateway.sse import SseProtocolError, SseScanner
from gateway.sse_events import error_event
from gateway.unknown_fields import DroppedFields, dropped_headers
from gateway.stream_charge import settle_client_end  # R8-3
from gateway.upstream import Upstream
from gateway.usage_privacy import may_name_cached, plain_without_cached
from gateway.write_stall import ended_code
from routing.filters import TenantPoolFilter

__all__ = ["PlainAnswer", "failure_error", "passthrough_error", "plain_response", "reads_perf_counter",
           "stream_response"]

_JSON_TYPE = (b"content-type", b"application/json")
#: whether ``time.monotonic`` and ``time.perf_counter`` read the same clock (CPython on Linux and macOS;
#: every platform since Python 3.13: "Changed in version 3.13: Use the same clock as time.monotonic()")
_ONE_CLOCK = time.get_clock_info("monotonic").implementation == time.get_clock_info("perf_counter").implementation


def reads_perf_counter(clock: Callable[[], float] | None) -> bool:
    """Whether ``clock``'s readings are ``time.perf_counter()`` readings (the same clock, same seconds):
    ``time.perf_counter`` itself, or ``time.monotonic`` where both read one clock (``time.get_clock_info``).
    Then a request record's stamp (``RequestRecord.t_first_byte``) is a reading of ``clock`` as is: the
    routing calibration's first byte of a plain answer is observed late with it (session 16, A15-2)."""
    return clock is time.perf_counter or (clock is time.monotonic and _ONE_CLOCK)


class PlainAnswer(Response):
    """The 200 answer of a plain (non-streamed) call: the replica's JSON ``body`` (bytes) unchanged,
    with ``X-Request-Id: request_id`` (an ASCII id, :func:`gateway.record.new_request_id`).

    Its ``raw_headers`` are exactly those of ``Response(body, media_type="application/json",
    headers={"X-Request-Id": request_id})`` (``x-request-id``, ``content-length``, ``content-type``,
    in that order), built directly instead of through Starlette's header normalisation (issue 14,
    session 9: ~1 µs per answer). It keeps :meth:`Response.__call__` (two ASGI messages, no
    background task), so :class:`gateway.inference_asgi.InferenceRoutes` sends it as it sends any
    plain ``Response``. Raises ``UnicodeEncodeError`` for a non-latin-1 id, as Starlette would.
    """

    media_type = "application/json"
    #: called with the request's scope once the body was handed to the server (session 11, R10b-5), or None
    after_send: Callable[[Any], None] | None = None

    def __init__(self, body: bytes, request_id: str) -> None:  # noqa: D107 -- Response's fields, set directly
        self.status_code = 200
        self.background = None
        self.body = body
        self.raw_headers = [(b"x-request-id", request_id.encode("latin-1")),
                            (b"content-length", b"%d" % len(body)), _JSON_TYPE]


def _bounded_reader(deadline: ReadDeadline, up: UpstreamStream) -> Callable[[], Awaitable[bytes]]:
    """``up.read_chunk`` (a coded answer's decoded reads) under ``deadline``."""

    async def read() -> bytes:
        return await deadline.read(up.read_chunk())

    return read


#: 503 ``no_replica`` before the policy: the two causes an operator must tell apart (session 24, S23-newcomer-5)
NO_REPLICA_CONFIGURED = "no replica is configured in this tenant's pools"
NO_HEALTHY_REPLICA = "no healthy replica is available for this tenant"


def no_candidate_error(replicas: Sequence[Any], pools: Iterable[str], tenant_id: str, metrics: Any) -> GatewayError:
    """The 503 ``no_replica`` of a tenant with no routable replica in its ``pools`` (``replicas``: every
    replica of the replica set, any health; called on that refusal only). The client's message says which
    cause, never naming a pool (:data:`NO_REPLICA_CONFIGURED`: none of ``replicas`` is in the tenant's pools, a
    configuration gap no retry mends; :data:`NO_HEALTHY_REPLICA`: some are, none routable now: down, circuit
    open, or open for this tenant). The audit event's ``reason`` says it too and names the tenant's own pools
    (operators only), and ``prefixgate_no_replica{tenant, cause}`` (``none_configured`` / ``none_healthy``)
    counts it. Before session 24 both answered "no healthy replica", which read as an outage."""
    configured = bool(TenantPoolFilter(pools).filter(replicas))
    cause, message = ("none_healthy", NO_HEALTHY_REPLICA) if configured else ("none_configured", NO_REPLICA_CONFIGURED)
    metrics.no_replica.labels(tenant_id, cause).inc()
    named = ", ".join(sorted(pools)) or "all pools"
    reason = (f"no replica of the tenant's pools ({named}) is routable now" if configured else
              f"no replica is configured in the tenant's pools ({named})")
    return GatewayError(503, "no_replica", message, record={"reason": reason})


def failure_error(fail: UpstreamFailure | None) -> GatewayError:
    """The client's error when no attempt got an answer: 503 ``no_replica`` (no attempt), the
    replica's own 4xx (:func:`passthrough_error`), 504 ``upstream_timeout`` or 502 ``upstream_error``."""
    if fail is None:
        return GatewayError(503, "no_replica", "no healthy replica is allowed for this request")
    if fail.kind == "status" and not fail.retryable and not fail.replica_fault:  # not a 503 left unretried (R7b-1)
        return passthrough_error(fail)
    if fail.kind == "timeout":
        return GatewayError(504, "upstream_timeout", "the replica did not answer in time")
    return GatewayError(502, "upstream_error", "the replica failed to answer")


def stream_response(req: InferenceRequest, rec: RequestRecord, held: Held, read_timeout_s: float,
                    upstream: Upstream, end: Callable[[], None]) -> Response:
    """The SSE answer relaying ``held.up`` (checked by :class:`SseScanner`; ``read_timeout_s``
    seconds at most between upstream chunks). ``end`` (idempotent) ends the request when the
    stream ends, however it ends."""
    scanner = SseScanner(keep_usage_chunk=req.include_usage, drop_cached=held.drop_cached)  # R12-1
    up = held.up
    assert up is not None and held.attempt is not None
    # an identity answer's raw chunks are its decoded ones: read them from the response itself (one
    # coroutine layer less per chunk; session 9), bounded by the response's own timer (session 24); a coded
    # one goes through the stream's decoder under one ReadDeadline timer per stream
    deadline = None if up.decoder.coding is None else ReadDeadline(read_timeout_s)
    if deadline is None:
        up.response.bound_reads(read_timeout_s)
        read: Callable[[], Awaitable[bytes]] = up.response.read_chunk
    else:
        read = _bounded_reader(deadline, up)

    charge = StreamCharge(held.cpu)  # session 11 (R10b-4): large reads' parse CPU, sampled and charged

    async def body() -> AsyncGenerator[bytes, None]:
        held.started = True
        held.progress = "streamed"
        rec.outcome, rec.status = "failed", 200
        # session 28: the connection's write-through (gateway/coalesce.py): on for the parts after the first
        # (which leaves with the head), off for the part holding [DONE] (which leaves with the terminator)
        loss = response.loss
        through = None if loss is None else loss.write_through
        on = False
        try:
            chunk = up.first_chunk
            first = scanner.feed(chunk) if len(chunk) < STREAM_METER_BYTES else charge.feed(
                scanner.feed, chunk, scanner.output_tokens)
            if first:
                yield first
            while True:
                chunk = await read()
                if not chunk:
                    up.finished = True  # as UpstreamStream.read_chunk marks the end
                    break
                out = scanner.feed(chunk) if len(chunk) < STREAM_METER_BYTES else charge.feed(
                    scanner.feed, chunk, scanner.output_tokens)
                if out:
                    if on is scanner.done and through is not None:  # a change: on while no [DONE] was read
                        on = not on
                        through(on)
                    yield out
            rest = scanner.finish()
            if rest:
                yield rest
            rec.outcome = "allowed"
            held.attempt.succeeded()
        except Exception as exc:  # broken SSE, read timeout, connection reset
            if on:  # the error event leaves with the terminator
                on = False
                through(False)  # type: ignore[misc]
            code = "upstream_timeout" if isinstance(exc, TimeoutError) else "upstream_stream_error"
            rec.error_code = code
            upstream.failed(held.attempt, UpstreamFailure("protocol", str(exc)))
            if isinstance(exc, SseProtocolError) and exc.forward:
                yield exc.forward  # the valid events before the bad one
            yield error_event("the replica stream failed before completion", code)
        except BaseException:
            if scanner.done:  # the client hung up after [DONE]: it got the whole answer
                rec.outcome = "allowed"
                held.attempt.succeeded()
            else:  # a client-side bound's code (gateway/write_stall.py, R6b-3) or client_disconnect
                rec.outcome, rec.status, rec.error_code = "cancelled", 499, ended_code()
                rec.relayed_output = scanner.output_tokens
                if not settle_client_end(held.up, scanner):  # R8-3: charge what the replica sent
                    held.progress = "unknown"  # held back by the client: the whole reservation
            raise
        finally:
            if on:  # the connection's next answer is held per loop step again
                through(False)  # type: ignore[misc]
            if deadline is not None:
                deadline.close()
            if charge.reads:
                charge.settle(scanner.output_tokens)
            held.usage = scanner.usage
            held.relayed = scanner.output_tokens  # received from the replica (>= relayed, R8-3)
            if rec.relayed_output is None:
                rec.relayed_output = scanner.output_tokens
            end()

    def on_call_end() -> None:
        if not held.started:  # the client left between the replica's first byte and the answer's start
            rec.outcome, rec.status, rec.error_code = "cancelled", 499, "client_disconnect"
        end()

    headers = {"Cache-Control": "no-cache", "X-Request-Id": rec.request_id}
    if req.dropped[0]:  # fields outside the schema, dropped (limits.unknown_fields: drop; session 23)
        headers.update(dropped_headers(req.dropped))
    response = EndingStreamingResponse(body(), on_end=on_call_end, media_type="text/event-stream", headers=headers)
    return response


async def plain_response(request: Request, rec: RequestRecord, held: Held, read_timeout_s: float,
                         upstream: Upstream, dropped: DroppedFields = (0, "")) -> Response:
    """Read the rest of a plain answer (``read_timeout_s`` at most; answered 499 when the client
    leaves, 502 when it is not a JSON object); the pipeline's exit path ends the request. ``dropped``: the
    request's fields dropped outside the schema, named in the 200 answer's headers (session 23).

    Session 11 (gateway/answer_cost.py): an answer of more than ``limits.max_answer_bytes`` is read no
    further and answers 502 ``answer_too_large`` (not counted against the replica); one of
    ``answer_cpu_meter_bytes`` or more waits for its parse turn (one per loop step) before its tenant's
    debt is checked and it is parsed; one of 64 KiB or more is noted, once sent, in its tenant's
    unsent answer bytes (``PlainAnswer.after_send``)."""
    up = held.up
    assert up is not None and held.attempt is not None
    limit, metered = held.cpu.answer_bounds()  # session 11 (R10b-2): limits.max_answer_bytes; metering from
    try:
        data = up.whole_body()  # a short answer is usually whole by now: nothing left to wait for
        if data is None:
            if up.body_received():
                data = await _read_capped(up, limit)
            else:
                data = await unless_client_leaves(request, _read_rest(up, limit, read_timeout_s))
        elif limit is not None and len(data) > limit:
            raise AnswerTooLarge(limit)
        refusal = None
        if metered is None or len(data) < metered:  # the common answer: parsed unmetered (session 14)
            obj = json_fast.loads_answer(data)
        else:
            turns = held.cpu.answer_turns(len(data))  # session 11: large parses one per loop step (R10b-2)
            if turns is not None:
                await turns.take()
            try:
                refusal = held.cpu.answer_refusal(len(data))  # R10b-2: a large answer of a tenant in debt
                if refusal is None:
                    obj = held.cpu.check_answer(json_fast.loads_answer, data)  # R10-4: metered when large
            finally:
                if turns is not None:
                    turns.give_back()
    except ClientGone:
        rec.outcome, rec.status, rec.error_code = "cancelled", 499, "client_disconnect"
        return Response(status_code=499)
    except AnswerTooLarge as exc:  # the tenant asked for it: not the replica's failure (no breaker verdict)
        err = GatewayError(502, "answer_too_large", str(exc), headers={"X-Request-Id": rec.request_id})
        rec.status, rec.outcome, rec.error_code = 502, "failed", err.code
        return err.response()
    except Exception as exc:  # timeout, broken connection, not a JSON object
        upstream.failed(held.attempt, UpstreamFailure("protocol", str(exc)))
        err = GatewayError(502, "upstream_error", "the replica sent an invalid answer",
                           headers={"X-Request-Id": rec.request_id})  # R4-5, R9b-1: the answer names its event
        rec.status, rec.outcome, rec.error_code = 502, "failed", err.code
        return err.response()
    held.served = True  # the replica's success verdict: when the request gives back its attempt (Held.end_attempt)
    if refusal is not None:  # the replica answered (not its failure); the tenant's CPU budget refuses
        rec.refused(refusal)
        refusal.headers = {**refusal.headers, "X-Request-Id": rec.request_id}
        return refusal.response()
    usage = obj.get("usage")
    held.usage = usage if isinstance(usage, dict) else None
    rec.status, rec.outcome = 200, "allowed"
    # parsed only to check it and read usage: the replica's bytes go out unchanged (but R12-1's counter)
    if held.drop_cached and ((held.usage is not None and "prompt_tokens_details" in usage)
                             or may_name_cached(data)):  # RV2-1: a duplicated / escaped key; R14-2: nested
        try:  # R12b-7: charged when metered (an answer parsed unmetered is rewritten unmetered: no wrapper, s17)
            data = (plain_without_cached(data, obj, usage) if metered is None or len(data) < metered
                    else metered_rewrite(held.cpu, len(data), plain_without_cached, data, obj, usage))
        except (RecursionError, ValueError, TypeError) as exc:  # S15-6: nested too deep to write again
            held.served = False  # an answer that cannot be relayed is the replica's failure, as a bad parse
            upstream.failed(held.attempt, UpstreamFailure("protocol", f"answer not writable: {type(exc).__name__}"))
            err = GatewayError(502, "upstream_error", "the replica sent an invalid answer",
                               headers={"X-Request-Id": rec.request_id})
            rec.status, rec.outcome, rec.error_code = 502, "failed", err.code
            return err.response()
    answer = PlainAnswer(data, rec.request_id)
    if dropped[0]:  # limits.unknown_fields: drop (gateway/unknown_fields.py); ASCII values
        answer.raw_headers += [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in dropped_headers(dropped)]
    if len(data) >= UNSENT_MIN_BYTES:  # R10b-5: its unsent bytes count against its tenant's bound
        answer.after_send = held.cpu.note_unsent
    return answer


class AnswerTooLarge(ValueError):
    """A plain answer has more than ``limits.max_answer_bytes`` (``limit``) decoded bytes."""

    def __init__(self, limit: int) -> None:
        super().__init__(f"the replica's answer is larger than {limit} bytes (limits.max_answer_bytes); "
                         "ask for fewer tokens or log-probabilities, or stream it")
        self.limit = limit


async def _read_rest(up: UpstreamStream, limit: int | None, timeout_s: float) -> bytes:
    """:func:`_read_capped` within ``timeout_s`` seconds (raises ``TimeoutError`` after them)."""
    async with asyncio.timeout(timeout_s):
        return await _read_capped(up, limit)


async def _read_capped(up: UpstreamStream, limit: int | None) -> bytes:
    """``up``'s whole decoded body (``first_chunk`` and the rest); raises :class:`AnswerTooLarge` as soon
    as it passes ``limit`` bytes (None: no bound), reading no further."""
    parts = [up.first_chunk]
    size = len(up.first_chunk)
    if limit is not None and size > limit:
        raise AnswerTooLarge(limit)
    while chunk := await up.read_chunk():
        size += len(chunk)
        if limit is not None and size > limit:
            raise AnswerTooLarge(limit)
        parts.append(chunk)
    return b"".join(parts)


def passthrough_error(fail: UpstreamFailure) -> GatewayError:
    """A replica's 4xx (the client's fault) is passed on with its message, never its raw body. Engines quote the
    request in that message (vLLM's ``input_value='...'``, a prompt's token count): rendered for this answer alone
    (``client_text``), never kept in the process-wide body cache (S31-newcomer31-5, as S24-review-6)."""
    message = "the replica rejected the request"
    try:
        obj = json_fast.loads_object(fail.body)
        m = obj.get("error", {}).get("message")
        if isinstance(m, str) and len(m) <= 500:
            message = m
    except (ValueError, AttributeError):
        pass
    return GatewayError(fail.status or 400, "upstream_rejected", message, client_text=True)
