"""OpenTelemetry tracing for the gateway (opentelemetry-sdk).

Trust rule: an incoming W3C ``traceparent`` comes from an untrusted client,
so it is recorded as a span **link** on the gateway's server span, never used
as the parent (a client must not be able to splice the gateway's spans into
its own trace or choose our trace id). Incoming ``baggage`` is dropped
(it is attacker-controlled and would otherwise be forwarded upstream).
:func:`inject_headers` propagates the gateway's own context to replicas.
"""
from __future__ import annotations

import importlib.util
import random
import time
import weakref
from dataclasses import dataclass
from collections.abc import Mapping, MutableMapping, Sequence
from typing import Any

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.id_generator import RandomIdGenerator
from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter, SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.trace.sampling import ALWAYS_ON, TraceIdRatioBased
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import Link, SpanContext, SpanKind, Status, StatusCode, TraceFlags
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from audit.span_frames import encode_request_spans
from audit.span_request import encode_request_record

# OpenTelemetry semantic conventions (HTTP stable, gen_ai development)
HTTP_REQUEST_METHOD = "http.request.method"
HTTP_ROUTE = "http.route"
GEN_AI_USAGE_INPUT_TOKENS = "gen_ai.usage.input_tokens"
# PrefixGate attributes
PG_TENANT = "prefixgate.tenant"

_PROPAGATOR = TraceContextTextMapPropagator()
_memory_exporter: InMemorySpanExporter | None = None
# the span processors setup_tracing() installed on each provider (record_finished_spans)
#: instrumentation scope of the gateway's request spans (the tracer name it used before)
_SCOPE = InstrumentationScope("prefixgate")
_PROCESSORS: "weakref.WeakKeyDictionary[TracerProvider, list[Any]]" = weakref.WeakKeyDictionary()


class TracingConfigError(ValueError):
    """Unknown exporter name or missing OTLP exporter package."""


def setup_tracing(exporter: str | None, service_name: str = "prefixgate", endpoint: str | None = None,
                  set_global: bool = False, offload: bool = True, registry: Any | None = None,
                  sample_ratio: float = 1.0) -> TracerProvider:
    """Build a TracerProvider.

    Args:
        exporter: ``"otlp"`` (OTLP/HTTP, needs opentelemetry-exporter-otlp-proto-http),
            ``"console"``, ``"memory"`` (tests; see :func:`memory_exporter`) or None (no export).
        service_name: ``service.name`` resource attribute.
        endpoint: OTLP traces URL (default from OTEL_EXPORTER_OTLP_* env).
        set_global: also install as the global provider.
        offload: for ``"otlp"``/``"console"``, export from a child process
            (:class:`audit.span_export.OffloadSpanProcessor`, started here; the
            provider's ``shutdown()`` stops it) so the gateway process never
            encodes spans; False keeps the SDK's in-process ``BatchSpanProcessor``.
            ``"memory"`` is always in-process (``SimpleSpanProcessor``).
        registry: prometheus registry for ``prefixgate_trace_spans_dropped_total``
            (offload only; optional).
        sample_ratio: fraction of traces recorded, 0..1. 1.0 uses the
            ``ALWAYS_ON`` sampler; below it ``TraceIdRatioBased`` (children
            follow their root's trace id, so a trace is whole or absent).
            Never ``ParentBased``: the server span is always a root (a client's
            context is only a link), and the parent-based wrapper cost ~5 us per
            span for nothing. Audit events are never sampled.

    Raises:
        TracingConfigError: unknown exporter, OTLP package missing, or a
            ratio outside 0..1.
    """
    global _memory_exporter
    if not 0.0 <= sample_ratio <= 1.0:
        raise TracingConfigError(f"sample_ratio must be within 0..1, not {sample_ratio!r}")
    sampler = ALWAYS_ON if sample_ratio >= 1.0 else TraceIdRatioBased(sample_ratio)
    provider = TracerProvider(resource=tracing_resource(service_name), sampler=sampler)
    _PROCESSORS[provider] = processors = []
    check_exporter(exporter)
    if exporter in ("otlp", "console") and offload:
        from audit.span_export import OffloadSpanProcessor
        processor = OffloadSpanProcessor(exporter, provider.resource, endpoint=endpoint, registry=registry)
        processor.start()
        processors.append(processor)
    elif exporter == "otlp":
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from audit.tls import requests_session  # S19-R3: the TLS floor and forward-secret suites

        exporter_obj = OTLPSpanExporter(endpoint=endpoint, session=requests_session()) if endpoint \
            else OTLPSpanExporter(session=requests_session())
        processors.append(BatchSpanProcessor(exporter_obj))
    elif exporter == "console":
        processors.append(BatchSpanProcessor(ConsoleSpanExporter()))
    elif exporter == "memory":
        _memory_exporter = InMemorySpanExporter()
        processors.append(SimpleSpanProcessor(_memory_exporter))
    elif exporter is not None:
        raise TracingConfigError(f"unknown exporter {exporter!r}")
    for processor in processors:
        provider.add_span_processor(processor)
    if set_global:
        trace.set_tracer_provider(provider)
    return provider


