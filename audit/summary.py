"""Flood aggregation: per-source, per-tenant, per-window summaries of noisy outcomes.

A credential-stuffing client or a broken integration can send thousands of
unauthenticated / rejected / denied (403) requests per second; writing one audit event for
each would let an attacker fill the audit pipeline (and make the gateway fail
closed). :class:`SummaryAggregator` lets the first ``first_n`` such events of
a key per window through individually and counts the rest; when the window
closes it yields one ``kind="summary"`` event per key that had suppressed
events. The key is (source address, tenant, SPIFFE ID): one tenant's refusals
from a shared address (NAT, shared node) never use up another tenant's (or
the unauthenticated requests') ``first_n`` (R4-3), and each summary names its
tenant (``"unauthenticated"`` when none), its identity and its counts per
HTTP status and reason code. Events of the endpoints in ``summarized_endpoints``
(default: ``/v1/models``, a read that costs no tokens) are aggregated whatever their
outcome, so a listing flood is summarised too (R5-4). Refusals whose reason code is in ``summary_only_codes``
(default: the gateway's per-source block, ``too_many_unauthenticated``) are
never written individually: they exist only as the count in their source's
summary, one event per source per window (issue 12, finding 1).
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from audit.event import AuditEvent, Identity, Kind, Outcome, PolicyInfo, iso_ms

#: Outcomes that are aggregated (others always pass through). ``denied`` since session 6 (review R6-4):
#: a 403 (``not_an_operator`` on the admin listener for any workload's admin-audience token,
#: ``unknown_workload`` for an unmapped workload, a policy denial) needs no tenant and hits no rate limit,
#: so one client wrote 22.6 MB of audit in 12 s, one event per request.
DEFAULT_AGGREGATED = frozenset({Outcome.UNAUTHENTICATED, Outcome.REJECTED, Outcome.RATE_LIMITED, Outcome.DENIED})
#: ``policy.reason_code`` values that are only ever counted, never passed individually
#: (the gateway's 429 to a source that spent its budget of failed signature checks).
DEFAULT_SUMMARY_ONLY = frozenset({"too_many_unauthenticated"})
#: ``endpoint`` values whose events are aggregated whatever their outcome: reads that cost no
#: tokens and change nothing, so a flood of successful ones is summarised like refusals (R5-4:
#: the gateway's ``GET /v1/models``, :data:`gateway.listing.MODELS_ENDPOINT`).
DEFAULT_SUMMARIZED_ENDPOINTS = frozenset({"/v1/models"})
# A failed operator change (``kind=operator``, outcome ``failed``; session 21, S21-newcomer-3) is
# aggregated too, whatever ``outcomes`` says: an operator token hammering a failing admin route
# must not grow the audit without bound (its key: the operator's SPIFFE ID, no source, no tenant).
# Module constants: an enum member looked up on its class costs ~0.1 us per offer() on Python 3.11.
_OPERATOR, _FAILED = Kind.OPERATOR, Outcome.FAILED
OTHER_SOURCE = "*other*"
#: ``summary.tenant`` of a summary of requests without a tenant (no or no valid credential)
NO_TENANT = "unauthenticated"
#: aggregation key: (source address, tenant or None, SPIFFE ID or None)
#: keys each tenant may open beyond a full ``max_sources`` table (s5, review R4b-2): a tenant that
#: fills the table with its own sources or SPIFFE IDs leaves every other tenant's first keys intact
RESERVED_KEYS_PER_TENANT = 16
_Key = tuple[str, "str | None", "str | None"]


@dataclass
class _Window:
    start_ms: int
    seen: int = 0
    suppressed: Counter[str] = field(default_factory=Counter)
    endpoints: Counter[str] = field(default_factory=Counter)
    codes: Counter[str] = field(default_factory=Counter)
    statuses: Counter[int] = field(default_factory=Counter)
    reasons: Counter[str] = field(default_factory=Counter)
    trust_domain: str | None = None


class SummaryAggregator:
    """Per-(source, tenant, identity) windowed aggregation of flood outcomes.

    Args:
        window_s: window length in seconds (windows are aligned per key to
            its first event).
        first_n: events per key and window passed through individually.
        max_sources: keys (source, tenant, SPIFFE ID) tracked at once; further
            keys share the source ``"*other*"`` per tenant, without identity
            (bounded memory under many-source floods: at most ``max_sources`` +
            ``reserved_per_tenant`` + 1 per tenant + one unauthenticated bucket;
            tenants come from the registry, never from the client).
        reserved_per_tenant: keys a tenant may still open once ``max_sources``
            keys are open, while it holds fewer (s5, R4b-2: one tenant with
            10,000 SPIFFE IDs no longer strips other tenants' keys of source and
            identity); not for requests without a tenant.
        outcomes: outcomes subject to aggregation.
        summary_only_codes: reason codes (``policy.reason_code``) of events
            that are always counted, never passed individually (they do not
            use up ``first_n``); the summary holds ``count_<code>`` for them.
        summarized_endpoints: ``endpoint`` values whose events are aggregated
            whatever their outcome (successful listings: ``count_allowed``).

    The source is the event's ``client_address`` (or ``"unknown"``); tenant and
    SPIFFE ID are the event's (set by the gateway only once verified).
    """

    def __init__(
        self,
        window_s: float = 10.0,
        first_n: int = 5,
        max_sources: int = 10_000,
        outcomes: frozenset[Outcome] = DEFAULT_AGGREGATED,
        summary_only_codes: frozenset[str] = DEFAULT_SUMMARY_ONLY,
        reserved_per_tenant: int = RESERVED_KEYS_PER_TENANT,
        summarized_endpoints: frozenset[str] = DEFAULT_SUMMARIZED_ENDPOINTS,
    ) -> None:
        if window_s <= 0 or first_n < 0 or max_sources < 1 or reserved_per_tenant < 0:
            raise ValueError("window_s > 0, first_n >= 0, max_sources >= 1, reserved_per_tenant >= 0 required")
        self._window_ms = int(window_s * 1000)
        self._first_n = first_n
        self._max_sources = max_sources
        self._outcomes = outcomes
        self._summary_only = summary_only_codes
        self._endpoints = summarized_endpoints
        self._windows: dict[_Key, _Window] = {}
        self._reserved = reserved_per_tenant
        self._tenant_keys: Counter[str | None] = Counter()  # open keys per tenant
        # windows that ended and were replaced by a newer one of their key before a flush
        # (a late periodic flusher under CPU load): summarized by the next flush, never dropped
        self._closed: list[tuple[_Key, _Window]] = []

    @property
    def window_s(self) -> float:
        """Window length in seconds."""
        return self._window_ms / 1000

    @property
    def open_windows(self) -> int:
        """Keys with an open window (bounded: see ``max_sources``)."""
        return len(self._windows)

    def offer(self, event: AuditEvent) -> AuditEvent | None:
        """Return ``event`` if it should be emitted now, ``None`` if counted
        into its key's summary. Uses ``event.time_ms`` as the clock."""
        if event.outcome not in self._outcomes and event.endpoint not in self._endpoints and (
                event.kind is not _OPERATOR or event.outcome is not _FAILED):
            return event
        key: _Key = (event.client_address or "unknown", event.tenant, event.identity.spiffe_id)
        if key not in self._windows and len(self._windows) >= self._max_sources and (
                event.tenant is None or self._tenant_keys[event.tenant] >= self._reserved):
            key = (OTHER_SOURCE, event.tenant, None)
        win = self._windows.get(key)
        if win is None:
            self._tenant_keys[event.tenant] += 1
        if win is None or event.time_ms - win.start_ms >= self._window_ms:
            if win is not None and (win.suppressed or win.codes):
                self._closed.append((key, win))
            win = self._windows[key] = _Window(start_ms=event.time_ms, trust_domain=event.identity.trust_domain)
        code = event.policy.reason_code if event.policy is not None else None
        if code is not None and code in self._summary_only:
            win.codes[code] += 1
        else:
            win.seen += 1
            if win.seen <= self._first_n:
                return event
        win.suppressed[event.outcome.value] += 1
        if event.endpoint:
            win.endpoints[event.endpoint] += 1
        if event.status_code is not None:
            win.statuses[event.status_code] += 1
        reason = code or event.error_code
        if reason:
            win.reasons[reason] += 1
        return None

    def flush(self, now_ms: int, force: bool = False) -> list[AuditEvent]:
        """Summary events for windows that ended by ``now_ms`` (epoch ms), or
        for all open windows when ``force`` (shutdown), and for every window that ended
        and was replaced by a newer one of its source since the last flush (so a late flush
        loses no count). Summarized windows are forgotten."""
        ended, self._closed = self._closed, []
        for key in list(self._windows):
            win = self._windows[key]
            if not force and now_ms - win.start_ms < self._window_ms:
                continue
            del self._windows[key]
            self._tenant_keys[key[1]] -= 1
            if not self._tenant_keys[key[1]]:
                del self._tenant_keys[key[1]]
            ended.append((key, win))
        return [ev for key, win in ended if (ev := self._summary(key, win, now_ms)) is not None]

    def _summary(self, key: _Key, win: _Window, now_ms: int) -> AuditEvent | None:
        """The summary event of one ended window, ``None`` when it suppressed nothing.

        ``summary``: ``source``, ``tenant`` (``"unauthenticated"`` when none), ``spiffe_id``
        (when one), ``window_start``, ``window_s``, ``emitted_individually``, ``suppressed``,
        ``count_<outcome>``, ``count_status_<http status>``, ``count_code_<reason code>``,
        ``count_<summary-only code>``, ``top_endpoint``; the event's ``tenant``, ``identity``
        and ``client_address`` are the key's."""
        total = sum(win.suppressed.values())
        if not total:
            return None
        source, tenant, spiffe_id = key
        details: dict[str, object] = {
            "source": source,
            "tenant": tenant or NO_TENANT,
            "window_start": iso_ms(win.start_ms),
            "window_s": self._window_ms / 1000,
            "emitted_individually": min(win.seen, self._first_n),
            "suppressed": total,
        }
        for outcome, n in win.suppressed.items():
            details[f"count_{outcome}"] = n
        for code, n in win.codes.items():
            details[f"count_{code}"] = n
        for status, n in win.statuses.items():
            details[f"count_status_{status}"] = n
        for reason, n in win.reasons.items():
            details[f"count_code_{reason}"] = n
        if spiffe_id is not None:
            details["spiffe_id"] = spiffe_id
        if win.endpoints:
            details["top_endpoint"] = win.endpoints.most_common(1)[0][0]
        return AuditEvent(
            kind=Kind.SUMMARY,
            outcome=Outcome.SUMMARIZED,
            time_ms=now_ms,
            client_address=None if source == OTHER_SOURCE else source,
            tenant=tenant,
            identity=Identity(spiffe_id, win.trust_domain) if spiffe_id is not None else Identity(),
            summary=details,
        )


