"""Audit of the refusals the connection guard makes before any app runs (session 7, R6-4 follow-up).

The guarded listener (gateway/http_guard.py) answers some requests itself, before the ASGI app sees
them: 431 ``request_header_too_large`` / ``too_many_header_fields``, 408 ``header_timeout``, 503
``too_many_connections`` and uvicorn's own 400 for a head the parser refuses (``invalid_request``).
Until session 7 none of them was audited (uvicorn's 400 line went to stderr, aggregated by
gateway/log_aggregate.py). Body framing refusals (400 ``body_too_fragmented`` etc.) arrive while
the app runs the request and are audited with it (gateway/body_guard.py), so they are not here.

Each such refusal becomes one audit event (endpoint ``http_guard``, outcome ``rejected``, the status
and code, the peer address; never any byte of the request), at a bounded rate:

* per source first (R7b-3): a token bucket (:class:`tenancy.limits.TokenBucket`) per peer address
  of ``per_s / SOURCE_SHARE`` events per second, burst ``2 × per_s / SOURCE_SHARE`` (at least 1,
  so a source's first refusal is audited whenever the global bucket has a token), kept in a
  bounded LRU table (:data:`SOURCE_TABLE_MAX` sources, cachetools), so one noisy source cannot
  use up the listener's allowance and hide another source's refusals (e.g. a refused smuggling
  attempt); then
* per process: a token bucket of ``limits.protocol_refusal_audits_per_s`` events per second,
  burst twice that (it bounds the total when many sources refuse at once); refusals past either
  bucket are counted per source and code and reported by one ``prefixgate`` WARNING line per
  :data:`REPORT_EVERY_S` seconds naming the top :data:`REPORT_TOP` sources (``null``: no events);
* the events are ``rejected`` refusals, which the audit's flood aggregation (audit/summary.py)
  passes individually only ``first_n`` times per source and window and then sums up.

Wiring, one way: :func:`attach` puts a :class:`ProtocolRefusals` on the ASGI app object handed to
uvicorn (the protocol reads it as ``self.app``: uvicorn's ``config.loaded_app``), and every refusal
of the guard is audited with :func:`refused` on the protocol: :class:`RefusalAudit`, a base of the
guarded protocol classes, wraps the guard's refusal methods and uvicorn's ``send_400_response``;
the refusals made inline (too many header fields, gateway/http_guard.py; the heads
gateway/upgrade_guard.py refuses: ``Upgrade`` field, ``#`` in the target) call :func:`refused`
themselves. Cost: one method frame per accepted connection (``guard_admit_source``), nothing per
request or byte.
"""
from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

from cachetools import LRUCache

from gateway.record import RequestRecord, refusal_record
from tenancy.limits import TokenBucket

__all__ = ["ProtocolRefusals", "RefusalAudit", "attach", "attach_refusal_audit", "refusals_of", "refused", "ENDPOINT",
           "REPORT_EVERY_S"]

#: the audit event's endpoint for refusals made before any route
ENDPOINT = "http_guard"  # as the R7-1 upgrade refusals (branch s7-fix, gateway/upgrade_guard.py)
#: seconds between two WARNING lines about refusals not audited (over the rate)
REPORT_EVERY_S = 10.0
#: a source's bucket is this fraction (1/SOURCE_SHARE) of the listener's rate and burst
SOURCE_SHARE = 10.0
#: most sources with their own bucket (least recently refused dropped first: it starts full again)
SOURCE_TABLE_MAX = 4096
#: sources named in the WARNING line about refusals not audited; at most REPORT_KEYS_MAX counted
REPORT_TOP = 5
REPORT_KEYS_MAX = 1024
#: attribute of the ASGI app object holding its listener's :class:`ProtocolRefusals`
_ATTR = "prefixgate_protocol_refusals"

log = logging.getLogger("prefixgate")


