"""The last step of every request: its metrics and its one audit event.

Ending a request may wait until the answer is sent (issue 14): while a
request is served by :class:`gateway.inference_asgi.InferenceRoutes`,
:data:`AFTER_SEND` holds a list in that request's task context;
:func:`after_send` appends work to it (the pipeline's end of a plain answer)
and :meth:`Recorder.record` queues the request's audit event at once and
appends its metrics and concentration observation (:meth:`Recorder.finish`).
Just before the answer's last body part the front runs the work deferred so
far (so a plain answer's end has produced its record) and hands the queued
audit events to the audit worker (:meth:`Recorder.hand_off`); the rest runs
right after that part was handed to the server, with no await in between
(issue 16: an answer that completed at the client has its event in the
worker's pipe, which outlives a SIGKILLed gateway). Everywhere else the work
runs at once.
"""

from __future__ import annotations

from collections.abc import Callable
from contextvars import ContextVar

from gateway.auditing import AuditHub
from gateway.metrics import GatewayMetrics
from gateway.record import RequestRecord

__all__ = ["AFTER_SEND", "Recorder", "after_send"]

#: Work of the current request to run once its answer is sent (``None``: run it at once).
AFTER_SEND: ContextVar[list[Callable[[], None]] | None] = ContextVar("prefixgate_after_send", default=None)


def after_send(work: Callable[[], None]) -> bool:
    """Defer ``work`` until the current request's answer is sent: True when deferred, False when
    no front defers (the caller runs it now)."""
    pending = AFTER_SEND.get()
    if pending is None:
        return False
    pending.append(work)
    return True


class Recorder:
    """Turns a finished :class:`RequestRecord` into metrics and one audit event."""

    def __init__(self, metrics: GatewayMetrics, audit: AuditHub) -> None:
        self.metrics = metrics
        self.audit = audit

    def record(self, rec: RequestRecord) -> None:
        """Metrics + one audit event + concentration monitor for a finished request
        (the event queued now, the rest deferred to after the answer when :data:`AFTER_SEND`
        holds a list)."""
        self.audit.emit_request(rec)
        if after_send(lambda: self.finish(rec)):
            return
        self.finish(rec)

    def hand_off(self) -> None:
        """Write the queued audit events to the audit worker's pipe now (one write)."""
        self.audit.hand_off()

    def finish(self, rec: RequestRecord) -> None:
        """The request's metrics and concentration observation (after its audit event)."""
        m = self.metrics
        m.requests.labels(rec.endpoint, str(rec.status), rec.outcome).inc()
        m.request_seconds.labels(rec.endpoint).observe((rec.t_end or rec.t0) - rec.t0)
        if rec.tenant_id:
            m.tenant_requests.labels(rec.tenant_id, rec.outcome).inc()
        if rec.replica and rec.t_first_byte is not None:
            m.first_byte_seconds.labels(rec.endpoint).observe(rec.t_first_byte - rec.t0)
            m.replica_requests.labels(rec.replica, rec.pool or "").inc()
            m.prompt_tokens.inc(rec.prompt_tokens or 0)
            m.prefix_tokens.labels("available").inc(rec.available_prefix_tokens or 0)
            m.prefix_tokens.labels("predicted").inc(rec.predicted_prefix_tokens or 0)
            if rec.delivered_prefix_tokens is not None:
                m.prefix_tokens.labels("delivered").inc(rec.delivered_prefix_tokens)
        self.audit.observe_request(rec)
