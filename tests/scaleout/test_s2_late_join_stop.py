"""Stopping an instance whose background join (Redis was down at start) finishes while being cancelled.

``SharedState.start`` joins in the background when Redis does not answer.
The join's last step starts the key-check task and stores it where ``stop``
looks for the task to cancel. If the cancel of the join is swallowed (redis-py
can turn a cancellation into a finished read) the join completes and
replaces itself by the key-check task after ``stop`` had taken the join
task: ``stop`` used to forget the new task, which then ran on after the
instance stopped. Here the join ignores its first cancellation on purpose.
"""
from __future__ import annotations

import asyncio
from pathlib import Path

from tests.scaleout.s2_instances import instance, write_secret
from tests.support.waiting import wait_for


async def test_stop_cancels_the_key_check_task_of_a_join_that_finished_while_cancelled(
        tmp_path: Path, redis_server) -> None:
    redis_server.stop()
    gw = instance(tmp_path, 0, redis_server.url, write_secret(tmp_path / "master.key"))
    shared = gw.shared
    entered = asyncio.Event()
    run = shared._run

    async def run_ignoring_one_cancel() -> None:
        entered.set()
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            pass  # swallowed, as a library may do
        await run()

    shared._run = run_ignoring_one_cancel
    await shared.start()  # Redis down: joins in the background
    redis_server.start()
    await wait_for(lambda: entered.is_set(), timeout_s=30, what="background join reached its last step")
    await shared.stop()
    left = [t for t in asyncio.all_tasks() if t.get_name() == "prefixgate-key-check" and not t.done()]
    for t in left:
        t.cancel()
    assert not left, "the key-check task outlived stop()"
