"""The request path of one inference call, top to bottom (DESIGN.md, "the flow").

    shed → authenticate → tenant (+ limits, queue room) → parse → prefix keys →
    authorize (PDP) → queue, route → proxy → audit (after the answer)

Each step is a call into a unit that is tested alone; this module only
sequences them, maps their errors to HTTP answers and records what happened
in a :class:`RequestRecord` that becomes exactly one audit event.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from functools import partial
from operator import attrgetter
from types import CoroutineType

from starlette.requests import Request
from starlette.responses import Response

from gateway.admission_answers import clamp_output
from gateway.admission_front import parse_and_count
from gateway.build import Gateway
from gateway.client_io import ClientGone, unless_client_leaves
from gateway.body_budget import OWNER_SCOPE_KEY
from gateway.errors import GatewayError
from gateway.flow_bytes import chain_bytes, queued_form, with_salt
from gateway.held import Held
from gateway.prefix_keys import ChainView, PrefixKeys
from gateway.pep_recheck import awaited_decision, decide_again
from gateway.pipeline_answer import failure_error, no_candidate_error, plain_response, reads_perf_counter, stream_response
from gateway.prep_thread import SCHEMA_BODY_BYTES
from gateway.proxy import NotWritten, UpstreamFailure, open_upstream
from gateway.record import RequestRecord, new_request_id
from gateway.recording import AFTER_SEND
from gateway.send_order import SCOPE_KEY as SENDS_AT_HEAD, SEND_ORDER
from gateway.tokenize_thread import tokenizes_off_loop
from gateway.usage_privacy import drops_cached
from gateway.replicas import Replica
from gateway.request import Endpoint, InferenceRequest, JsonObject, read_body, upstream_body
from policy.decision import Decision
from routing.calibration_tracker import LATE_FIRST_BYTE
from routing.policies import RouteRequest
from routing.types import RouteChoice
from tenancy.limits import Lease
from tenancy.registry import Tenant

__all__ = ["InferencePipeline", "RequestRecord", "ClientGone"]

log = logging.getLogger("prefixgate")

UPSTREAM_PATHS: dict[str, str] = {"chat": "/v1/chat/completions", "completions": "/v1/completions"}
_ID = attrgetter("id")


class InferencePipeline:
    """Handles ``/v1/completions`` and ``/v1/chat/completions`` end to end.

    ``gateway`` holds every collaborator, one per step (see :mod:`gateway.build`).
    Only this class writes the request's :class:`RequestRecord`; the steps return values.
    """

    def __init__(self, gateway: Gateway) -> None:
        self.gw = gateway
        self.cfg = gateway.config
        self.cpu = gateway.cpu_budget  # refused requests' CPU per tenant (R5-8)
        cal = gateway.calibration
        #: a plain answer's load ticket whose first byte waits for the answer's end (session 16, A15-2): its
        #: first byte comes with its end, so the ticket's finish releases the prefill part with the rest
        #: and the calibration's observation (``rec.t_first_byte``: the byte's arrival) is fed then
        #: (:meth:`_after_answer`). None: any ticket (no calibration: nothing to observe); else the ticket
        #: types that take a late observation when ``perf_counter`` is the calibration's clock, else none
        self._late_first_byte: frozenset[type] | None = None if cal is None else (
            LATE_FIRST_BYTE if reads_perf_counter(cal.clock) else frozenset())

    async def handle(self, request: Request, endpoint: Endpoint) -> Response:
        """Serve one inference request; always returns a response, never raises."""
        gw = self.gw
        shed = gw.overload.shed_or_enter()  # overloaded: 503 before any authentication or body work
        if shed is not None:
            return shed
        # let in: left in _end, the one exit path
        adm = gw.admission
        rec = RequestRecord(
            request_id=new_request_id(),
            endpoint=UPSTREAM_PATHS[endpoint],
            client_addr=gw.authn.source(request),  # behind a trusted proxy: the client it attests
            t0=time.perf_counter(),
        )
        held = Held()
        gw.audit.start_span(rec, request.headers)
        try:
            if request.scope.get(SENDS_AT_HEAD, sends := SEND_ORDER.sends) != sends:  # its turn: no coroutine (s17)
                await SEND_ORDER.wait_turn(request.scope)  # a burst's earlier sends go first (gateway/send_order.py)
            if not gw.audit.accepting:  # fail closed: no audit trail, no service
                raise GatewayError(503, "audit_unavailable", "audit trail unavailable; refusing to serve without it")
            # 1 authenticate (gateway/authn.py)
            got = gw.authn.authenticate_now(request, rec.client_addr)  # a cache hit: no coroutine (session 16)
            identity, found = got if type(got) is tuple else (await got, None)  # found: its tenant (session 19)
            rec.spiffe_id, rec.trust_domain = identity.spiffe_id.uri, identity.trust_domain
            rec.t_auth = time.perf_counter()
            # 2 admission: resolve tenant; rate and concurrency limits before any work (gateway/admission.py)
            # gen: before its facts (R17-1); a hit's tenant was found in the same step (no await since)
            gen, tenant = gw.pep.pdp.generation, found or adm.resolve_tenant(identity)
            rec.tenant_id = tenant.id
            held.drop_cached = drops_cached(tenant.usage_cached_tokens, self.cfg.tenancy.usage_cached_tokens)  # R12-1
            held.cpu = self.cpu.meter(tenant, 1)  # 429 cpu_budget_exhausted while in debt, before the body
            held.tenant = gw.overload.enter_tenant(tenant.id)  # its requests in flight stay below the shed bound
            if gw.flow is not None:  # a tenant whose queue is full is refused before any further work
                gw.flow.check_queue_room(tenant.id)
            lease = adm.admit_now(tenant, slot=gw.flow is None)  # flow control: slot at release
            held.lease = lease if type(lease) is Lease else await lease  # in-process limiter: no coroutine (s16)
            bounds = adm.request_bounds(tenant)
            # 3 parse (gateway/request.py), model entitlement, echo + logprobs (R4-12); 4 prompt checks (byte bound,
            # then tokenize once with early stop): one metered step (s19: admission_front.py; s31: prep_thread.py)
            request.scope[OWNER_SCOPE_KEY] = tenant.id  # its held body counts against its share (R5b-1)
            raw = await read_body(request, self.cfg.limits.max_body_bytes, self.cfg.limits.body_read_timeout_s)
            front = (parse_and_count, adm, raw, endpoint, self.cfg.limits, bounds, tenant, held.lease)
            req, seqs, tokens, prompt_tokens, rec.t_parsed = held.cpu.run(*front, gw.tokenize_thread is not None) if (
                pt := gw.prep_thread) is None or not (b'"pattern"' in raw or b"\\u00" in raw and pt.escaped(raw) or raw[
                SCHEMA_BODY_BYTES:] and (b'"tools"' in raw or b'"response_format"' in raw)) else await pt.run(
                held.cpu, *front, False)  # a pattern count or a big schema body (S31-lead-2, -4: prep_thread.py)
            del raw, front
            rec.stream, rec.sequences, rec.model, rec.dropped_fields = req.stream, seqs, req.model, req.dropped[0]
            if tokens is None:  # a batch or a prompt tokenized off the loop: step by step, as before session 19
                if seqs > 1:  # each prompt of a batch is a request
                    await adm.admit_sequences(tenant, held.lease, seqs, slots=gw.flow is None)
                rec.t_parsed = time.perf_counter()
                room = adm.prompt_room(tenant, held.lease)
                if gw.tokenize_thread is None or not tokenizes_off_loop(adm.tokenizer, req):
                    tokens, prompt_tokens = held.cpu.run(adm.prompt_tokens, bounds, req, room)
                else:  # R12-3: a long prompt of a GIL-free tokenizer, off the event loop
                    tokens, prompt_tokens = await gw.tokenize_thread.run(held.cpu, adm.prompt_tokens, bounds, req, room)
            rec.prompt_tokens = prompt_tokens
            # reserve prompt + max_tokens x sequences before any further work; the end settles it (s19: clamp_output)
            output_cap = clamp_output(req.max_tokens, tenant.max_output_tokens, None, adm.max_output_tokens)
            res = adm.check_prompt_now(tenant, prompt_tokens, seqs, output_cap * seqs)
            held.reservation = await res if type(res) is CoroutineType else res  # in-process ledger: no coroutine
            chains = gw.keys.prefix_chains(tenant, tokens)
            del tokens  # R12-2: a queued request keeps its chains and counts, not its token list
            held.prep = partial(self._prepare, rec, held, chains, None)  # a refusal's record: its fingerprint
            # candidates: routable replicas in the tenant's pools (gateway/replicas.py)
            candidates = gw.replica_set.candidates(tenant.pools, tenant.id)  # R7b-1
            if not candidates:  # which cause: none configured in its pools, or none healthy (session 24)
                raise no_candidate_error(gw.replica_set.all(), tenant.pools, tenant.id, gw.metrics)
            rec.t_keys = time.perf_counter()
            held.decided = (gen, identity, candidates)  # 5 authorize (gateway/pep.py); S17-6
            decision = gw.pep.decide_now(identity, tenant, req, prompt_tokens, candidates, rec.endpoint,
                                         gw.flow.tenant_queued(tenant.id) if gw.flow is not None else 0)
            if type(decision) is not Decision:  # not a decision-cache hit (session 16: a hit is no coroutine)
                decision = await awaited_decision(decision, rec)  # its 503 policy_unavailable recorded
            rec.t_decided = time.perf_counter()
            rec.decided(decision)
            gw.pep.enforce(decision)
            rec.max_tokens = max_tokens = clamp_output(req.max_tokens, tenant.max_output_tokens, decision.max_tokens,
                                                       adm.max_output_tokens)  # = Admission.clamp_max_tokens
            # not needed to route or write the upstream request: done while the replica works (_prepare)
            held.prep = partial(self._prepare, rec, held, chains, max_tokens * seqs)
            allowed = gw.pep.allowed_candidates(candidates, decision)
            if not allowed:
                raise GatewayError(
                    503, "no_replica", "no healthy replica is allowed for this request",
                    extra={"decision_id": decision.decision_id},
                )
            body = upstream_body(req, max_tokens, gw.keys.upstream_user(tenant, identity))
            route_req = RouteRequest(
                tenant_id=tenant.id,
                block_keys=chains.current,
                prompt_tokens=prompt_tokens,
                max_tokens=max_tokens * seqs,
                block_size=self.cfg.routing.block_size,
                sequences=seqs,
                calibrate=not req.extra_text,  # tools / response_format: counted, not hashed (R10-3)
            )
            # 6+7 route and proxy, retrying on another replica before the first byte
            return await self._route_and_proxy(request, req, rec, tenant, route_req, chains, allowed, body, held)
        except GatewayError as err:
            rec.refused(err)  # status, outcome, code and the refusal's figures (queue state)
            held.cpu.refused()  # its preparation CPU, charged to the tenant's budget
            held.leave(gw.overload)  # not while the early answer waits for an unread body to drain (R3-1)
            err.headers = {**err.headers, "X-Request-Id": rec.request_id}  # R4-5: the refusal's event id
            return err.response()
        except ClientGone:
            # The client hung up before any answer: nobody reads a response; 499 is for the record.
            rec.status, rec.outcome, rec.error_code = 499, "cancelled", "client_disconnect"
            return Response(status_code=499)
        except asyncio.CancelledError:
            rec.status, rec.outcome, rec.error_code = 499, "cancelled", "client_disconnect"
            raise
        except Exception as exc:  # a bug: answer 500 but never lose the audit record
            log.exception("unhandled error in request %s", rec.request_id)
            rec.failed(exc)  # 500 internal_error, with the fields a step learnt before the bug (S19-T4-1)
            return GatewayError(500, "internal_error", "internal error",
                                headers={"X-Request-Id": rec.request_id}).response()
        finally:
            # The one exit path (a stream's ends with it): all held given back, the record written;
            # a plain answer's end runs right before its last body part is sent (gateway/recording.py).
            if not held.handed_off:
                pending = AFTER_SEND.get()
                if pending is None:
                    self._end(rec, held)
                else:
                    pending.append(partial(self._end, rec, held))

    async def _route_and_proxy(
        self, request: Request, req: InferenceRequest, rec: RequestRecord, tenant: Tenant,
        route_req: RouteRequest, chains: ChainView, allowed: list[Replica], body: JsonObject | bytes, held: Held,
    ) -> Response:
        gw = self.gw
        ucfg = self.cfg.upstream
        deadline = rec.t0 + ucfg.total_timeout_s
        remaining = allowed  # never changed in place: a retry makes a new list
        last: UpstreamFailure | None = None
        budget_used, redo, pending = 0, False, None  # connect failures (never reached a replica): no budget
        while remaining and budget_used < ucfg.max_attempts:
            if redo:  # S19-RC6: the same attempt, not written: its choice decided again (below), nothing counted
                redo = False
            elif gw.flow is not None and not rec.attempts:  # the tenant's fair turn and a replica with room
                rec.attempts = 1
                ids, alt = list(map(_ID, remaining)), chains.previous_chains()  # no comprehension frame (s17)
                slots = gw.admission.slot_claim(tenant, held.lease)
                pending = gw.flow.release_now(tenant, route_req, ids, alt, slots, True)  # room now: no wait
                if pending is None:  # retries do not wait
                    body = queued_form(req, body)  # R12-2, R12b-3: it waits holding the bytes it sends, counted
                    pending = await unless_client_leaves(
                        request, gw.flow.release(tenant, route_req, ids, alt, deadline, slots, tried=True,
                                                 body_bytes=len(body) + chain_bytes(route_req.block_keys, alt)))
                choice = pending.choice
            else:
                if rec.attempts:  # the previous attempt's verdict was given; give back what it held
                    held.end_attempt()
                rec.attempts += 1
                choice, held.ticket = gw.router.route(route_req, list(map(_ID, remaining)), chains.previous_chains())
            if held.decided[0] != gw.pep.pdp.generation:  # a change since its decision: S17-6, R17-1/2, R17-5 (c)
                pending = held.released(pending, rec)  # charged first, as before session 30
                body, remaining, tenant, choice = await decide_again(gw, held, req, rec, route_req, body, remaining,
                                                                     choice, chains)
            held.choice = choice
            replica = gw.replica_set.get(choice.replica_id)
            rec.replica, rec.pool, rec.routing_policy = replica.id, replica.pool, choice.policy
            rec.t_route = time.perf_counter()
            # serialized at once by open_upstream, never changed: copied only to add the salt
            upstream_body = with_salt(body, gw.keys.cache_salt(tenant)) if replica.cache_salt else body
            # request id and trace context (never client credentials)
            headers = {"X-Request-Id": rec.request_id}
            gw.audit.inject_trace_headers(headers, rec)
            # a plain answer's first byte comes only after the whole generation: it is bounded by the
            # total deadline, not by first_byte_timeout_s (which would cut off long, legitimate answers
            # and count them against a healthy replica)
            left = deadline - time.perf_counter()
            budget = max(0.001, min(ucfg.first_byte_timeout_s, left) if req.stream else left)
            progress, held.progress = held.progress, "unknown"  # sent: the replica may be working on it
            # written now on an idle connection (session 16; else when one is free, if the decision's generation
            # holds then: S19-RC6); what follows up to the await runs while the replica works (nothing else runs)
            call = open_upstream(gw.upstream.session or gw.upstream.require_session(), replica.url + rec.endpoint,
                                 upstream_body, headers, budget, gw.pep.pdp, held.decided[0])
            pending = held.released(pending, rec)  # s30: charged after the write; no await since the choice
            held.attempt = gw.replica_set.attempt(replica.id, tenant.id)  # R7b-1 (a half-open probe: this one)
            rec.predicted_prefix_tokens, rec.available_prefix_tokens = choice.predicted_prefix_tokens, choice.available_prefix_tokens
            rec.replica_load_tokens = gw.router.load_tokens(replica.id)  # = loads.snapshot(rid).tokens
            if held.prep is not None:  # after the write, before the answer: in this step (s31: no loop turn of its own)
                held.run_prep_logged(rec.request_id)
            try:
                up = await unless_client_leaves(request, call)
            except NotWritten:  # S19-RC6: a change while it waited for a connection (given back unused)
                redo = held.not_written(progress)  # as an attempt never made: no verdict, not counted
                continue
            except UpstreamFailure as fail:
                last = fail
                held.failed(fail, progress, gw.upstream)  # the ledger's progress, the breaker's verdict
                budget_used += fail.kind != "connect"  # a connect failure (never reached a replica): no budget
                if not fail.retryable:
                    break
                remaining = [r for r in remaining if r.id != replica.id]
                if time.perf_counter() >= deadline:
                    break
                continue
            held.up = up
            budget_used += 1
            if req.stream:  # R7-2: a probe's verdict at the first byte
                gw.upstream.answered(replica.id, up.instance_id, held.attempt)
            else:  # a plain answer's first byte comes with its end: observed with the giving back (session 11)
                held.answered = partial(gw.upstream.answered, replica.id, up.instance_id)
            rec.t_first_byte, late = time.perf_counter(), self._late_first_byte
            if req.stream or (late is not None and type(held.ticket) not in late):  # A15-2: else in _after_answer
                held.ticket.first_byte()
            if req.stream:
                response = stream_response(req, rec, held, self.cfg.upstream.read_timeout_s, gw.upstream,
                                           partial(self._end, rec, held))
                held.handed_off = True
                return response
            return await plain_response(request, rec, held, self.cfg.upstream.read_timeout_s, gw.upstream, req.dropped)
        raise failure_error(last)

    def _prepare(self, rec: RequestRecord, held: Held, chains: ChainView, output_tokens: int | None) -> None:
        """The routed request's work that neither the routing decision nor the upstream request needs
        (issue 14, session 10: the gateway's CPU is idle while the replica works): the policy's lower
        ``max_tokens`` held in the ledger (``output_tokens``; None: no decision yet; a refund: holding
        more for a moment is the safe side; no-op once settled), the record's prefix fingerprint,
        the audit event's trace and span part and the flow queue-wait metric (session 11), the router's
        index record (session 15: :meth:`Router.settle`; any read of the index applies it first). Run once, by
        :meth:`Held.run_prep`: right after the upstream request's write (``open_upstream`` returned; in that loop
        step since session 31, a loop callback before), or by :meth:`_end`."""
        res = held.reservation
        if res is not None and output_tokens is not None:
            self.gw.admission.lower_reservation(res, output_tokens)
        rec.prefix_fingerprint = PrefixKeys.prefix_fingerprint(chains)
        self.gw.audit.prepare_request(rec)
        if held.queue_wait_s is not None and self.gw.flow is not None:
            self.gw.flow.observe_wait(held.queue_wait_s)
        self.gw.router.settle()  # last: the record's own preparation never waits on it

    def _end(self, rec: RequestRecord, held: Held) -> None:
        """End the request (idempotent): settle its tokens and write its one audit record; then give
        back all it holds. Under a front that defers (gateway/recording.py) the giving back, the
        calibration's flush and the record's metrics run as one deferred step right after the answer's
        last body part was handed to the server (nothing awaited in between: the next request on the
        loop finds the slot free; issue 14, session 14: one step, not three); else at once, after the record."""
        if held.ended:
            return
        held.ended = True
        if held.prep is not None:
            held.run_prep_logged(rec.request_id)  # a bug: logged; never lose the audit record nor what it holds
        after: list[Callable[[], None]] = []  # what the record does not need: with the giving back
        if held.answered is not None:  # the replica's instance id seen on its plain answer
            after.append(held.answered)
        pending = AFTER_SEND.get()
        recorded = False
        try:
            self._settle(rec, held, after)
            self._complete(rec, held.usage, held.choice, after)
            recorded = True
        finally:
            if pending is None:
                self._after_answer(rec, held, after, recorded)
            else:
                pending.append(partial(self._after_answer, rec, held, after, recorded))

    def _after_answer(self, rec: RequestRecord, held: Held, after: list[Callable[[], None]], recorded: bool) -> None:
        """Give back all the request holds, then run ``after`` (the ledger's refund first), the
        calibration's flush and, when ``recorded`` (its audit event was emitted), the record's metrics;
        each step guarded: one's bug never skips another (nor the others' requests). A plain answer's
        first byte is observed first, with its arrival time (session 16, A15-2: ``__init__``)."""
        ticket = held.ticket
        if ticket is not None and not rec.stream and rec.t_first_byte is not None and type(ticket) in LATE_FIRST_BYTE:
            try:
                ticket.observe_first_byte_at(rec.t_first_byte)  # type: ignore[attr-defined]
            except Exception:
                log.exception("observing the first byte of request %s failed", rec.request_id)
        try:
            held.leave(self.gw.overload)
            held.release()
        except Exception:
            log.exception("ending request %s failed", rec.request_id)
        for work in after:
            try:
                work()
            except Exception:
                log.exception("ending request %s failed", rec.request_id)
        cal = self.gw.calibration
        try:
            if cal is not None:
                cal.flush()  # the first-byte observations queued on the answer's path
            if recorded:
                self.gw.recorder.finish(rec)
        except Exception:
            log.exception("recording request %s failed", rec.request_id)

    def _settle(self, rec: RequestRecord, held: Held, after: list[Callable[[], None]]) -> None:
        """Reconcile the request's token reservation with what it used (tenancy/ledger.py); its
        metrics are appended to ``after`` (for after the answer)."""
        res = held.reservation
        if res is None:
            return
        try:
            rec.settlement = self.gw.admission.settle(res, usage=held.usage, progress=held.progress,
                                                      relayed_output=held.relayed, counted=after)
        except Exception:  # a bug: never lose the audit record; the reservation stays charged in full
            log.exception("settling the token reservation of request %s failed", rec.request_id)

    def _complete(self, rec: RequestRecord, usage: JsonObject | None, choice: RouteChoice | None,
                  after: list[Callable[[], None]]) -> None:
        """The record's answer fields, then the record; the router's and flow control's feedback
        from the answer is appended to ``after`` (the record does not hold it)."""
        if usage:
            details = usage.get("prompt_tokens_details") or {}
            cached = details.get("cached_tokens") if isinstance(details, dict) else None
            rec.delivered_prefix_tokens = cached if isinstance(cached, int) else None
            out = usage.get("completion_tokens")
            rec.output_tokens = out if isinstance(out, int) else None
        if rec.delivered_prefix_tokens is not None and choice is not None:
            after.append(partial(self.gw.router.observe_delivered, choice, rec.delivered_prefix_tokens))
        if choice is not None and self.gw.flow is not None and rec.tenant_id:  # the VTC's output share
            after.append(partial(self.gw.flow.charge_output, rec.tenant_id,
                                 rec.output_tokens or rec.relayed_output or 0))
        rec.t_end = time.perf_counter()
        self.gw.recorder.record(rec)  # its metrics: Recorder.finish, by _after_answer
