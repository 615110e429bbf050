"""The audit worker's span export (issue 14, session 8): a request's spans built from its request row.

When the gateway's tracing exporter is ``otlp`` or ``console`` with ``offload`` and the audit trail
runs in the worker process, the gateway sends the worker's config a ``spans`` section
(``{"exporter", "endpoint", "resource", "resource_schema_url"}``) and adds each sampled request's
span extra to its row frame (:mod:`audit.row_spans`). :class:`WorkerSpans` turns each into its spans:

* ``otlp`` (session 10): the worker POSTs them itself (:class:`audit.span_post.SpanPoster`, aiohttp on
  the worker's event loop, batched), as OTLP bytes (:func:`audit.row_spans.row_span_bytes`) or, for a
  request outside that path's plain shape, as the span records of its compact request record. No
  exporter child process: no base64, pipe or second parse per request. Endpoint, headers, timeout,
  compression and TLS as the child had them (:meth:`audit.otlp_traces.OtlpHttpSettings.resolve`:
  the config's endpoint, else the ``OTEL_EXPORTER_OTLP_*`` environment the worker inherits).
* ``console``: the compact request record for an :class:`audit.span_export.OffloadSpanProcessor`
  started here (its exporter child is the worker's child), as before.

Best effort, as every span: a malformed extra is logged and counted (:attr:`WorkerSpans.refused`);
the request's audit event is emitted all the same. Dropped spans are counted in
``prefixgate_trace_spans_dropped_total{reason}`` of the worker's registry (reported to the gateway).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping, Sequence
from typing import Any

import orjson
from opentelemetry.sdk.resources import Resource

from audit.row_spans import SCOPE, row_span_bytes, row_span_record
from audit.span_request import expand_request_record

__all__ = ["WorkerSpans"]

#: Spans per OTLP POST of the worker's sender (session 14, issue 14; the SDK's batch processor and
#: :class:`audit.span_post.SpanPoster` default to 512): a request has 7 spans, so at 2,000 requests/s
#: 512 is ~27 POSTs a second, each an HTTP exchange in this process and in the collector; 2048 is ~7,
#: of ~300 KB each (the OpenTelemetry Collector's OTLP/HTTP receiver takes request bodies up to 20 MiB by
#: default). A partial batch still leaves every ``flush_interval_s`` (0.5 s).
WORKER_SPAN_BATCH = 2048

log = logging.getLogger("prefixgate.audit.worker")


class WorkerSpans:
    """Span export of the audit worker. ``config``: the ``spans`` section (module doc); ``registry``: the
    worker's registry (its drop counter reaches the gateway's admin metrics with the worker's report).

    Raises:
        audit.span_export.SpanExportConfigError: unknown exporter.
    """

    def __init__(self, config: Mapping[str, Any], registry: Any | None = None) -> None:
        resource = Resource(dict(config.get("resource") or {}), config.get("resource_schema_url"))
        exporter = str(config["exporter"])
        self.processor: Any = None  # console: the offload processor and its exporter child
        self.poster: Any = None  # otlp: the worker's own sender
        self._counter: Any = None
        #: spans dropped by reason (also in the registry's counter)
        self.dropped_by_reason: dict[str, int] = {}
        #: span extras refused as malformed (their spans are not exported)
        self.refused = 0
        if exporter != "otlp":
            from audit.span_export import OffloadSpanProcessor

            self.processor = OffloadSpanProcessor(exporter, resource, endpoint=config.get("endpoint"),
                                                  registry=registry)
            self.processor.start()
            return
        if registry is not None:
            from prometheus_client import Counter

            self._counter = Counter("prefixgate_trace_spans_dropped_total",
                                    "Spans dropped before reaching the OTLP collector (best-effort telemetry).",
                                    ["reason"], registry=registry)
        from audit.otlp_traces import OtlpHttpSettings
        from audit.span_post import SpanPoster

        try:
            settings = OtlpHttpSettings.resolve(config.get("endpoint") or None)
        except ValueError as exc:  # as the exporter child did: no export, every span dropped and counted
            log.error("audit worker: span export off: %s", exc)
            return
        self.poster = SpanPoster(resource, settings, self._drop, max_batch=WORKER_SPAN_BATCH)
        self.poster.start()

    def _drop(self, n: int, reason: str) -> None:
        if n > 0:
            self.dropped_by_reason[reason] = self.dropped_by_reason.get(reason, 0) + n
            if self._counter is not None:
                self._counter.labels(reason).inc(n)

    def request(self, row: Sequence[Any], extra: Sequence[Any]) -> None:
        """Queue the spans of one request (its decoded row and span extra); never raises.

        For ``otlp`` the spans are queued as their OTLP bytes (:func:`audit.row_spans.row_span_bytes`);
        a request outside that path's plain shape as the span records of its compact record (after the
        JSON round trip the exporter child's records had: what is not JSON is refused); for
        ``console`` as its compact record."""
        poster = self.poster
        if poster is not None:
            try:
                data, n = row_span_bytes(row, extra)
            except Exception:  # noqa: BLE001 -- the record path below decides (refused or exported)
                pass
            else:
                poster.add_bytes(data, n, SCOPE)
                return
        try:
            record = row_span_record(row, extra)
            if poster is not None:
                records = expand_request_record(orjson.loads(orjson.dumps(record)))
        except (ValueError, TypeError, IndexError, KeyError, AttributeError, orjson.JSONEncodeError) as exc:
            self.refused += 1
            log.error("audit worker: a request's span extra refused (%s)", type(exc).__name__)
            return
        if poster is not None:
            poster.add_records(records)
        elif self.processor is not None:
            self.processor.on_end_request(record)
        else:  # otlp with an unusable endpoint
            self._drop(len(record[12]) + 1, "exporter_down")

    async def close(self, timeout_s: float = 5.0) -> None:
        """Export what is queued (within ``timeout_s`` seconds) and stop: the sender, or the exporter
        child (off the event loop)."""
        if self.poster is not None:
            await self.poster.close(timeout_s)
        if self.processor is not None:
            await asyncio.to_thread(self.processor.shutdown)
