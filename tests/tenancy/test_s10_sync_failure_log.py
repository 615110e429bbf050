"""Session 10 (R10-1's leftover): a shared record this instance refuses fails every sync round
until a newer one comes; ``follow_changes`` logs the first failure of a run as a warning and the
repeats at debug level, and warns again after a success or for another kind of failure."""
from __future__ import annotations

import asyncio
import contextlib
import logging

import pytest

from tenancy.shared_store import follow_changes
from tests.support.pubsub import PubSubOnlyClient
from tests.support.waiting import wait_for


async def test_a_run_of_one_failure_kind_warns_once(caplog: pytest.LogCaptureFixture) -> None:
    # rounds: refused x4, ok, refused x2, Redis down x2, then ok for ever
    script = [ValueError] * 4 + [None] + [ValueError] * 2 + [ConnectionError] * 2
    rounds = 0

    async def sync() -> None:
        nonlocal rounds
        rounds += 1
        if rounds <= len(script) and script[rounds - 1] is not None:
            raise script[rounds - 1]("refused")

    caplog.set_level(logging.DEBUG, logger="prefixgate")
    task = asyncio.create_task(follow_changes(PubSubOnlyClient(), "ch", sync, 0.001, "tenants"))
    try:
        await wait_for(lambda: rounds > len(script) + 1, 10.0, step_s=0.005)
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
    failed = [(r.levelno, r.getMessage()) for r in caplog.records if "sync failed" in r.getMessage()]
    assert [lvl for lvl, _ in failed] == [logging.WARNING, logging.DEBUG, logging.DEBUG, logging.DEBUG,
                                          logging.WARNING, logging.DEBUG, logging.WARNING, logging.DEBUG]
    assert all("shared tenants sync failed" in m for _, m in failed)
