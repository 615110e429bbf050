"""Gateway side of step 8: turns a finished request into one audit event,
one OpenTelemetry trace and one concentration-monitor observation.

The audit package owns the schema, sinks and monitors; this adapter only
maps :class:`gateway.record.RequestRecord` fields onto a request row
(:mod:`audit.request_event`) from which the audit worker builds the
:class:`audit.event.AuditEvent` (never prompt text, tokens or keys: the
record holds none) and creates the request's spans with the recorded stage
timestamps (server span, children ``authenticate``, ``policy``, ``route``,
``upstream``). A client's ``traceparent`` becomes a span link, never the
parent; its ``baggage`` is ignored.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from opentelemetry import trace
from opentelemetry.trace import Link, SpanKind, Status, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
from prometheus_client import generate_latest
from starlette.datastructures import Headers

from audit.event import AuditEvent, Identity, Kind, Outcome, new_event_id
from audit.request_event import request_event
from audit.row_spans import span_attributes, span_extra, stage_children
from audit.span_request import encode_links
from audit.tracing import (RequestTrace, TraceStart, begin_request_trace, end_request_trace, finish_trace_start,
                           incoming_links, records, request_trace_headers, span_processors, start_request_trace)
from gateway.audit_protocols import AlertMonitor, AuditEventLog
from gateway.record import RequestRecord

if TYPE_CHECKING:
    from audit.config_schema import AuditSection
    from opentelemetry.sdk.trace import TracerProvider
    from prometheus_client import CollectorRegistry

__all__ = ["AuditHub", "AuditEventLog", "AlertMonitor"]


_PROPAGATOR = TraceContextTextMapPropagator()


def _nothing() -> None:
    """:attr:`AuditHub.hand_off` of a log that keeps its own schedule."""


def _client_links(headers: Mapping[str, str]) -> list[Link]:
    """The span link to the client's ``traceparent`` (:func:`audit.tracing.incoming_links`); from
    Starlette's headers (case-insensitive already) only the one header is read (the last, as a dict keeps)."""
    if isinstance(headers, Headers):
        tps = headers.getlist("traceparent")
        return incoming_links({"traceparent": tps[-1]}) if tps else []
    return incoming_links(headers)


