"""OTLP/HTTP logs sink: each audit event as one OpenTelemetry log record.

At-least-once, like every audit sink (:mod:`audit.sink`): :meth:`OtlpLogSink.send`
returns only after the collector acknowledged every record of the batch with a
2xx answer, otherwise it raises :class:`OtlpExportError` (a
:class:`audit.sink.SinkUnavailable`) and :class:`audit.log.AuditLog` keeps the
events in its spill and retries. There is no queue, thread or batch processor
of its own (the OpenTelemetry SDK logs pipeline used before dropped silently
when its queue was full and returned before delivery).

Encoding: one ``ExportLogsServiceRequest`` per request, built directly from the
generated protobuf messages of ``opentelemetry-proto``: one ResourceLogs
(``service.name`` plus optional resource attributes), one ScopeLogs
(``prefixgate.audit``), one LogRecord per event:

* ``time_unix_nano`` = ``event.time_ms`` × 10⁶; ``observed_time_unix_nano`` =
  the time the request was built (ns);
* severity WARN (13) for denied / unauthenticated / raised / failed outcomes,
  INFO (9) otherwise (OpenTelemetry log data model severity numbers);
* body = the canonical event JSON (:meth:`audit.event.AuditEvent.to_json`) as
  one string value;
* attributes ``event.name`` = ``prefixgate.audit.<kind>``,
  ``prefixgate.event_id``, ``prefixgate.outcome``, ``prefixgate.tenant``
  (when set); ``trace_id`` (16 bytes) when the event carries a valid one.

Transport and response handling follow the OTLP specification, OTLP/HTTP
section (https://opentelemetry.io/docs/specs/otlp/): binary protobuf POST
(``Content-Type: application/x-protobuf``), optional ``Content-Encoding:
gzip``; a 2xx answer is a success whose ``partial_success.rejected_log_records``
were refused for good (counted in :attr:`OtlpLogSink.rejected`, logged, never
retried, as the spec requires); 429, 502, 503, 504 and connection failures are
retryable; every other status is not retryable per the spec, but an audit
trail must not drop silently, so those also raise (events stay in the spill,
``prefixgate_audit_sink_up`` shows 0) and are logged as non-retryable so that
an operator fixes the endpoint or credentials. ``Retry-After`` is only logged:
:class:`audit.log.AuditLog` owns the backoff.

Proxy: ``http_proxy`` / ``https_proxy`` / ``no_proxy`` of the environment, read once, as the span
sender (:mod:`audit.http_proxy`; session 11: this sink went direct before); ``~/.netrc`` is not read.

Header values (e.g. a collector's ``Authorization``) and the endpoint's user
info and query string are never logged.
"""
from __future__ import annotations

import gzip
import importlib.metadata
import logging
import time
from collections.abc import Mapping, Sequence
from ssl import SSLContext
from typing import Literal

import aiohttp
from google.protobuf.message import DecodeError
from opentelemetry.proto.collector.logs.v1 import logs_service_pb2
from opentelemetry.proto.common.v1 import common_pb2
from yarl import URL

from audit.event import AuditEvent
from audit.http_proxy import env_proxy
from audit.otlp_log_build import WARN_OUTCOMES, build_request, build_resource, severity_of, trace_id_bytes
from audit.otlp_log_request import encode_logs_request
from audit.sink import SinkUnavailable
from audit.tls import client_context

#: the record-building names stay importable from here (they live in :mod:`audit.otlp_log_build`)
__all__ = ["DEFAULT_ENDPOINT", "OtlpExportError", "OtlpLogSink", "SCOPE_NAME", "WARN_OUTCOMES", "build_request",
           "build_resource", "severity_of", "trace_id_bytes"]

log = logging.getLogger(__name__)

#: Default OTLP/HTTP logs endpoint (OTLP spec default port 4318, path ``/v1/logs``).
DEFAULT_ENDPOINT = "http://localhost:4318/v1/logs"
#: Instrumentation scope name of the audit log records.
SCOPE_NAME = "prefixgate.audit"
#: HTTP statuses the OTLP spec marks retryable; every other 4xx/5xx is not.
RETRYABLE_STATUSES = frozenset({429, 502, 503, 504})
#: gzip level for ``compression="gzip"`` (zlib's default speed/size trade-off).
GZIP_LEVEL = 6
#: Longest collector-supplied message (error text) copied into our log lines.
MAX_LOGGED_MESSAGE_CHARS = 200

