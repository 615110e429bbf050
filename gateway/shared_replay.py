"""Replay refusal for routing stream entries (session 13, R13-2; gateway/shared_routing.py).

Before session 13 an entry's MAC bound the key prefix, the writer's instance id
and the body only, so a verbatim copy of an entry (``XADD`` of the same fields
under a new stream id, by anyone who can write to Redis) verified and was
applied again: one load delta plus 50 copies gave every reader 51 times the
load. Now every entry carries a **stamp** ``n`` = ``"<seq>:<ms>"``: ``seq`` is
the writer's own counter (1, 2, ... per process start, one per ``XADD``: the
pieces of a split batch each take the next number, in the order they are
written) and ``ms`` the writer's wall clock (Unix milliseconds). The MAC
(HMAC-SHA256, subkey ``pg-shared-routing-mac-v1``) covers
``lp(prefix) || lp(instance id) || lp(stamp) || body`` (``lp``:
:func:`tenancy.salt.length_prefixed`). A body is JSON and starts with ``[``,
so no message of the older form (``lp(prefix) || lp(id) || body``) is also one
of this form: an entry of an older writer fails the check (missing ``n``) and
is refused, counted like a bad MAC.

A reader (:class:`ReplayGuard`) holds, per writer, the highest ``seq`` it
applied, and refuses an entry at or below it ("replayed"). One writer's
``XADD`` s leave in order on one connection, so the stream holds its entries
in ``seq`` order and a rebuild, which reads oldest first, applies them all.
It also refuses an entry whose ``ms`` is more than ``max_age_s`` before its
own clock ("too old"): the stream's own retention window (every live instance
writes at least one entry per lease tick, so an entry older than ``(trim
length + 128) x lease_ttl_s / 4`` has been trimmed while any instance runs;
128 covers ``MAXLEN ~`` slack). So a reader that starts after the original was
trimmed is not fed an old copy, and a writer's mark can be forgotten once its
last entry is that old (:meth:`ReplayGuard.prune`): the map holds the
writers seen within the window, at most ``max_writers`` (the least recent
one leaves first beyond that). Instance ids are per process start, so
nothing needs persisting. Residual: a copy of an entry younger than the
window, of a writer whose later entries are all gone from the stream, is
applied once by a reader that had not seen that writer (a new instance).
"""

from __future__ import annotations

import hmac

from tenancy.salt import length_prefixed

__all__ = ["ReplayGuard", "entry_mac", "parse_stamp", "stamp"]

_MAX_SEQ = 2**63


def stamp(seq: int, sent_ms: int) -> str:
    """The ``n`` field of an entry: ``"<seq>:<ms>"`` (``seq`` >= 1, ``sent_ms``: Unix ms)."""
    return f"{seq}:{sent_ms}"


def parse_stamp(value: str) -> tuple[int, int]:
    """``(seq, sent_ms)`` of an ``n`` field; raises ``ValueError`` for any other shape."""
    seq_s, sep, ms_s = value.partition(":")
    if not (sep and seq_s.isdigit() and ms_s.isdigit() and len(seq_s) <= 19 and len(ms_s) <= 16):
        raise ValueError("stamp")
    seq = int(seq_s)
    if not 0 < seq < _MAX_SEQ:
        raise ValueError("stamp")
    return seq, int(ms_s)


def entry_mac(key: bytes, prefix: str, instance_id: str, entry_stamp: str, body: bytes) -> str:
    """Hex HMAC-SHA256 of one entry under ``key`` (module doc: the message)."""
    msg = length_prefixed(prefix) + length_prefixed(instance_id) + length_prefixed(entry_stamp) + body
    return hmac.digest(key, msg, "sha256").hex()


class ReplayGuard:
    """Per-writer highest applied sequence and an age bound (module doc).

    ``max_age_s``: entries whose writer time is older than this (seconds, > 0)
    are refused; ``max_writers``: writers held at most. Pure: the caller passes
    the time (``now_s``, Unix seconds). Not thread-safe (one event loop).
    """

    def __init__(self, max_age_s: float, max_writers: int = 4096) -> None:
        if max_age_s <= 0 or max_writers < 1:
            raise ValueError("max_age_s must be > 0 and max_writers >= 1")
        self.max_age_s = float(max_age_s)
        self._max_writers = max_writers
        self._marks: dict[str, tuple[int, int]] = {}  # writer -> (highest seq applied, its ms), oldest first

    def refusal(self, writer: str, seq: int, sent_ms: int, now_s: float) -> str | None:
        """Why the entry ``(writer, seq, sent_ms)`` must not be applied (``"replayed"``, ``"too old"``),
        or None when it may."""
        if sent_ms < (now_s - self.max_age_s) * 1000:
            return "too old"
        mark = self._marks.get(writer)
        if mark is not None and seq <= mark[0]:
            return "replayed"
        return None

    def applied(self, writer: str, seq: int, sent_ms: int) -> None:
        """Record that ``writer``'s entry ``seq`` was applied (call after :meth:`refusal` gave None)."""
        self._marks.pop(writer, None)
        self._marks[writer] = (seq, sent_ms)
        if len(self._marks) > self._max_writers:
            del self._marks[next(iter(self._marks))]

    def prune(self, now_s: float) -> int:
        """Forget writers whose last applied entry is older than ``max_age_s`` (their entries are all
        refused as too old anyway); returns how many were dropped."""
        horizon = (now_s - self.max_age_s) * 1000
        gone = [w for w, (_seq, ms) in self._marks.items() if ms < horizon]
        for w in gone:
            del self._marks[w]
        return len(gone)

    def writers(self) -> int:
        """Writers held now."""
        return len(self._marks)