#: ``policy.reason_code`` of the gateway's fail-closed refusal (503 while the
#: audit trail does not accept events).
AUDIT_UNAVAILABLE_CODE = "audit_unavailable"


class RefusalCounter:
    """Counts the gateway's own fail-closed refusals per source instead of
    writing one event each (each would grow the backlog that caused them, and
    a client retrying in a loop would push the audit trail past its headroom).

    :meth:`flush` returns one ``kind="summary"`` event per source
    (``summary.reason = "audit_unavailable"``, ``suppressed`` = count, first
    and last refusal time); at most ``max_sources`` sources are tracked, the
    rest share ``"*other*"``.
    """

    def __init__(self, max_sources: int = 10_000) -> None:
        self.max_sources = max_sources
        self._refused: dict[str, list[int]] = {}

    def count(self, event: AuditEvent) -> None:
        """Count one refusal event (by ``client_address``)."""
        source = event.client_address or "unknown"
        if source not in self._refused and len(self._refused) >= self.max_sources:
            source = OTHER_SOURCE
        entry = self._refused.setdefault(source, [0, event.time_ms, event.time_ms])
        entry[0] += 1
        entry[2] = event.time_ms

    def flush(self) -> list[AuditEvent]:
        """Summary events of everything counted so far (and reset)."""
        refused, self._refused = self._refused, {}
        return [AuditEvent(
            kind=Kind.SUMMARY, outcome=Outcome.SUMMARIZED,
            client_address=None if source == OTHER_SOURCE else source,
            status_code=503, policy=PolicyInfo(None, AUDIT_UNAVAILABLE_CODE, None),
            summary={"reason": AUDIT_UNAVAILABLE_CODE, "source": source, "suppressed": count,
                     "count_failed": count, "first_refused": iso_ms(first), "last_refused": iso_ms(last)},
        ) for source, (count, first, last) in refused.items()]