def tracing_resource(service_name: str = "prefixgate") -> Resource:
    """The resource of :func:`setup_tracing`'s providers (``service.name`` plus the SDK's and the
    ``OTEL_RESOURCE_ATTRIBUTES`` environment's attributes)."""
    return Resource.create({"service.name": service_name})


def check_exporter(exporter: str | None) -> None:
    """Raise :class:`TracingConfigError` when ``exporter`` is ``"otlp"`` and its package is missing."""
    if exporter == "otlp" and importlib.util.find_spec("opentelemetry.exporter.otlp.proto.http") is None:
        raise TracingConfigError("install opentelemetry-exporter-otlp-proto-http for exporter='otlp'")


_SAMPLED = TraceFlags(TraceFlags.SAMPLED)
_getrandbits = random.getrandbits  # what RandomIdGenerator draws ids with
_NOT_SAMPLED = TraceFlags(TraceFlags.DEFAULT)


@dataclass(slots=True)
class RequestTrace:
    """A request's trace, recorded after the fact (see :func:`begin_request_trace`).

    ``context`` is the server span's SpanContext (valid from the start, so the
    gateway can propagate it upstream and put the trace id in the audit
    event); ``start_ns`` epoch nanoseconds.
    """

    provider: TracerProvider
    name: str
    context: SpanContext
    start_ns: int
    links: Sequence[Link]
    attributes: dict[str, Any]
    #: the provider's span processors (the list :func:`setup_tracing` keeps), looked up once at begin
    processors: Sequence[Any] = ()


def begin_request_trace(provider: TracerProvider, name: str, links: Sequence[Link],
                        attributes: dict[str, Any], start_ns: int | None = None) -> RequestTrace | None:
    """Start a request's SERVER span as a plain record, not a live SDK span.

    The trace and span ids come from the provider's id generator and the
    sampling decision from its sampler (a new root: the client's context is
    only a link; ``ALWAYS_ON`` and ``TraceIdRatioBased``, the samplers of :func:`setup_tracing`,
    are decided here by their own rule without a ``SamplingResult``, with an empty trace state,
    as a root has); nothing is handed to the processors until
    :func:`end_request_trace`. The gateway times every stage itself, so the
    SDK's live-span machinery (locks, attribute limits, ``on_start``, per
    attribute validation) would add ~30 us per request for the same exported
    spans. ``attributes`` is kept, not copied (the caller hands it over);
    ``start_ns`` is the span's start (epoch ns, default now).
    Returns None when ``provider`` was not built by
    :func:`setup_tracing` (callers then use the plain tracer API).
    """
    processors = _PROCESSORS.get(provider)
    if processors is None:
        return None
    ids = provider.id_generator
    trace_id = ids.generate_trace_id()
    sampler = provider.sampler
    if sampler is ALWAYS_ON:  # setup_tracing's two samplers, decided here (a root: no parent, no trace state)
        flags, state = _SAMPLED, None
    elif type(sampler) is TraceIdRatioBased:  # its own rule (TraceIdRatioBased.should_sample)
        flags, state = (_SAMPLED if trace_id & sampler.TRACE_ID_LIMIT < sampler.bound else _NOT_SAMPLED), None
    else:
        result = sampler.should_sample(None, trace_id, name, SpanKind.SERVER, attributes, links)
        flags, state = (_SAMPLED if result.decision.is_sampled() else _NOT_SAMPLED), result.trace_state
    ctx = SpanContext(trace_id, ids.generate_span_id(), False, flags, state)
    return RequestTrace(provider, name, ctx, time.time_ns() if start_ns is None else start_ns, tuple(links), attributes,
                        processors)