_PROTOBUF = "application/x-protobuf"
def _scope_version() -> str:
    try:
        return importlib.metadata.version("prefixgate")
    except importlib.metadata.PackageNotFoundError:
        return "0"


class OtlpExportError(SinkUnavailable):
    """One OTLP/HTTP export request was not accepted.

    Attributes:
        status: HTTP status, or None for a connection failure / timeout.
        retryable: True for 429/502/503/504 and connection failures (OTLP
            spec); False for other statuses (the endpoint or credentials
            need fixing). Either way the events stay in the spill.
        retry_after: the raw ``Retry-After`` header value, if any.
    """

    def __init__(self, message: str, status: int | None, retryable: bool, retry_after: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.retryable = retryable
        self.retry_after = retry_after


def _loggable_url(endpoint: str) -> str:
    """Endpoint without user info and query (they may carry credentials)."""
    return str(URL(endpoint).with_user(None).with_query(None).with_fragment(None))


def _short(text: str) -> str:
    text = text.replace("\n", " ").replace("\r", " ")
    return text if len(text) <= MAX_LOGGED_MESSAGE_CHARS else text[:MAX_LOGGED_MESSAGE_CHARS] + "…"


def _status_message(body: bytes) -> str:
    """The ``message`` of a ``google.rpc.Status`` error body (OTLP/HTTP
    failure responses), or "" when the body is not one."""
    if not body:
        return ""
    try:
        from google.rpc import status_pb2
    except ImportError:  # googleapis-common-protos is optional here
        return ""
    try:
        return _short(status_pb2.Status.FromString(body).message)
    except DecodeError:
        return ""


class OtlpLogSink:
    """Deliver audit events to an OTLP/HTTP logs endpoint, at least once.

    Args:
        endpoint: OTLP/HTTP logs URL (``http://`` or ``https://``, e.g.
            ``http://collector:4318/v1/logs``).
        name: sink name (names the spill file and metrics label).
        service_name: resource ``service.name``.
        resource_attributes: extra resource attributes (strings).
        headers: extra request headers, e.g. ``{"Authorization": "Bearer …"}``
            for the collector; never logged. ``Content-Type`` and
            ``Content-Encoding`` are set by the sink.
        timeout_s: per-request timeout (seconds), connect to response read.
        compression: ``"gzip"`` or None.
        ssl_context: TLS context for an ``https`` endpoint (private CA,
            client certificate); None = system defaults.
        max_batch: most log records per request; larger ``send`` batches are
            split and delivered in order.
        linger_s: seconds :class:`audit.log.AuditLog` lets events accumulate
            before a send (fewer, larger requests; like the SDK batch
            processor's schedule delay), unless a full batch is waiting.

    Raises:
        ValueError: bad endpoint scheme, compression, timeout or max_batch.

    Attributes:
        rejected: log records the collector accepted the request for but
            rejected (OTLP ``partial_success.rejected_log_records``); these
            are not retried (OTLP spec).
        requests: export requests acknowledged with a 2xx.
    """

    def __init__(
        self,
        endpoint: str = DEFAULT_ENDPOINT,
        *,
        name: str = "otlp",
        service_name: str = "prefixgate",
        resource_attributes: Mapping[str, str] | None = None,
        headers: Mapping[str, str] | None = None,
        timeout_s: float = 5.0,
        compression: Literal["gzip"] | None = None,
        ssl_context: SSLContext | None = None,
        max_batch: int = 512,
        linger_s: float = 0.5,
    ) -> None:
        url = URL(endpoint)
        if url.scheme not in ("http", "https") or not url.host:
            raise ValueError("OTLP endpoint must be an http:// or https:// URL")
        if compression not in (None, "gzip"):
            raise ValueError(f"OTLP compression must be 'gzip' or None, not {compression!r}")
        if not timeout_s > 0:
            raise ValueError("OTLP timeout_s must be > 0")
        if max_batch < 1:
            raise ValueError("OTLP max_batch must be >= 1")
        self.name = name
        self.endpoint = endpoint
        #: seconds AuditLog lets events accumulate before a send (one request per batch)
        self.linger_s = linger_s
        self.rejected = 0
        self.requests = 0
        self._log_url = _loggable_url(endpoint)
        self._timeout = aiohttp.ClientTimeout(total=timeout_s)
        self._compression = compression
        self._ssl = ssl_context
        self._max_batch = max_batch
        self._headers = {k: v for k, v in (headers or {}).items()
                         if k.lower() not in ("content-type", "content-encoding", "content-length")}
        self._headers["Content-Type"] = _PROTOBUF
        if compression == "gzip":
            self._headers["Content-Encoding"] = "gzip"
        self._resource = build_resource(service_name, resource_attributes)
        self._scope = common_pb2.InstrumentationScope(name=SCOPE_NAME, version=_scope_version())
        self._session: aiohttp.ClientSession | None = None
        # HTTP(S)_PROXY / NO_PROXY read once, as the span sender does (audit.http_proxy)
        self._proxy, proxy_auth = env_proxy(endpoint)
        self._headers.update(proxy_auth)
        self._last_failure: tuple[int | None, bool] | None = None

    async def open(self) -> None:
        """Create the HTTP client session (no connection is made yet)."""
        if self._session is None or self._session.closed:
            connector = aiohttp.TCPConnector(ssl=self._ssl if self._ssl is not None else client_context())
            self._session = aiohttp.ClientSession(connector=connector, timeout=self._timeout)

    async def send(self, events: list[AuditEvent]) -> None:
        """POST ``events`` in order, at most ``max_batch`` records a request.

        Returns once every request was answered 2xx. Raises
        :class:`OtlpExportError` (a SinkUnavailable) on the first request that
        was not: earlier requests of the batch are then already delivered and
        will be sent again on retry (receivers de-duplicate on event id).
        """
        if not events:
            return
        await self.open()
        for start in range(0, len(events), self._max_batch):
            await self._export(events[start:start + self._max_batch])
        if self._last_failure is not None:
            log.info("OTLP log export to %s recovered", self._log_url)
            self._last_failure = None

    async def close(self) -> None:
        """Close the HTTP session (idempotent)."""
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def _export(self, events: Sequence[AuditEvent]) -> None:
        assert self._session is not None
        # build_request's bytes, written directly (session 9)
        body = encode_logs_request(events, self._resource, self._scope, time.time_ns())
        if self._compression == "gzip":
            body = gzip.compress(body, compresslevel=GZIP_LEVEL)
        try:
            async with self._session.post(self.endpoint, data=body, headers=self._headers,
                                          **self._proxy) as resp:
                status = resp.status
                content_type = resp.content_type
                retry_after = resp.headers.get("Retry-After")
                payload = await resp.read()
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            reason = "timeout" if isinstance(exc, TimeoutError) else type(exc).__name__
            self._note_failure(None, True, f"OTLP log export to {self._log_url} failed: {reason} (retryable)")
            raise OtlpExportError(f"OTLP collector unreachable: {reason}", None, True) from None
        if 200 <= status < 300:
            self.requests += 1
            self._read_partial_success(payload, content_type, len(events))
            return
        retryable = status in RETRYABLE_STATUSES
        detail = _status_message(payload) if content_type == _PROTOBUF else ""
        hint = ("retryable" if retryable else
                "non-retryable per the OTLP spec: fix the endpoint or its credentials; events are kept in the spill")
        msg = f"OTLP log export to {self._log_url} answered HTTP {status} ({hint})"
        if detail:
            msg += f": {detail}"
        if retry_after is not None:
            msg += f"; Retry-After: {_short(retry_after)}"
        self._note_failure(status, retryable, msg)
        raise OtlpExportError(f"OTLP collector answered HTTP {status}", status, retryable, retry_after)

    def _read_partial_success(self, payload: bytes, content_type: str, sent: int) -> None:
        if not payload or content_type != _PROTOBUF:
            return
        try:
            answer = logs_service_pb2.ExportLogsServiceResponse.FromString(payload)
        except DecodeError:
            log.warning("OTLP log export to %s: 2xx answer is not an ExportLogsServiceResponse", self._log_url)
            return
        rejected = answer.partial_success.rejected_log_records
        if rejected > 0:
            self.rejected += rejected
            log.warning("OTLP collector at %s rejected %d of %d audit log records (not retried): %s",
                        self._log_url, rejected, sent, _short(answer.partial_success.error_message))

    def _note_failure(self, status: int | None, retryable: bool, message: str) -> None:
        """Log a failure once per change of (status, retryable), not every retry."""
        key = (status, retryable)
        if key != self._last_failure:
            log.log(logging.WARNING if retryable else logging.ERROR, "%s", message)
            self._last_failure = key
        else:
            log.debug("%s", message)
