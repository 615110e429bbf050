"""Stop reading bytes that can only be dropped while an answer is in progress (review R9-1).

Bytes a client sends behind a request whose answer is still in progress are *dropped* by the guard
in three cases: after a ``Connection: close`` request (RFC 9112 section 9.6: nothing after it is a
request); behind a pipelined head refused while the answer is in progress (gateway/upgrade_guard.py:
its 400 is deferred until that answer is complete, R7b-2/S8-E2); and, under httptools, after a
``close`` request (uvicorn makes llhttp ignore such bytes, ``lenient_data_after_close``). Before R9-1
the gateway kept reading the socket at line rate and discarding for as long as the answer lasted
(minutes for a slowly read stream): the reviewer measured 14-21 GB swallowed in 5-8 s at ~30 % of
the event loop's core, nothing bounded, audited or charged.

Now reading stops instead (:meth:`gateway.lingering.LingeringTransport.hold_reading`, the way uvicorn
pauses for a pipelined request): the bytes stay in the kernel's buffers and the client's send blocks;
the answer in progress completes for a client that reads it; the connection's close then *lingers*
(half-close, discard, bounded by ``limits.lingering_close_bytes`` / ``lingering_close_s``) so the
answer is not lost to a reset. The hooks:

- h11, ``MUST_CLOSE``: ``GuardedH11Protocol.guard_parse`` (gateway/http_guard.py) holds;
- a deferred refusal: ``UpgradeGuard.guard_refuse_head`` holds at once, ``UpgradeGuard.data_received``
  again after a flow-control resume, and ``_HeadGuard.guard_feed`` drops the rest of the read it is in;
- httptools after a ``close`` request: :class:`DropGuard` (its bytes count as head bytes until
  ``max_header_bytes``; then, instead of closing and cutting the answer in progress, reading stops).

Nothing of this runs on the normal path (no request is followed by dropped bytes). A held connection
notices its client's disconnect only when the answer is written (as uvicorn's pipelining pause).
"""

from __future__ import annotations

__all__ = ["DropGuard"]


class DropGuard:
    """Mixin over the guarded uvicorn protocols of gateway/http_guard.py, before ``_HeadGuard``.

    Reads uvicorn's ``cycle`` (the request being answered) and its public ``keep_alive`` and
    ``response_complete`` attributes; the transport is the guard's
    :class:`gateway.lingering.LingeringTransport`.
    """

    def guard_refuse_too_large(self) -> None:
        """A head past ``max_header_bytes``: bytes behind a request whose connection closes after its
        answer (``keep_alive`` false, e.g. ``Connection: close``) while that answer is in progress are
        never a head: stop reading (R9-1) rather than refuse them (which closed the connection and cut
        the answer). Otherwise the guard's refusal (431, or a close behind an answer in progress)."""
        cycle = self.cycle  # type: ignore[attr-defined]
        if cycle is not None and not cycle.response_complete and not cycle.keep_alive:
            self.guard_cancel_timer()  # type: ignore[attr-defined]
            self.transport.hold_reading()  # type: ignore[attr-defined]
            return
        super().guard_refuse_too_large()  # type: ignore[misc]
