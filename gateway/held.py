"""What one request holds until its one exit path gives it back (:class:`Held`)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from gateway.cpu_budget import NO_METER, CpuMeter
from gateway.overload import OverloadGuard
from gateway.proxy import UpstreamFailure, UpstreamStream
from gateway.replicas import Attempt
from routing.load import LoadTicket
from routing.types import RouteChoice
from tenancy.ledger import Reservation
from tenancy.limits import Lease
from tenancy.shared_limiter import SharedLease

if TYPE_CHECKING:
    from gateway.upstream import Upstream

__all__ = ["Held"]

log = logging.getLogger("prefixgate")


class Held:
    """What one request holds until it ends, and the verdicts it owes.

    ``lease``: the tenant's concurrency slot; ``ticket``: the router's load
    ticket of the current attempt; ``attempt``: its circuit-breaker attempt;
    ``up``: the open upstream response; ``choice``/``usage``: for the record;
    ``reservation``: the token ledger's reservation, settled by the exit
    path from ``usage``, ``progress`` (``none``: no replica reached yet;
    ``unknown``: sent, outcome unknown; ``refused``: a replica answered an
    error status; ``streamed``: an SSE answer started) and ``relayed``
    (output tokens relayed).
    :meth:`end_attempt` gives back the current attempt's share (closing the
    upstream, finishing the ticket, releasing a breaker attempt that has no
    verdict), :meth:`release` that and the lease. Both are idempotent; the
    request's one exit path (``InferencePipeline._end``) calls them.
    ``handed_off``: a streaming answer owns the ending; ``started``: its body
    began; ``ended``: the request was ended; ``tenant``: the tenant whose
    in-flight count (gateway/overload.py) the request holds, once counted;
    ``left``: its in-flight counts were given back (a refusal gives them back at
    once, before its answer waits for an unread body to drain: review R3-1); ``cpu``: the
    request's preparation CPU meter (gateway/cpu_budget.py; a refusal charges it, :meth:`release` settles it);
    ``prep``: the routed request's work that waits for the replica wait (issue 14, session 10), run
    once by :meth:`run_prep`; ``served``: a plain answer was whole and valid: :meth:`end_attempt` gives
    the attempt its success verdict (after the answer's last byte, session 10) instead of releasing it;
    ``answered``: a plain answer's :meth:`gateway.upstream.Upstream.answered` (the replica's instance id), run
    by the request's end with the giving back (session 11); ``queue_wait_s``: flow control's release's
    queue wait (seconds), for its metric (observed while the replica works); ``drop_cached``: the
    answer's ``usage.prompt_tokens_details.cached_tokens`` is not relayed to the client (the tenant's
    ``usage_cached_tokens``, review R12-1: gateway/usage_privacy.py; True until the tenant is known);
    ``decided``: ``(policy generation, identity, candidates)`` of the request's decision, the generation
    read before its tenant was resolved (session 17, S17-6; session 18: an attempt whose decision is
    older than a policy or registry change is authorized again before its upstream write and this is
    replaced, gateway/pep_recheck.py).
    """

    __slots__ = ("lease", "ticket", "attempt", "up", "choice", "usage", "handed_off", "started", "ended",
                 "reservation", "progress", "relayed", "tenant", "left", "cpu", "prep", "served", "answered",
                 "queue_wait_s", "drop_cached", "decided")

    def __init__(self) -> None:
        self.lease: Lease | SharedLease | None = None
        self.ticket: LoadTicket | None = None
        self.attempt: Attempt | None = None
        self.up: UpstreamStream | None = None
        self.choice: RouteChoice | None = None
        self.usage: dict[str, Any] | None = None
        self.handed_off = False
        self.started = False
        self.ended = False
        self.reservation: Reservation | None = None
        self.progress = "none"
        self.relayed = 0
        self.tenant: str | None = None
        self.left = False
        self.cpu: CpuMeter = NO_METER
        self.prep: Callable[[], None] | None = None
        self.served = False
        self.answered: Callable[[], None] | None = None
        self.queue_wait_s: float | None = None
        self.drop_cached = True
        self.decided: tuple[int, Any, Any] | None = None

    def run_prep(self) -> None:
        """Run :attr:`prep` if it has not run (idempotent; an event loop callback or the request's end)."""
        prep, self.prep = self.prep, None
        if prep is not None:
            prep()

    def run_prep_logged(self, request_id: str) -> None:
        """:meth:`run_prep`; an exception it raises (a bug) is logged with ``request_id`` and not raised: the
        request goes on (answered, recorded). Session 31: the pipeline's call right after the upstream write."""
        try:
            self.run_prep()
        except Exception:  # a bug: never lose the audit record nor what the request holds
            log.exception("preparing the record of request %s failed", request_id)

    def leave(self, guard: OverloadGuard) -> None:
        """Give back the request's in-flight counts to ``guard`` (once; idempotent)."""
        if not self.left:
            self.left = True
            guard.leave(self.tenant)

    def failed(self, fail: UpstreamFailure, progress: str, upstream: Upstream) -> None:
        """The current attempt failed before the first byte (``fail``): :attr:`progress` as the token ledger
        must see it (``progress``, as before the attempt, when no connection was made: it cost nothing;
        ``refused`` when the replica answered an error status: no output; else as set for the attempt), and
        the attempt's circuit-breaker verdict (:meth:`gateway.upstream.Upstream.failed`)."""
        if not fail.reached:
            self.progress = progress
        elif fail.kind == "status":
            self.progress = "refused"
        upstream.failed(self.attempt, fail)  # type: ignore[arg-type]  # set before every attempt's await

    def not_written(self, progress: str) -> bool:
        """The current attempt's request was never written (session 19, S19-RC6: a policy or registry
        change while it waited for an upstream connection, :class:`gateway.upstream_pool.NotWritten`; the
        connection went back to the pool unused): as if the attempt had not been made, its breaker attempt
        is released without a verdict (no failure counted against the replica, a half-open probe slot freed)
        and :attr:`progress` is ``progress`` again (as before the attempt). Its load ticket is kept: the
        attempt is decided again with its choice (gateway/pep_recheck.py). Returns True (the caller's flag)."""
        self.progress = progress
        attempt, self.attempt = self.attempt, None
        if attempt is not None:
            attempt.release()
        return True

    def released(self, pending: Any, rec: Any) -> None:
        """Flow control's release of the request into this and ``rec`` (its record): ``pending``, a
        :class:`gateway.flow_waiting.PendingRelease` committed now (its load ticket, queue wait, virtual
        tokens; session 30) or a ``Release`` already charged; None: nothing. Returns None (the caller's new
        ``pending``)."""
        if pending is not None:
            _, self.ticket, rec.queue_wait_ms, rec.virtual_tokens = pending.commit().as_record()
            self.queue_wait_s = pending.queue_wait_s  # its metric: while the replica works (_prepare)

    def end_attempt(self) -> None:
        """Close the upstream response, finish the load ticket, give the breaker attempt its verdict
        (success when :attr:`served`, else a release: no verdict)."""
        up, self.up = self.up, None
        try:
            if up is not None:
                up.close()
        finally:
            try:
                if self.ticket is not None:
                    self.ticket.finish()
            finally:
                if self.attempt is not None:
                    if self.served:
                        self.attempt.succeeded()
                    else:
                        self.attempt.release()

    def release(self) -> None:
        """:meth:`end_attempt`, then free the tenant's concurrency slot, then settle the preparation CPU
        (:meth:`CpuMeter.settle`: all of it when no replica was reached, R6-2; beyond the allowance else). The
        allowance counts the prompt tokens the tenant paid: the reservation's, or the settlement's when it charged
        fewer (a replica's ``usage`` below the gateway's count: session 21, S21-review-2)."""
        try:
            self.end_attempt()
        finally:
            try:
                if self.lease is not None:
                    self.lease.release()
            finally:
                res, paid = self.reservation, 0
                if res is not None:
                    paid, settled = res.prompt_tokens, res.settlement
                    if settled is not None and settled.charged_prompt < paid:  # S21-review-2
                        paid = settled.charged_prompt
                self.cpu.settle(self.progress != "none", paid)