class TraceStart:
    """A request trace as the request's path needs it (issue 14, session 11): the server span's ids,
    its sampling flags and start, nothing else; :func:`finish_trace_start` makes the
    :class:`RequestTrace` later (while the replica works, or at the request's end), when the links
    and attributes are known. ``trace_id`` (128-bit) and ``span_id`` (64-bit) from the provider's id
    generator, never 0; ``flags``: :class:`TraceFlags` (sampled or not; the trace state is empty, as
    a root's is); ``start_ns``: epoch ns; ``carrier``: what the caller needs to make the links later
    (the client's headers), kept as it is; ``processors``: as :attr:`RequestTrace.processors`."""

    __slots__ = ("provider", "processors", "trace_id", "span_id", "flags", "start_ns", "carrier", "_tp")

    def __init__(self, provider: TracerProvider, processors: Sequence[Any], trace_id: int, span_id: int,
                 flags: TraceFlags, start_ns: int, carrier: Any) -> None:
        self.provider, self.processors = provider, processors
        self.trace_id, self.span_id, self.flags = trace_id, span_id, flags
        self.start_ns, self.carrier = start_ns, carrier
        self._tp: str | None = None

    def traceparent(self) -> str:
        """The W3C ``traceparent`` of the server span (what :func:`request_trace_headers` writes for
        the :class:`RequestTrace` that :func:`finish_trace_start` makes of it); made once."""
        tp = self._tp
        if tp is None:  # %: ~0.2 µs less than an f-string
            tp = self._tp = "00-%032x-%016x-%02x" % (self.trace_id, self.span_id, self.flags)
        return tp

    def trace_hex(self) -> str:
        """The trace id as 32 lowercase hex digits (``format(trace_id, "032x")``), cut from the
        ``traceparent`` when it was made (the request's upstream header; issue 14, session 12)."""
        tp = self._tp
        return format(self.trace_id, "032x") if tp is None else tp[3:35]


def span_processors(provider: TracerProvider) -> Sequence[Any] | None:
    """The span processors :func:`setup_tracing` installed on ``provider`` (None: not built by it); a caller
    that starts many traces on one provider passes them to :func:`start_request_trace` (one lookup)."""
    return _PROCESSORS.get(provider)


def start_request_trace(provider: TracerProvider, start_ns: int, carrier: Any = None,
                        processors: Sequence[Any] | None = None) -> TraceStart | None:
    """The ids and sampling decision of a request's SERVER span, as :func:`begin_request_trace` makes
    them (the same ids: the SDK's ``RandomIdGenerator`` draws, made here without its two calls, session 17;
    same rule for :func:`setup_tracing`'s two samplers), without the span context, links or attributes
    (~1 µs instead of ~4: issue 14, session 11). Returns None when
    ``provider`` was not built by :func:`setup_tracing` or its sampler is another one (whose decision
    may depend on the links and attributes): the caller then uses :func:`begin_request_trace`.
    ``processors``: :func:`span_processors` of ``provider`` when the caller has them (else looked up here)."""
    if processors is None:
        processors = _PROCESSORS.get(provider)
        if processors is None:
            return None
    sampler = provider.sampler
    if sampler is not ALWAYS_ON and type(sampler) is not TraceIdRatioBased:
        return None
    ids = provider.id_generator
    if type(ids) is RandomIdGenerator:  # its rule (random bits, never the invalid 0) without its two calls
        trace_id = _getrandbits(128) or ids.generate_trace_id()  # (session 17; 0 has probability 2^-128)
        span_id = _getrandbits(64) or ids.generate_span_id()
    else:
        trace_id = ids.generate_trace_id()
        span_id = ids.generate_span_id()
    sampled = sampler is ALWAYS_ON or trace_id & sampler.TRACE_ID_LIMIT < sampler.bound  # type: ignore[attr-defined]
    flags = _SAMPLED if sampled else _NOT_SAMPLED
    return TraceStart(provider, processors, trace_id, span_id, flags, start_ns, carrier)


def finish_trace_start(ts: TraceStart, name: str, links: Sequence[Link], attributes: dict[str, Any]) -> RequestTrace:
    """The :class:`RequestTrace` of ``ts``: what :func:`begin_request_trace` would have returned with
    these ``name``, ``links`` and ``attributes`` (kept, not copied) and the same ids and decision."""
    ctx = SpanContext(ts.trace_id, ts.span_id, False, ts.flags, None)
    return RequestTrace(ts.provider, name, ctx, ts.start_ns, tuple(links), attributes, ts.processors)


def records(rt: RequestTrace) -> bool:
    """True when :func:`end_request_trace` would record ``rt`` (sampled, and its provider has
    span processors): otherwise the caller need not build the spans' attributes or children."""
    return bool(rt.context.trace_flags.sampled and rt.processors)


