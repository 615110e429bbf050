"""OTLP logs sink: each audit event as one OpenTelemetry log record.

Uses the SDK logs pipeline (``opentelemetry.sdk._logs``, still underscored
in the SDK) with the OTLP/HTTP exporter from
``opentelemetry-exporter-otlp-proto-http``; tests pass an in-memory exporter.
Body = the event as compact JSON text (schema v1; a string body is encoded
once instead of one OTLP key-value per nested field, which halved this
sink's CPU in the gateway: docs/audit.md); attributes = event id, kind,
outcome, tenant. The OTLP batch processor has its own bounded queue and drops when
full, so this sink is a best-effort copy next to the durable JSONL chain.
"""
from __future__ import annotations

import json
from typing import Any

from audit.event import AuditEvent, Outcome


class OtlpLogSink:
    """Export audit events as OTLP log records.

    Args:
        endpoint: OTLP/HTTP logs URL (e.g. ``http://collector:4318/v1/logs``).
        exporter: a LogExporter instead of OTLP (tests).
    """

    def __init__(self, endpoint: str | None = None, exporter: Any = None, name: str = "otlp",
                 service_name: str = "prefixgate") -> None:
        from opentelemetry.sdk._logs import LoggerProvider
        from opentelemetry.sdk._logs.export import BatchLogRecordProcessor, SimpleLogRecordProcessor
        from opentelemetry.sdk.resources import Resource

        self.name = name
        if exporter is None:
            from opentelemetry.exporter.otlp.proto.http._log_exporter import OTLPLogExporter

            exporter = OTLPLogExporter(endpoint=endpoint)
            processor = BatchLogRecordProcessor(exporter)
        else:
            processor = SimpleLogRecordProcessor(exporter)
        self._provider = LoggerProvider(resource=Resource.create({"service.name": service_name}))
        self._provider.add_log_record_processor(processor)
        self._logger = self._provider.get_logger("prefixgate.audit")

    async def open(self) -> None:
        """Nothing to connect (the exporter connects per batch)."""

    async def send(self, events: list[AuditEvent]) -> None:
        """Emit one log record per event."""
        from opentelemetry._logs import SeverityNumber

        for ev in events:
            bad = ev.outcome in (Outcome.DENIED, Outcome.UNAUTHENTICATED, Outcome.RAISED, Outcome.FAILED)
            self._logger.emit(
                timestamp=ev.time_ms * 1_000_000,
                severity_number=SeverityNumber.WARN if bad else SeverityNumber.INFO,
                severity_text="WARN" if bad else "INFO",
                body=json.dumps(ev.to_dict(), separators=(",", ":"), sort_keys=True),
                attributes={"event.name": f"prefixgate.audit.{ev.kind.value}", "prefixgate.event_id": ev.event_id,
                            "prefixgate.outcome": ev.outcome.value, **({"prefixgate.tenant": ev.tenant} if ev.tenant else {})},
            )

    async def close(self) -> None:
        """Flush and shut down the provider."""
        self._provider.force_flush()
        self._provider.shutdown()
