"""The one retry delay schedule of the audit pipeline: doubling, capped.

Every loop that retries something after a failure (a sink batch in
:mod:`audit.log`, the audit worker restart in :mod:`audit.remote`, the
span-exporter child restart in :mod:`audit.span_export`, the syslog reconnect
in :mod:`audit.syslog`, the OTLP/HTTP span export in
:mod:`audit.span_exporter_proc`) takes its delays from a :class:`Backoff`.
The loops differ in how they wait (``asyncio.sleep``, a thread's deadline, a
blocking sleep), so the helper only computes delays and never sleeps; a
retry library's decorator (``tenacity``, ``backoff``) wraps one call and fits
none of these loops, which keep state across attempts.
"""

from __future__ import annotations

__all__ = ["Backoff"]


class Backoff:
    """Delays ``initial_s, 2*initial_s, 4*initial_s, ...``, each after the first capped at ``max_s`` (seconds).

    :meth:`next` returns the delay to wait now and doubles the following one;
    :meth:`reset` starts over after a success. The first delay is
    ``initial_s`` even when it exceeds ``max_s``. Raises :class:`ValueError`
    when either is negative. Not thread-safe: one loop owns an instance.
    """

    __slots__ = ("initial_s", "max_s", "_next")

    def __init__(self, initial_s: float, max_s: float) -> None:
        if initial_s < 0 or max_s < 0:
            raise ValueError("backoff delays must be >= 0")
        self.initial_s = float(initial_s)
        self.max_s = float(max_s)
        self._next = self.initial_s

    def next(self) -> float:
        """The delay to wait before the next attempt, in seconds; doubles the one after."""
        delay = self._next
        self._next = min(delay * 2, self.max_s)
        return delay

    def reset(self) -> None:
        """Start over at ``initial_s`` (after a success or a long healthy run)."""
        self._next = self.initial_s
