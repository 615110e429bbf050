"""The audit worker's own OTLP/HTTP span export (issue 14, session 10): :class:`SpanPoster`.

Until session 9 the audit worker handed its request spans to an exporter child process
(:mod:`audit.span_exporter_proc`): base64 of the span bytes, an orjson frame, a pipe, the child's
parse and a ``requests`` POST, ~22 us of CPU per request on the worker's core. Here the worker POSTs
the spans itself, on its own event loop, with aiohttp (as the OTLP log sink, :mod:`audit.otlp`, does):

* :meth:`SpanPoster.add_bytes` queues a request's spans already encoded as ``ScopeSpans.spans``
  fields (:func:`audit.row_spans.row_span_bytes`), :meth:`SpanPoster.add_records` span wire records
  (``audit.span_frames.SPAN_FIELDS`` order; a request outside the plain shape). Both never block:
  queued spans are bounded (``max_queue_spans``, counting the batch in flight); past it a request's
  spans are dropped whole and counted (``queue_full``).
* One task sends a batch when ``max_batch`` spans are queued or every ``flush_interval_s``: one
  ``ExportTraceServiceRequest`` per batch (:class:`audit.otlp_trace_request.OtlpRequestEncoder`,
  the same bytes as the child built), one POST.
* The POST follows the OTLP/HTTP specification as :class:`audit.otlp_traces.OtlpHttpSender` does
  (same settings: :class:`audit.otlp_traces.OtlpHttpSettings`, endpoint, headers, timeout,
  compression, TLS files from the arguments or ``OTEL_EXPORTER_OTLP_*``; the environment's proxy,
  read once, as the log sink: :mod:`audit.http_proxy`): 429/502/503/504 and
  connection failures retried with a doubling, jittered :class:`audit.backoff.Backoff` (or the
  answer's ``Retry-After`` seconds) within the export timeout; any other status, or the timeout
  spent, drops the batch (counted, ``export_failed``); ``partial_success.rejected_spans`` are
  counted (``rejected``), never retried. While a batch is retried new spans queue up to the bound.

Spans are best-effort telemetry (audit events are not: they never go this way). Header values and
the endpoint's user info and query are never logged.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import ssl
from collections.abc import Callable, Sequence
from typing import Any

import aiohttp
from opentelemetry.sdk.resources import Resource

from audit.backoff import Backoff
from audit.http_proxy import env_proxy
from audit.otlp_trace_request import OtlpRequestEncoder
from audit.otlp_traces import (MAX_REQUEST_BYTES, RETRY_BACKOFF_S, RETRYABLE_STATUSES, ExportOutcomes,
                               OtlpHttpSettings, compress, loggable_url)
from audit.span_request import BYTES_MARK
from audit.tls import client_context

__all__ = ["DROP_EXPORT_FAILED", "DROP_QUEUE_FULL", "DROP_REJECTED", "SpanPoster", "ssl_context"]

log = logging.getLogger("prefixgate.audit.spans")

DROP_QUEUE_FULL = "queue_full"
DROP_EXPORT_FAILED = "export_failed"
DROP_REJECTED = "rejected"
_PROTOBUF = "application/x-protobuf"


def ssl_context(settings: OtlpHttpSettings) -> ssl.SSLContext:
    """The TLS setup of :class:`audit.otlp_traces.OtlpHttpSender` for aiohttp: the CA file (else the
    system's roots) and the client certificate and key for mutual TLS, with the floor and
    forward-secret suites of :func:`audit.tls.client_context` (S19-R3).

    Raises:
        OSError, ssl.SSLError: a CA or client file that cannot be read."""
    return client_context(settings.ca_file, certfile=settings.client_cert, keyfile=settings.client_key)


class SpanPoster:
    """Batched OTLP/HTTP span export on the running event loop (module doc).

    Args:
        resource: the gateway provider's resource (``ResourceSpans.resource``).
        settings: endpoint, headers, timeout (seconds, one export with its retries), compression, TLS.
        drop: called ``(n_spans, reason)`` for every drop (the worker's prometheus counter).
        max_batch: spans per POST (a request's spans never split), and queue length that sends at once.
        max_queue_spans: bound on queued + in-flight spans.
        flush_interval_s: longest wait of a queued span before its POST, seconds.
        sleep: ``async (seconds)`` retry wait (tests); default ``asyncio.sleep``.

    Raises:
        ValueError: non-positive sizes or interval.
    """

    def __init__(self, resource: Resource, settings: OtlpHttpSettings, drop: Callable[[int, str], None], *,
                 max_batch: int = 512, max_queue_spans: int = 20_000, flush_interval_s: float = 0.5,
                 sleep: Callable[[float], Any] | None = None) -> None:
        if max_batch <= 0 or max_queue_spans <= 0 or flush_interval_s <= 0:
            raise ValueError("max_batch, max_queue_spans and flush_interval_s must be > 0")
        self.settings = settings
        self._encoder = OtlpRequestEncoder(resource)
        self._drop = drop
        self.max_batch = max_batch
        self.max_queue_spans = max_queue_spans
        self.flush_interval_s = flush_interval_s
        self._sleep = sleep or asyncio.sleep
        self._queue: collections.deque[tuple[Any, int]] = collections.deque()  # (record, spans)
        self._queued = 0
        self._in_flight = 0
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._session: aiohttp.ClientSession | None = None
        self._closing = False
        self._log_url = loggable_url(settings.endpoint)
        self._outcomes = ExportOutcomes(self._log_url, log)
        headers = {k: v for k, v in settings.headers.items()
                   if k.lower() not in ("content-type", "content-encoding", "content-length")}
        headers["Content-Type"] = _PROTOBUF
        if settings.compression is not None:
            headers["Content-Encoding"] = settings.compression
        self._proxy, proxy_auth = env_proxy(settings.endpoint)  # the environment's, read once
        headers.update(proxy_auth)
        self._headers = headers
        #: spans the collector answered 2xx for; POSTs answered 2xx; retried attempts; spans rejected
        self.exported = self.requests = self.retries = self.rejected_spans = 0

    @property
    def queued_spans(self) -> int:
        """Spans waiting for a POST (not counting the batch in flight)."""
        return self._queued

    # -- producer side (the worker's frame loop): never blocks, never raises
    def add_bytes(self, data: bytes, k: int, scope: tuple) -> None:
        """Queue ``k`` spans of ``scope`` ((name, version, schema url)) as ``ScopeSpans.spans`` fields."""
        if self._fits(k):
            self._push([BYTES_MARK, k, *scope, data], k)

    def add_records(self, records: Sequence[Sequence[Any]]) -> None:
        """Queue one request's span wire records (dropped together when they do not all fit)."""
        if records and self._fits(len(records)):
            for r in records:
                self._push(r, 1)

    def _fits(self, k: int) -> bool:
        if self._closing or self._queued + self._in_flight + k > self.max_queue_spans:
            self._drop(k, DROP_QUEUE_FULL)
            return False
        return True

    def _push(self, record: Any, k: int) -> None:
        self._queue.append((record, k))
        self._queued += k
        if self._queued >= self.max_batch:
            self._wake.set()

    # -- lifecycle
    def start(self) -> None:
        """Start the sending task on the running loop. Idempotent."""
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run(), name="audit-span-poster")

    async def close(self, timeout_s: float = 5.0) -> None:
        """Send what is queued (retries included) within ``timeout_s`` seconds, then stop; spans still
        queued or in flight then are dropped and counted (``export_failed``). Idempotent."""
        self._closing = True
        self._wake.set()
        if self._task is not None:
            try:
                await asyncio.wait_for(asyncio.shield(self._task), timeout_s)
            except asyncio.TimeoutError:
                self._task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await self._task
        lost = self._queued + self._in_flight
        if lost:
            self._drop(lost, DROP_EXPORT_FAILED)
            log.warning("span export stopped with %d spans unsent", lost)
        self._queue.clear()
        self._queued = self._in_flight = 0
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def _run(self) -> None:
        while True:
            due = self._closing
            if self._queued < self.max_batch and not due:
                try:
                    await asyncio.wait_for(self._wake.wait(), self.flush_interval_s)
                except asyncio.TimeoutError:
                    due = True
            self._wake.clear()
            # full batches; a partial one only when its interval is over or at close
            while self._queue and (self._queued >= self.max_batch or due or self._closing):
                batch, n = self._take()
                self._in_flight = n
                try:
                    await self._export(batch, n)
                except Exception as exc:  # noqa: BLE001 -- a bug here must not end the span export
                    self._drop(n, DROP_EXPORT_FAILED)
                    log.warning("span export raised %s (%d spans lost)", type(exc).__name__, n)
                # cancelled by close(): the batch stays counted in _in_flight, close() drops and counts it
                self._in_flight = 0
            if self._closing:
                return

    def _take(self) -> tuple[list[Any], int]:
        """The oldest records holding up to ``max_batch`` spans (at least one record), and their spans."""
        q = self._queue
        batch: list[Any] = []
        n = 0
        while q and (not batch or n + q[0][1] <= self.max_batch):
            record, k = q.popleft()
            batch.append(record)
            n += k
        self._queued -= n
        return batch, n

    async def _export(self, batch: list[Any], n: int) -> None:
        body, bad = self._encoder.encode(batch)
        if bad:
            self._drop(bad, DROP_EXPORT_FAILED)
            log.warning("dropped %d unencodable span records", bad)
        if not body:
            return
        sent = n - bad
        if await self._post(body, sent):
            self.exported += sent
        else:
            self._drop(sent, DROP_EXPORT_FAILED)

    async def _open(self) -> aiohttp.ClientSession:
        if self._session is None:
            connector = aiohttp.TCPConnector(ssl=ssl_context(self.settings), limit=2)
            # the environment's proxy read once (audit.http_proxy), as the OTLP log sink: no trust_env (it
            # re-read the proxy variables and ~/.netrc in a thread before every POST)
            self._session = aiohttp.ClientSession(connector=connector, headers=self._headers)
        return self._session

    async def _post(self, body: bytes, sent: int) -> bool:
        """POST one request body; retry transient failures within the timeout. True on a 2xx answer."""
        if len(body) > MAX_REQUEST_BYTES:
            log.warning("dropping span batch: %d bytes exceeds %d", len(body), MAX_REQUEST_BYTES)
            return False
        try:
            session = await self._open()
        except (OSError, ssl.SSLError) as exc:
            self._outcomes.failure(None, False, f"OTLP span export to {self._log_url}: TLS files unusable "
                                            f"({type(exc).__name__}); batch dropped")
            return False
        data = compress(body, self.settings.compression)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.settings.timeout_s
        backoff = Backoff(*RETRY_BACKOFF_S)
        while True:
            status: int | None = None
            retry_after: str | None = None
            remaining = deadline - loop.time()
            try:
                async with session.post(self.settings.endpoint, data=data, allow_redirects=False,
                                        **self._proxy,
                                        timeout=aiohttp.ClientTimeout(total=max(remaining, 0.001))) as resp:
                    status = resp.status
                    payload = await resp.read()
                    if 200 <= status < 300:
                        self.requests += 1
                        rejected = self._outcomes.success(payload, resp.headers.get("Content-Type", ""))
                        if rejected > 0:
                            self.rejected_spans += rejected
                            self._drop(rejected, DROP_REJECTED)
                        return True
                    retry_after = resp.headers.get("Retry-After")
            except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as exc:
                reason = "timeout" if isinstance(exc, asyncio.TimeoutError) else type(exc).__name__
                retryable = True
            else:
                reason = f"HTTP {status}"
                retryable = status in RETRYABLE_STATUSES
            delay = self._outcomes.retry_delay(status, retryable, reason, retry_after, backoff, deadline - loop.time())
            if delay is None:
                return False
            self.retries += 1
            await self._sleep(delay)