class AuditHub:
    """Facade over the audit log, the concentration monitor and tracing.

    ``log``: an :class:`audit.log.AuditLog` (or None: events are counted but
    not stored — only for unit tests of other parts); ``monitor``: an
    :class:`audit.concentration.ConcentrationMonitor` or None; ``tracer``:
    an OpenTelemetry tracer (default: the global provider's). ``hand_off()`` writes the events
    emitted so far to the audit worker's pipe now: the log's own ``flush_now`` (a log without one,
    e.g. the inline one, keeps its own schedule: it does nothing).
    """

    def __init__(self, log: AuditEventLog | None, monitor: AlertMonitor | None = None,
                 tracer: trace.Tracer | None = None, admin_registries: Sequence[CollectorRegistry] = ()) -> None:
        self.log = log
        self.monitor = monitor
        self.tracer = tracer or trace.get_tracer("prefixgate")
        self._admin_registries = tuple(admin_registries)
        #: set by from_config: the audit log's, tracing's and pool-level concentration metrics
        #: (served with the admin metrics since R3-5; the name says what they do not carry:
        #: tenants, SPIFFE IDs, replicas) and the TracerProvider
        self.public_registries: tuple[CollectorRegistry, ...] = ()
        self.provider: TracerProvider | None = None
        self.emitted = 0
        self._traced: tuple[Any, Sequence[Any] | None] = (None, None)  # (provider, its span processors)
        #: set by from_config when the audit worker process exports the request spans (audit/row_spans.py):
        #: a sampled request's row then carries its span extra and no span is built here
        self.worker_spans = False
        # the log's request-row entry if it has one (audit.remote.RemoteAuditLog: the worker builds
        # the event); other logs (the in-process AuditLog, test captures) get the built event
        self._emit_row = getattr(log, "emit_request_row", None)
        # hand_off is the log's "write queued events to the worker now" itself (RemoteAuditLog.flush_now: one
        # call per answer, not two; session 17); other logs keep their own schedule: it does nothing
        flush_now = getattr(log, "flush_now", None)
        self.hand_off: Callable[[], None] = _nothing if flush_now is None else flush_now

    @classmethod
    def from_config(cls, section: "Mapping[str, Any] | AuditSection", *, router_factor: float = 1.25,
                    tracing: Mapping[str, Any] | None = None) -> "AuditHub":
        """Build the audit log (``audit.config.build_audit``), the concentration
        monitor (thresholds relative to the router's load-guard factor) and the
        tracer from config. ``section``: ``GatewayConfig.audit`` (an
        :class:`audit.config_schema.AuditSection`) or the same as a mapping.
        The ``concentration`` sub-section holds
        :class:`audit.concentration.ConcentrationMonitor` keyword arguments.

        Raises ``ValueError`` (``audit.config.AuditConfigError``) when a key is
        invalid or no sink is configured: the gateway never serves without an audit trail.
        """
        from prometheus_client import CollectorRegistry

        from audit.alert_epoch import stamping_observed_epoch
        from audit.concentration import ConcentrationMonitor
        from audit.config import AuditConfigError, build_audit
        from audit.config_schema import parse_audit
        from audit.tracing import check_exporter, setup_tracing, tracing_resource

        model = parse_audit(section)
        doc = model.worker_section()
        if not doc:
            raise AuditConfigError("audit: configure at least one sink and a spill directory")
        registry = CollectorRegistry()
        tc = dict(tracing or {})
        exporter = tc.get("exporter") or "none"
        # the audit worker process builds and exports the request spans from the rows (audit/row_spans.py);
        # the gateway's provider then only makes ids and sampling decisions
        worker_spans = model.worker == "process" and exporter in ("otlp", "console") and bool(tc.get("offload", True))
        if worker_spans:
            check_exporter(exporter)
            resource = tracing_resource()  # the provider's own (setup_tracing below)
            doc = {**doc, "spans": {"exporter": exporter, "endpoint": tc.get("otlp_endpoint"),
                                    "resource": dict(resource.attributes),
                                    "resource_schema_url": resource.schema_url or None}}
        if model.worker == "process":
            from audit.remote import RemoteAuditLog

            build_audit(model, validate_only=True)  # a bad config fails here, before any start
            log = RemoteAuditLog(doc, registry=registry)
        else:
            log = build_audit(model, registry=registry)
        provider = setup_tracing(None if exporter == "none" or worker_spans else exporter,
                                 endpoint=tc.get("otlp_endpoint"), offload=bool(tc.get("offload", True)),
                                 registry=registry, sample_ratio=float(tc.get("sample_ratio", 1.0)))
        admin_registry = CollectorRegistry()
        monitor = ConcentrationMonitor(load_guard_factor=router_factor, on_alert=stamping_observed_epoch(log.emit),
                                       registry=registry,  # alert.observed_at_epoch_s: S25-newcomer-5
                                       admin_registry=admin_registry, **model.concentration_kwargs())
        hub = cls(log, monitor, provider.get_tracer("prefixgate"), admin_registries=(admin_registry,))
        hub.public_registries = (registry,)
        hub.provider = provider
        hub.worker_spans = worker_spans
        return hub

    # -- lifecycle
    async def start(self) -> None:
        """Start the sink workers."""
        if self.log is not None:
            await self.log.start()

    async def close(self) -> None:
        """Write pending alert log summaries, flush every sink and write the final signed checkpoint."""
        if (alert_lines := getattr(self.monitor, "alert_log", None)) is not None:
            alert_lines.close()  # S25-fixops-4 (audit/alert_log.py)
        if self.log is not None:
            await self.log.close()
        provider = self.provider
        if provider is not None:  # may wait for the span exporter child: off the event loop
            await asyncio.to_thread(provider.shutdown)

    @property
    def accepting(self) -> bool:
        """False when the spill is full: the gateway must refuse new requests (503)."""
        return True if self.log is None else bool(self.log.accepting)

    @property
    def dropped(self) -> int:
        """Events dropped by the audit log (must stay 0)."""
        return 0 if self.log is None else int(self.log.dropped)

    def active_alerts(self) -> list[dict[str, object]]:
        """Active concentration alerts, for the policy input."""
        return [] if self.monitor is None else list(self.monitor.active_alerts())

    def admin_metrics_text(self) -> bytes:
        """Exposition of every audit metric, for the admin listener's ``/admin/metrics`` only
        (R3-5): the audit log's (events emitted and delivered, sinks, spill), tracing's, the
        pool-level concentration figures (HHI, prefix hit rate, active alerts: they move with
        other tenants' traffic and prefix reuse), the per-replica ones, and with the audit
        worker process its last metrics report. Nothing of it is on the public ``/metrics``."""
        worker_text = getattr(self.log, "worker_metrics_text", b"")
        return (b"".join(generate_latest(r) for r in self.public_registries) + worker_text
                + b"".join(generate_latest(r) for r in self._admin_registries))

    # -- tracing
    def start_span(self, rec: RequestRecord, headers: Mapping[str, str]) -> None:
        """Open the request's server span (a client ``traceparent`` becomes a link). With a provider from
        :func:`audit.tracing.setup_tracing` it is a plain :class:`audit.tracing.RequestTrace` finished in
        :meth:`record_request`, at first only its ids and sampling decision (an :class:`audit.tracing.TraceStart`,
        issue 14, session 11) made whole by :meth:`request_trace` when its spans are built (``headers`` read
        then, not copied); otherwise a live span of ``self.tracer``."""
        now = time.time_ns()  # the server span's start; stage times are offsets from it
        rec.extra["wall0_ns"] = now
        provider = self.provider
        if provider is not None:
            known = self._traced
            if known[0] is not provider:  # the provider's processors, looked up once (session 17)
                known = self._traced = (provider, span_processors(provider))
            ts = start_request_trace(provider, now, headers, known[1]) if known[1] is not None else None
            if ts is not None:
                rec.extra["trace"] = ts
                return
        links = _client_links(headers)
        name = "POST " + rec.endpoint
        attributes = {"http.request.method": "POST", "http.route": rec.endpoint}
        rt = begin_request_trace(provider, name, links, attributes, now) if provider is not None else None
        if rt is not None:
            rec.extra["trace"] = rt
        else:
            rec.extra["span"] = self.tracer.start_span(
                name, kind=SpanKind.SERVER, links=links, context=trace.set_span_in_context(trace.INVALID_SPAN),
                start_time=now, attributes=attributes)

    @staticmethod
    def request_trace(rec: RequestRecord) -> RequestTrace | None:
        """The request's :class:`audit.tracing.RequestTrace` (None: no trace, or a live span), made
        now from its :class:`audit.tracing.TraceStart` if :meth:`start_span` left one (then kept in ``rec``)."""
        rt = rec.extra.get("trace")
        if type(rt) is TraceStart:
            rt = rec.extra["trace"] = finish_trace_start(
                rt, "POST " + rec.endpoint, _client_links(rt.carrier),
                {"http.request.method": "POST", "http.route": rec.endpoint})
        return rt

    def inject_trace_headers(self, headers: dict[str, str], rec: RequestRecord | None = None) -> None:
        """Add the gateway's own ``traceparent`` (W3C Trace Context) for the upstream call."""
        if rec is None:
            return
        rt = rec.extra.get("trace")
        if type(rt) is TraceStart:  # the ids only: what the finished trace's context writes
            headers["traceparent"] = rt.traceparent()
        elif rt is not None:
            request_trace_headers(rt, headers)
        elif (span := rec.extra.get("span")) is not None:
            _PROPAGATOR.inject(headers, context=trace.set_span_in_context(span))

    def prepare_request(self, rec: RequestRecord) -> None:
        """The span part of the request's audit event, ahead, when it does not depend on how the request ends
        (a trace not recorded here: its id, with :attr:`worker_spans` and sampled the span extra): called while
        the replica works (issue 14, session 10) for :meth:`emit_request`. The trace stays in ``rec``. Session 19:
        the event's id too (random, ~0.8 us: off the answer's path; :meth:`emit_request` makes it when none was)."""
        rec.extra["event_id"] = new_event_id()
        rt = rec.extra.get("trace")
        if type(rt) is TraceStart and not (rt.processors and rt.flags.sampled):  # not recorded here: no RequestTrace
            # without a span extra, _start_span_part's value inline (session 17: one call less per request)
            rec.extra["span_part"] = (self._start_span_part(rt) if self.worker_spans and rt.flags.sampled
                                      else (rt.trace_hex(), None))
        elif (rt := self.request_trace(rec)) is not None and not records(rt):
            rec.extra["span_part"] = self._static_span_part(rt, rec.extra.get("wall0_ns"))

    def _start_span_part(self, ts: TraceStart) -> tuple[str, tuple | None]:
        """The span part of a trace not recorded here, from its ids (session 12: no :class:`RequestTrace`):
        what :func:`audit.row_spans.span_extra` makes of the trace :func:`finish_trace_start` would make."""
        return ts.trace_hex(), ((ts.span_id, int(ts.flags), ts.start_ns, encode_links(_client_links(ts.carrier)), None)
                                if self.worker_spans and ts.flags.sampled else None)

    def _static_span_part(self, rt: Any, wall0: int | None) -> tuple[str, tuple | None]:
        sc = rt.context
        if self.worker_spans and sc.trace_flags.sampled:  # the worker exports its spans
            return format(sc.trace_id, "032x"), span_extra(sc, time.time_ns() if wall0 is None else wall0, rt.links)
        return format(sc.trace_id, "032x"), None

    def _end_spans(self, rec: RequestRecord) -> tuple[str | None, tuple | None]:
        """End the request's trace: ``(trace id as 32 hex digits or None, span extra or None)``. With
        :attr:`worker_spans` a sampled trace's spans are not built here: the span extra
        (:func:`audit.row_spans.span_extra`) goes with the request row and the audit worker builds them."""
        extra = rec.extra
        rt = extra.get("trace")
        if type(rt) is TraceStart and not (rt.processors and rt.flags.sampled):  # not recorded here
            del extra["trace"]
            extra.pop("wall0_ns", None)
            return extra.pop("span_part", None) or self._start_span_part(rt)
        rt = self.request_trace(rec)
        extra.pop("trace", None)
        span = extra.pop("span", None)
        if rt is None and span is None:
            return None, None
        wall0 = extra.pop("wall0_ns", None)
        part = extra.pop("span_part", None)
        if part is not None:  # prepared while the replica worked (prepare_request)
            return part
        if rt is not None and not records(rt):  # not sampled, or nothing exports here: only the trace id
            return self._static_span_part(rt, wall0)
        if wall0 is None:
            wall0 = time.time_ns()

        children, end = stage_children(wall0, (rec.t0, rec.t_auth, rec.t_parsed, rec.t_keys, rec.t_decided,
                                               rec.t_route, rec.t_end))
        attrs = span_attributes(rec.status, rec.model, rec.prompt_tokens, rec.output_tokens, rec.tenant_id,
                                rec.replica, rec.predicted_prefix_tokens, rec.decision_id, rec.outcome)
        error = bool(rec.status and rec.status >= 500)
        end = end or time.time_ns()
        if rt is not None:
            end_request_trace(rt, end, attrs, error, children)
            sc = rt.context
        else:  # a tracer not built by setup_tracing: the plain API
            if span.is_recording():
                ctx = trace.set_span_in_context(span)
                for name, kind, start, stop in children:
                    self.tracer.start_span(name, context=ctx, kind=kind, start_time=start).end(end_time=stop)
            span.set_attributes(attrs)
            if error:
                span.set_status(Status(StatusCode.ERROR))
            span.end(end_time=end)
            sc = span.get_span_context()
        return (format(sc.trace_id, "032x") if sc.is_valid else None), None

    # -- events
    def record_request(self, rec: RequestRecord) -> None:
        """A finished request's audit event and spans (:meth:`emit_request`) and :meth:`observe_request`."""
        self.emit_request(rec)
        self.observe_request(rec)

    def emit_request(self, rec: RequestRecord) -> None:
        """The request's spans end and its one audit event is emitted.

        The event leaves as a request row (:mod:`audit.request_event`): the audit
        worker, or the in-process log, builds the :class:`AuditEvent` from it."""
        extra = rec.extra
        rt = extra.get("trace")
        if type(rt) is TraceStart and not (rt.processors and rt.flags.sampled):  # _end_spans' first case, inline
            del extra["trace"]  # (session 17: the common trace, not recorded here; one call less per event)
            extra.pop("wall0_ns", None)
            trace_id, spans = extra.pop("span_part", None) or self._start_span_part(rt)
        else:
            trace_id, spans = self._end_spans(rec)
        s = rec.settlement
        if s is None:
            reserved = charged = prompt_charged = output_charged = basis = None
        else:
            reserved, charged, prompt_charged, output_charged, basis = (
                s.reserved, s.charged, s.charged_prompt, s.charged_output, s.basis)
        row = (  # its second field: audit.event.now_ms(), inline
            extra.pop("event_id", None) or new_event_id(), time.time_ns() // 1_000_000, rec.outcome, rec.request_id,
            rec.spiffe_id, rec.trust_domain, rec.tenant_id,
            rec.decision_id, rec.reason_code or rec.error_code, rec.reason, rec.endpoint, rec.model,
            rec.prompt_tokens, rec.output_tokens, rec.sequences,
            reserved, charged, prompt_charged, output_charged, rec.relayed_output, basis,
            rec.error_code, rec.replica, rec.pool, rec.routing_policy, rec.available_prefix_tokens,
            rec.predicted_prefix_tokens, rec.delivered_prefix_tokens, rec.replica_load_tokens,
            rec.t0, rec.t_auth, rec.t_parsed, rec.t_keys, rec.t_decided, rec.t_route, rec.t_first_byte, rec.t_end,
            rec.status, rec.client_addr, trace_id, rec.prefix_fingerprint, rec.virtual_tokens, rec.queue_wait_ms,
            rec.dropped_fields or None, rec.policy_version,  # dropped_fields 0: none (omitted from the event)
        )
        self.emitted += 1
        if spans is not None:  # worker_spans: the log is a RemoteAuditLog
            self._emit_row(row, spans)
        elif self._emit_row is not None:
            self._emit_row(row)
        elif self.log is not None:
            self.log.emit(request_event(row, getattr(self.log, "instance", None)))

    def observe_request(self, rec: RequestRecord) -> None:
        """The concentration monitor's observation of a finished request (allowed and routed only)."""
        if self.monitor is not None and rec.replica and rec.outcome == "allowed":
            prompt = rec.prompt_tokens or 0
            predicted = rec.predicted_prefix_tokens or 0
            self.monitor.observe(rec.pool or "", rec.replica, max(0, prompt - predicted), prompt,
                                 rec.delivered_prefix_tokens or 0, time.monotonic(), tenant=rec.tenant_id)

    def record_operator(self, record: Mapping[str, Any]) -> None:
        """One audit event for an operator action (policy/data change, key rotation, reload).

        A failure record (``outcome: "failed"``: tenancy.admin / policy.admin ``failure_record``,
        session 21) also fills the event's ``status_code`` (its ``status``), ``error_code`` and
        ``endpoint`` (its ``route``, a template); any record's ``client_address`` (the request's source, a
        success's too since session 23, S22-fixsec-2; not repeated in ``operator``; S21-fixaudit-1) is the
        event's ``client_address`` (OCSF ``src_endpoint.ip``, CEF ``src``). A failure maps to OCSF status
        Failure with ``status_code`` and ``status_detail``, and the flood aggregation keys (source,
        SPIFFE ID) and counts them like refusals."""
        ok = record.get("outcome", "succeeded")
        actor = record.get("actor") or record.get("who")
        if isinstance(actor, Mapping):
            actor = actor.get("spiffe_id")
        actor = str(actor) if actor is not None else None
        failed = ok != "succeeded"
        status = record.get("status") if failed else None
        source = record.get("client_address")
        event = AuditEvent(
            kind=Kind.OPERATOR,
            outcome=Outcome.FAILED if failed else Outcome.SUCCEEDED,
            identity=Identity(actor, None),
            operator={k: v for k, v in record.items() if isinstance(v, (str, int, float, bool))
                      and k != "client_address"},
            status_code=status if isinstance(status, int) else None,
            error_code=record.get("error_code") if failed else None,
            endpoint=record.get("route") if failed else None,
            client_address=source if isinstance(source, str) else None,  # a success's too (S22-fixsec-2)
        )
        self.emitted += 1
        if self.log is not None:
            self.log.emit(event)

