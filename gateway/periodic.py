"""A background loop that runs one round every ``interval_s`` seconds (health checks,
engine-metrics scrapes): a round that raises is logged and the loop goes on; and
:func:`cancel_task` (:mod:`tenancy.shared_store`), how every background task of the gateway is stopped."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from tenancy.shared_store import cancel_task

__all__ = ["PeriodicTask", "cancel_task"]

log = logging.getLogger(__name__)


class PeriodicTask:
    """Runs ``round()`` now and then every ``interval_s`` seconds (after each round ends)
    on the running event loop, between :meth:`start` and :meth:`stop`; ``what`` names
    the loop in the log line of a failed round."""

    def __init__(self, round: Callable[[], Awaitable[None]], interval_s: float, what: str) -> None:
        self._round = round
        self.interval_s = interval_s
        self._what = what
        self._task: asyncio.Task[None] | None = None

    async def _run(self) -> None:
        while True:
            try:
                await self._round()
            except Exception:  # keep going whatever one round raised
                log.exception("%s round failed", self._what)
            await asyncio.sleep(self.interval_s)

    def start(self) -> None:
        """Start the loop on the running event loop (idempotent)."""
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._run())

    async def stop(self) -> None:
        """Stop the loop and wait for it to end."""
        task, self._task = self._task, None
        if task is not None:
            await cancel_task(task)
