"""A process-wide budget of request-body bytes being read by the app (review R5-3).

The app accumulates a request body in memory until it is complete (up to
``limits.max_body_bytes``); a client that sends all but the last byte and then
waits is answered 408 only after ``limits.body_read_timeout_s``, having pinned
that memory (250 such 1 MiB bodies from one tenant: +243 MiB RSS, nothing
charged). :class:`BodyBudget` bounds the bytes of bodies being read, across
both listeners of one gateway process, to ``limits.max_buffered_body_bytes``,
and the share of one owner to ``limits.max_buffered_body_bytes_per_tenant``: the request's
tenant once authentication resolved it (the pipeline names it in the scope under
:data:`OWNER_SCOPE_KEY` before reading the body), else its source address (the socket
peer). Per tenant, not per address (second review pass, R5b-1): behind NAT or a proxy that
hides client addresses every tenant shares one address, and one tenant's held bodies
refused the others'. The framing guard
(gateway/framing.py) takes each body part the app reads from it and gives a
body's bytes back once the body is complete or the request ends; a part that
does not fit is refused **503** ``body_budget_exhausted`` (``Retry-After``,
``Connection: close``). Bodies drained and discarded (before an early answer)
are not counted: they are not held.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["BodyBudget", "OWNER_SCOPE_KEY", "owner_of"]

#: ASGI scope key under which the pipeline names the request's tenant before reading its body
OWNER_SCOPE_KEY = "prefixgate.body_owner"


def owner_of(scope: Mapping[str, Any], source: str) -> str:
    """The budget share a body part of this request is taken from: ``tenant:<id>`` once the
    pipeline named the tenant in ``scope``, else ``source:<address>``."""
    tenant = scope.get(OWNER_SCOPE_KEY)
    return f"tenant:{tenant}" if tenant is not None else f"source:{source}"


class BodyBudget:
    """Bytes held per source and in total, with ceilings.

    ``total_bytes``: ceiling of all held bytes (>= 1); ``share_bytes``:
    ceiling of one owner's held bytes (1 <= share_bytes <= total_bytes); an owner is
    a string from :func:`owner_of`.
    Raises :class:`ValueError` otherwise. Not thread-safe (one event loop).
    """

    __slots__ = ("total_bytes", "share_bytes", "held", "_by_owner")

    def __init__(self, total_bytes: int, share_bytes: int) -> None:
        if total_bytes < 1 or not 1 <= share_bytes <= total_bytes:
            raise ValueError("need total_bytes >= 1 and 1 <= share_bytes <= total_bytes")
        self.total_bytes = total_bytes
        self.share_bytes = share_bytes
        self.held = 0
        self._by_owner: dict[str, int] = {}

    def take(self, source: str, n: int) -> bool:
        """Hold ``n`` more bytes (>= 0) for ``source``; False (nothing held) if either ceiling would be passed."""
        mine = self._by_owner.get(source, 0) + n
        if mine > self.share_bytes or self.held + n > self.total_bytes:
            return False
        self._by_owner[source] = mine
        self.held += n
        return True

    def fits(self, source: str, n: int) -> bool:
        """Whether :meth:`take` of ``n`` bytes (>= 0) for ``source`` would succeed; holds nothing (a
        body complete in one part is taken and given back at once: the same verdict, issue 14)."""
        return self._by_owner.get(source, 0) + n <= self.share_bytes and self.held + n <= self.total_bytes

    def give(self, source: str, n: int) -> None:
        """Release ``n`` bytes held for ``source`` (at most what it holds)."""
        mine = self._by_owner.get(source, 0)
        n = min(n, mine)
        if mine - n > 0:
            self._by_owner[source] = mine - n
        else:
            self._by_owner.pop(source, None)
        self.held -= n

    def held_by(self, source: str) -> int:
        """Bytes held for ``source``."""
        return self._by_owner.get(source, 0)