class ProtocolRefusals:
    """Audits protocol-level refusals of one listener at most ``per_s`` per second (> 0, burst
    ``2 × per_s``, at least 1; ``None``: none audited), and per source (peer address) at most
    ``per_s / SOURCE_SHARE`` per second (burst ``2 × per_s / SOURCE_SHARE``, at least 1) before
    that. ``record``: hands a finished :class:`gateway.record.RequestRecord` to the audit
    (``AuditHub.record_request``); ``clock``: monotonic seconds. Use from the event loop's thread."""

    __slots__ = ("record", "bucket", "clock", "audited", "suppressed", "_unreported", "_reported_at",
                 "_src_rate", "_src_burst", "_sources", "_skipped")

    def __init__(self, record: Callable[[RequestRecord], None], per_s: float | None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if per_s is not None and not per_s > 0:
            raise ValueError("per_s must be > 0 or None")
        self.record = record
        self.clock = clock
        now = clock()
        self.bucket = TokenBucket(per_s, max(1.0, 2 * per_s), now) if per_s is not None else None
        self._src_rate = per_s / SOURCE_SHARE if per_s is not None else 0.0
        self._src_burst = max(1.0, 2 * self._src_rate)
        self._sources: LRUCache[str | None, TokenBucket] = LRUCache(maxsize=SOURCE_TABLE_MAX)
        #: refusals not audited since the last WARNING, by (source, status, code); bounded
        self._skipped: Counter[tuple[str | None, int, str]] = Counter()
        self.audited = 0
        self.suppressed = 0
        self._unreported = 0
        self._reported_at = now

    def _admit(self, host: str | None, now: float) -> bool:
        """Take a token from ``host``'s bucket, then from the listener's; False when either is empty."""
        if self.bucket is None:
            return False
        src = self._sources.get(host)
        if src is None:
            src = TokenBucket(self._src_rate, self._src_burst, now)
            self._sources[host] = src
        if src.try_take(1, now) > 0:
            return False
        return self.bucket.try_take(1, now) <= 0

    def note(self, client: Any, status: int, code: str) -> None:
        """One refusal ``status`` / ``code`` to ``client`` (uvicorn's ``(host, port)`` or None).
        Never raises (a failing audit must not break the connection handling)."""
        try:
            now = self.clock()
            host = client[0] if isinstance(client, tuple) and client else None
            host = str(host) if host is not None else None
            if not self._admit(host, now):
                self._skip(host, status, code, now)
                return
            self.record(refusal_record(ENDPOINT, host, status, "rejected", code))
            self.audited += 1
        except Exception:  # a bug or a closed audit: the refusal itself stands
            log.exception("auditing a protocol-level refusal failed")

    def _skip(self, host: str | None, status: int, code: str, now: float) -> None:
        self.suppressed += 1
        self._unreported += 1
        key = (host, status, code)
        if key in self._skipped or len(self._skipped) < REPORT_KEYS_MAX:
            self._skipped[key] += 1
        else:
            self._skipped[(None, 0, "other")] += 1
        if now - self._reported_at >= REPORT_EVERY_S:
            by_src: Counter[str | None] = Counter()
            for (h, _st, _c), n in self._skipped.items():
                by_src[h] += n
            top = []
            for h, n in by_src.most_common(REPORT_TOP):
                codes = ",".join(f"{st} {c}={k}" for (hh, st, c), k in self._skipped.most_common() if hh == h)
                top.append(f"{h or '?'}: {n} ({codes})")
            log.warning("%d protocol-level refusals not audited in the last %.0f s from %d sources "
                        "(over limits.protocol_refusal_audits_per_s, per source or per listener); top: %s",
                        self._unreported, now - self._reported_at, len(by_src), "; ".join(top))
            self._unreported, self._reported_at = 0, now
            self._skipped.clear()


def attach(app: Any, refusals: ProtocolRefusals) -> Any:
    """Give the ASGI ``app`` (the object handed to uvicorn) its listener's ``refusals``; returns ``app``."""
    setattr(app, _ATTR, refusals)
    return app


def attach_refusal_audit(c: Any, app: Any) -> Any:
    """Attach to ``app`` (a listener's ASGI app) a :class:`ProtocolRefusals` auditing through the
    gateway ``c``'s audit hub at ``c.config.limits.protocol_refusal_audits_per_s``; returns ``app``."""
    return attach(app, ProtocolRefusals(c.audit.record_request, c.config.limits.protocol_refusal_audits_per_s))


def refusals_of(app: Any) -> ProtocolRefusals | None:
    """The :class:`ProtocolRefusals` attached to ``app`` (:func:`attach`), or None."""
    return getattr(app, _ATTR, None)


def refused(protocol: Any, status: int, code: str) -> None:
    """The guard refused a request on ``protocol`` (a uvicorn HTTP protocol: ``app``, ``client``)
    with ``status`` / ``code``: audit it when its app has :class:`ProtocolRefusals` attached."""
    refusals = refusals_of(getattr(protocol, "app", None))
    if refusals is not None:
        refusals.note(getattr(protocol, "client", None), status, code)


class RefusalAudit:
    """Mixin, first base of a guarded uvicorn protocol class (gateway/http_guard.py): audits the
    guard's own refusals (:func:`refused`) around the methods that make them."""

    def guard_admit_source(self, transport: Any) -> bool:
        """As the guard's; a connection refused for its source's count is audited (503)."""
        admitted: bool = super().guard_admit_source(transport)  # type: ignore[misc]
        if not admitted:
            refused(self, 503, "too_many_connections")
        return admitted

    def guard_timed_out(self) -> None:
        """As the guard's; a head that timed out after some bytes (answered 408) is audited."""
        transport = getattr(self, "transport", None)
        open_before = transport is not None and not transport.is_closing()
        super().guard_timed_out()  # type: ignore[misc]
        if open_before and transport.is_closing() and getattr(self, "guard_head_bytes", 0):
            refused(self, 408, "header_timeout")

    def guard_refuse_too_large(self) -> None:
        """As the guard's; the refusal (431, or a close behind a response in progress) is audited."""
        transport = getattr(self, "transport", None)
        open_before = transport is not None and not transport.is_closing()
        super().guard_refuse_too_large()  # type: ignore[misc]
        if open_before:
            refused(self, 431, "request_header_too_large")

    def send_400_response(self, msg: str) -> None:
        """uvicorn's answer to a request its parser refused: audited as 400 ``invalid_request``
        (not when the guard already answered and is closing: a parser stop it caused, R7b-2)."""
        transport = getattr(self, "transport", None)
        if transport is None or not transport.is_closing():
            refused(self, 400, "invalid_request")
        super().send_400_response(msg)  # type: ignore[misc]