def end_request_trace(rt: RequestTrace, end_ns: int, attributes: Mapping[str, Any], error: bool,
                      children: Sequence[tuple[str, SpanKind, int, int]]) -> int:
    """Finish ``rt``: its SERVER span (``attributes`` added, status ERROR when
    ``error``) and its ``children`` ``(name, kind, start_ns, end_ns)`` go to the
    provider's span processors as finished ReadableSpans (the offload processor alone: one
    compact record, :mod:`audit.span_request`). Returns the number
    of spans recorded (0 when the trace was not sampled)."""
    processors = rt.processors
    psc = rt.context
    if not processors or not psc.trace_flags.sampled:
        return 0
    if len(processors) == 1 and hasattr(processors[0], "on_end_request"):  # the offload processor: one record,
        # its children's span ids made by the exporter child (audit.span_request)
        processors[0].on_end_request(encode_request_record(
            rt.name, psc, rt.links, {**rt.attributes, **attributes}, rt.start_ns, end_ns, error, children, _SCOPE))
        return len(children) + 1
    new_id = rt.provider.id_generator.generate_span_id
    if all(getattr(p, "takes_encoded", False) for p in processors):  # encoded spans, no SDK spans
        encoded = encode_request_spans(rt.name, psc, rt.links, {**rt.attributes, **attributes}, rt.start_ns, end_ns,
                                       error, children, new_id, _SCOPE)
        for processor in processors:
            many = getattr(processor, "on_end_encoded_many", None)
            if many is not None:  # the offload processor: the request's spans in one call
                many(encoded)
            else:
                for one in encoded:
                    processor.on_end_encoded(one)
        return len(encoded)
    resource = rt.provider.resource
    spans = [ReadableSpan(name=name, context=SpanContext(psc.trace_id, new_id(), False, psc.trace_flags, psc.trace_state),
                          parent=psc, resource=resource, kind=kind, start_time=start, end_time=end,
                          instrumentation_scope=_SCOPE)
             for name, kind, start, end in children]
    spans.append(ReadableSpan(name=rt.name, context=psc, parent=None, resource=resource,
                              attributes={**rt.attributes, **attributes}, links=rt.links, kind=SpanKind.SERVER,
                              status=Status(StatusCode.ERROR) if error else Status(StatusCode.UNSET),
                              start_time=rt.start_ns, end_time=end_ns, instrumentation_scope=_SCOPE))
    for span in spans:
        for processor in processors:
            processor.on_end(span)
    return len(spans)


def request_trace_headers(rt: RequestTrace, headers: dict[str, str]) -> None:
    """Write ``rt``'s ``traceparent`` (and a non-empty ``tracestate``; W3C Trace Context) into
    ``headers``: exactly what the W3C propagator's ``inject`` writes for that span context,
    without building a context per request (tests/audit/test_s3_trace_headers.py)."""
    sc = rt.context
    if sc == trace.INVALID_SPAN_CONTEXT:
        return
    headers["traceparent"] = "00-%032x-%016x-%02x" % (sc.trace_id, sc.span_id, sc.trace_flags)  # format_*_id's digits
    if sc.trace_state:
        headers["tracestate"] = sc.trace_state.to_header()


def memory_exporter() -> InMemorySpanExporter | None:
    """The in-memory exporter of the last ``setup_tracing("memory")``."""
    return _memory_exporter


def incoming_links(headers: Mapping[str, str]) -> list[Link]:
    """A span link to the client's ``traceparent`` (if valid), never a parent.
    ``tracestate``/``baggage`` are ignored. Header names are case-insensitive."""
    lowered = {k.lower(): v for k, v in headers.items()}
    if "traceparent" not in lowered:  # the propagator would find no context: no link
        return []
    ctx = _PROPAGATOR.extract({"traceparent": lowered["traceparent"]})
    sc = trace.get_current_span(ctx).get_span_context()
    if not sc.is_valid:
        return []
    return [Link(sc, attributes={"prefixgate.link": "client_traceparent"})]


def start_server_span(tracer: trace.Tracer, name: str, headers: Mapping[str, str], method: str, route: str):
    """Start the gateway's SERVER span as a new root (empty context) linked
    to the client's traceparent. Use as a context manager."""
    return tracer.start_as_current_span(
        name, context=Context(), kind=SpanKind.SERVER, links=incoming_links(headers),
        attributes={HTTP_REQUEST_METHOD: method, HTTP_ROUTE: route},
    )


def inject_headers(headers: MutableMapping[str, str]) -> MutableMapping[str, str]:
    """Write the current span's ``traceparent`` into ``headers`` (upstream
    request) after removing any client-supplied ``traceparent``,
    ``tracestate`` and ``baggage``. Returns ``headers``."""
    for k in list(headers):
        if k.lower() in ("traceparent", "tracestate", "baggage"):
            del headers[k]
    _PROPAGATOR.inject(headers)
    return headers
