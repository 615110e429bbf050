"""ReadDeadline bounds each read of a stream like ``asyncio.timeout`` around every read did, with
one timer per stream: a slow read times out, a long stream of quick reads does not (however long
the whole stream), time between reads does not count, and other cancellations pass unchanged."""
from __future__ import annotations

import asyncio

import pytest

from gateway.read_deadline import ReadDeadline


async def test_a_read_longer_than_the_bound_raises_timeout_and_leaves_no_cancellation() -> None:
    d = ReadDeadline(0.05)
    never = asyncio.get_running_loop().create_future()
    with pytest.raises(TimeoutError):
        await d.read(never)
    assert never.cancelled()
    assert not asyncio.current_task().cancelling()
    assert await d.read(asyncio.sleep(0, "next")) == "next"  # usable again
    d.close()


async def test_quick_reads_over_a_longer_stream_and_pauses_between_reads_do_not_time_out() -> None:
    # each read leaves 0.55 s of room (it was 30 ms, then 0.25 s: a descheduled process, or one in a full
    # GC collection of the test process, ~0.45 s measured in session 30, could overshoot a 50 ms sleep past
    # the bound)
    d = ReadDeadline(0.6)
    got = []
    for i in range(16):  # 16 x 50 ms of reads: the whole stream is past the bound
        got.append(await d.read(asyncio.sleep(0.05, i)))
    await asyncio.sleep(0.7)  # between reads (the client reading the answer): not counted
    got.append(await d.read(asyncio.sleep(0, 16)))
    d.close()
    assert got == list(range(17))


async def test_a_cancellation_from_elsewhere_is_passed_on() -> None:
    d = ReadDeadline(10.0)

    async def reader() -> None:
        await d.read(asyncio.get_running_loop().create_future())

    t = asyncio.ensure_future(reader())
    await asyncio.sleep(0.01)
    t.cancel()
    with pytest.raises(asyncio.CancelledError):
        await t
    d.close()


async def test_errors_of_the_read_are_raised_unchanged() -> None:
    d = ReadDeadline(1.0)

    async def broken() -> None:
        raise ConnectionResetError("reset")

    with pytest.raises(ConnectionResetError):
        await d.read(broken())
    d.close()


def test_bound_must_be_positive() -> None:
    with pytest.raises(ValueError):
        ReadDeadline(0)


async def test_a_read_that_swallows_the_cancellation_still_times_out() -> None:
    d = ReadDeadline(0.02)

    async def stubborn() -> str:
        try:
            await asyncio.sleep(10)
        except asyncio.CancelledError:
            return "swallowed"
        return "slept"

    with pytest.raises(TimeoutError):
        await d.read(stubborn())
    assert not asyncio.current_task().cancelling()
    d.close()
