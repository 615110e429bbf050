"""Random ids without a system call per id (session 3, time-scale-20 profile).

``uuid.uuid4()`` reads 16 bytes with ``os.urandom`` per id: a ``getrandom``
call that releases the GIL, so under load the gateway's event loop waited to
get it back (the replay profile sampled ``uuid4`` in 154 of its stacks for
two ids per request). Here each stream draws :data:`BATCH` ids' worth of
``os.urandom`` bytes at once and hands them out one by one.

Guarantees, as ``uuid4``: 122 random bits from the OS CSPRNG per id (version
4, RFC 4122 variant), so ids are unique across processes and restarts and
not guessable; nothing is derived from a counter or a clock. The batch is
dropped in a forked child (``os.register_at_fork``), so parent and child
never hand out the same bytes. Taking ids from several threads is safe:
``next()`` on a list iterator is atomic under the GIL, and a refill race
only discards unused ids.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator

__all__ = ["BATCH", "uuid4_str", "uuid4_hex", "reset"]

#: Ids drawn per ``os.urandom`` call (16 bytes each).
BATCH = 256
_VERSION_CLEAR = ~(0xF000 << 64 | 0xC000 << 48) & ((1 << 128) - 1)
_VERSION_SET = 0x4000 << 64 | 0x8000 << 48  # version 4, variant 10xx (RFC 4122)


def _random_ints() -> list[int]:
    raw = os.urandom(16 * BATCH)
    return [int.from_bytes(raw[i : i + 16], "big") & _VERSION_CLEAR | _VERSION_SET for i in range(0, 16 * BATCH, 16)]


def _dashed() -> list[str]:
    out = []
    for v in _random_ints():
        h = "%032x" % v
        out.append(f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}")
    return out


def _hex() -> list[str]:
    return ["%032x" % v for v in _random_ints()]


class _Stream:
    """Ids from ``fill`` (a batch maker), one per :meth:`take`; refilled when used up."""

    def __init__(self, fill: Callable[[], list[str]]) -> None:
        self._fill = fill
        self._it: Iterator[str] = iter(())

    def reset(self) -> None:
        self._it = iter(())

    def take(self) -> str:
        """The stream's next id (a new batch drawn when the last one is used up)."""
        try:
            return next(self._it)
        except StopIteration:
            it = self._it = iter(self._fill())
            return next(it)


_dashed_stream = _Stream(_dashed)
_hex_stream = _Stream(_hex)

#: ``uuid4_str()``: a random UUID v4 in canonical form (36 characters, ``str(uuid.uuid4())``'s format).
#: ``uuid4_hex()``: a random UUID v4 as 32 lowercase hex digits (``uuid.uuid4().hex``'s format).
#: Each is its stream's bound :meth:`_Stream.take`: one Python call per id, not two (session 17).
uuid4_str: Callable[[], str] = _dashed_stream.take
uuid4_hex: Callable[[], str] = _hex_stream.take


def reset() -> None:
    """Drop the unused ids of every stream (done in a forked child; tests use it too)."""
    _dashed_stream.reset()
    _hex_stream.reset()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=reset)
