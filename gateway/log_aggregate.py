"""Aggregate uvicorn's per-request warning lines (review R5-11).

uvicorn logs ``Invalid HTTP request received.`` (and ``Unsupported upgrade
request.``, ``Exceeded concurrency limit.``) once per request, without the
client's address: one client sending malformed requests added ~170 kB/s to
the gateway's log. :class:`RepeatedLineFilter`, installed on uvicorn's
``uvicorn.error`` logger by :func:`install`, lets the first such line of a
window through (with the source address of the connection being parsed) and
suppresses the others of that window; when the window ends it logs one
summary line per message: how many were suppressed and from which sources
(the ``max_sources`` most frequent, the rest counted together).

The source is the socket peer of the connection whose bytes are being parsed
when the line is logged, noted by the HTTP guard (gateway/http_guard.py) at
each socket read with :func:`note_peer` (one store, no allocation).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from collections.abc import Callable

__all__ = ["RepeatedLineFilter", "install", "note_peer", "AGGREGATED_MESSAGES", "DEFAULT_WINDOW_S"]

#: uvicorn's warning lines logged once per request (uvicorn 0.54, ``uvicorn.protocols.http``)
AGGREGATED_MESSAGES = frozenset({"Invalid HTTP request received.", "Unsupported upgrade request.",
                                 "Exceeded concurrency limit.",
                                 # after "Unsupported upgrade request." for every `Upgrade: websocket`
                                 # request (no WebSocket library installed; second review pass R5b-5)
                                 "No supported WebSocket library detected. Please use \"pip install "
                                 "'uvicorn[standard]'\", or install 'websockets' or 'wsproto' manually."})
DEFAULT_WINDOW_S = 10.0
_PEER: list[object] = [None]


def note_peer(peer: object) -> None:
    """Note the ``(host, port)`` peer of the connection being parsed (or None)."""
    _PEER[0] = peer


def _source() -> str:
    peer = _PEER[0]
    if isinstance(peer, tuple) and peer:
        return str(peer[0])
    return "unknown"


class _Window:
    __slots__ = ("end", "count", "sources", "scheduled")

    def __init__(self, end: float) -> None:
        self.end = end
        self.count = 0
        self.sources: Counter[str] = Counter()
        self.scheduled = False


class RepeatedLineFilter(logging.Filter):
    """A ``logging.Filter``: at most one line per ``window_s`` seconds for each of ``messages``.

    ``messages``: the exact ``record.msg`` strings aggregated (others pass
    untouched); ``window_s``: seconds, > 0; ``max_sources``: source addresses
    named in a summary (>= 1; at most ``4 x max_sources`` are tracked per window,
    the rest count as ``other``); ``clock``: monotonic seconds. The summary of a
    window goes out on the record's logger when the window ends (a timer on the
    running event loop), or, with no loop running, before the next line of that message.
    """

    def __init__(self, messages: frozenset[str] = AGGREGATED_MESSAGES, window_s: float = DEFAULT_WINDOW_S,
                 max_sources: int = 5, clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__()
        if window_s <= 0 or max_sources < 1:
            raise ValueError("window_s must be > 0 and max_sources >= 1")
        self.messages = messages
        self.window_s = window_s
        self.max_sources = max_sources
        self.clock = clock
        self._windows: dict[str, _Window] = {}

    def filter(self, record: logging.LogRecord) -> bool:  # noqa: A003 - logging API
        """True: log ``record`` (possibly rewritten to name its source); False: counted, not logged."""
        msg = record.msg
        if record.args or msg not in self.messages:
            return True
        now = self.clock()
        source = _source()
        window = self._windows.get(msg)  # type: ignore[call-overload]
        if window is not None and now < window.end:
            window.count += 1
            if source in window.sources or len(window.sources) < 4 * self.max_sources:
                window.sources[source] += 1
            else:
                window.sources["other"] += 1
            if not window.scheduled:
                window.scheduled = self._schedule(record.name, msg, window, now)  # type: ignore[arg-type]
            return False
        if window is not None and window.count and not window.scheduled:
            self._summarise(record.name, msg, window)  # type: ignore[arg-type]
        self._windows[msg] = _Window(now + self.window_s)  # type: ignore[index]
        record.msg = "%s (from %s; repeats summarised every %g s)"
        record.args = (msg, source, self.window_s)
        return True

    def _schedule(self, logger_name: str, msg: str, window: _Window, now: float) -> bool:
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return False
        loop.call_later(max(0.0, window.end - now), self._summarise, logger_name, msg, window)
        return True

    def _summarise(self, logger_name: str, msg: str, window: _Window) -> None:
        if not window.count:
            return
        top = window.sources.most_common(self.max_sources)
        rest = window.count - sum(n for _, n in top)
        named = ", ".join(f"{s} x{n}" for s, n in top) + (f", others x{rest}" if rest else "")
        count, window.count = window.count, 0
        window.sources = Counter()
        logging.getLogger(logger_name).warning("%s repeated %d more times in %g s (sources: %s)",
                                               msg.rstrip("."), count, self.window_s, named)


def install(logger_name: str = "uvicorn.error", **kw: object) -> RepeatedLineFilter:
    """Add one :class:`RepeatedLineFilter` to ``logger_name`` (idempotent: returns the one already there).

    ``kw``: arguments of :class:`RepeatedLineFilter` (used only when a new filter is added).
    """
    logger = logging.getLogger(logger_name)
    for existing in logger.filters:
        if isinstance(existing, RepeatedLineFilter):
            return existing
    added = RepeatedLineFilter(**kw)  # type: ignore[arg-type]
    logger.addFilter(added)
    return added
