"""The audit worker's span export (issue 14, session 8): a request's spans built from its request row.

When the gateway's tracing exporter is ``otlp`` or ``console`` with ``offload`` and the audit trail
runs in the worker process, the gateway sends the worker's config a ``spans`` section
(``{"exporter", "endpoint", "resource", "resource_schema_url"}``) and adds each sampled request's
span extra to its row frame (:mod:`audit.row_spans`). :class:`WorkerSpans` turns each into the
compact request record the gateway used to make and hands it to an
:class:`audit.span_export.OffloadSpanProcessor` started here (its exporter child is the worker's
child). Best effort, as every span: a malformed extra is logged and counted (:attr:`WorkerSpans.refused`);
the request's audit event is emitted all the same.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping, Sequence
from typing import Any

from opentelemetry.sdk.resources import Resource

from audit.row_spans import SCOPE, row_span_bytes, row_span_record
from audit.span_export import OffloadSpanProcessor

__all__ = ["WorkerSpans"]

log = logging.getLogger("prefixgate.audit.worker")


class WorkerSpans:
    """Span export of the audit worker. ``config``: the ``spans`` section (module doc); ``registry``: the
    worker's registry (its drop counter reaches the gateway's admin metrics with the worker's report).

    Raises:
        audit.span_export.SpanExportConfigError: unknown exporter.
    """

    def __init__(self, config: Mapping[str, Any], registry: Any | None = None) -> None:
        resource = Resource(dict(config.get("resource") or {}), config.get("resource_schema_url"))
        self.processor = OffloadSpanProcessor(str(config["exporter"]), resource, endpoint=config.get("endpoint"),
                                              registry=registry)
        self.processor.start()
        self._bytes = config["exporter"] == "otlp"  # the otlp child takes spans as OTLP bytes
        #: span extras refused as malformed (their spans are not exported)
        self.refused = 0

    def request(self, row: Sequence[Any], extra: Sequence[Any]) -> None:
        """Queue the spans of one request (its decoded row and span extra); never raises.

        For the ``otlp`` exporter the spans leave as their OTLP bytes (:func:`audit.row_spans.row_span_bytes`,
        session 9: no record, JSON trip or expansion in the exporter child); a request outside that
        path's plain shape, and every request for ``console``, as its compact record."""
        if self._bytes:
            try:
                data, n = row_span_bytes(row, extra)
            except Exception:  # noqa: BLE001 -- the record path below decides (refused or exported)
                pass
            else:
                self.processor.on_end_span_bytes(data, n, SCOPE)
                return
        try:
            record = row_span_record(row, extra)
        except (ValueError, TypeError, IndexError, KeyError, AttributeError) as exc:
            self.refused += 1
            log.error("audit worker: a request's span extra refused (%s)", type(exc).__name__)
            return
        self.processor.on_end_request(record)

    async def close(self) -> None:
        """Export what is queued and stop the exporter child (off the event loop)."""
        await asyncio.to_thread(self.processor.shutdown)
