"""The sink interface every audit destination implements."""
from __future__ import annotations

from typing import Protocol, runtime_checkable

from audit.event import AuditEvent


class SinkUnavailable(Exception):
    """The sink cannot take events now (receiver down, disk error).

    :class:`audit.log.AuditLog` reacts by spilling to disk and retrying; a
    sink raising it must not have half-applied the batch in a way that loses
    events (re-delivering some of them is fine: receivers de-duplicate on
    ``event_id``).
    """


@runtime_checkable
class AuditSink(Protocol):
    """A destination for audit events.

    ``send`` is called by one worker task at a time, in emit order, with
    batches of 1..N events; it returns once the batch is handed to the
    destination, or raises :class:`SinkUnavailable`.
    """

    name: str

    async def open(self) -> None:
        """Connect / open files. May raise SinkUnavailable (retried)."""

    async def send(self, events: list[AuditEvent]) -> None:
        """Deliver ``events`` in order. Raises SinkUnavailable."""

    async def close(self) -> None:
        """Flush and release resources (idempotent)."""
