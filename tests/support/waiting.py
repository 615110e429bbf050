"""One way for tests to wait: poll a condition with a deadline, never a fixed sleep.

``await wait_for(lambda: x.ready, timeout_s=10, what="x ready")`` returns the
condition's first truthy value, or raises :class:`AssertionError` naming
``what`` once ``timeout_s`` seconds (monotonic) have passed. Limits are
generous on purpose: a loaded 2-core machine makes everything slower, and a
condition that holds returns as soon as it holds.
"""
from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Callable
from typing import Any

__all__ = ["DEFAULT_TIMEOUT_S", "holds_within", "how_it_ended", "wait_for", "wait_for_sync"]

#: Default deadline, seconds.
DEFAULT_TIMEOUT_S = 10.0


async def wait_for(condition: Callable[[], Any], timeout_s: float = DEFAULT_TIMEOUT_S, *,
                   what: str = "condition", step_s: float = 0.02) -> Any:
    """Poll ``condition()`` (a plain or an async callable) every ``step_s``
    seconds until it returns a truthy value, and return that value.

    Raises:
        AssertionError: still falsy after ``timeout_s`` seconds.
    """
    deadline = time.monotonic() + timeout_s
    while True:
        value = condition()
        if inspect.isawaitable(value):
            value = await value
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")
        await asyncio.sleep(step_s)


async def holds_within(condition: Callable[[], Any], timeout_s: float = DEFAULT_TIMEOUT_S) -> bool:
    """:func:`wait_for` as a truth value: True as soon as ``condition()`` holds, False once ``timeout_s``
    seconds passed without it (for a test that asserts with its own message, or only waits)."""
    try:
        await wait_for(condition, timeout_s)
    except AssertionError:
        return False
    return True


def wait_for_sync(condition: Callable[[], Any], timeout_s: float = DEFAULT_TIMEOUT_S, *,
                  what: str = "condition", step_s: float = 0.02) -> Any:
    """:func:`wait_for` for threads and synchronous fixtures (blocks with ``time.sleep``)."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")
        time.sleep(step_s)


def how_it_ended(fut: "asyncio.Future[Any]") -> str:
    """What a request that should have queued got instead: its status and error code, or its exception."""
    if fut.cancelled():
        return "cancelled"
    if fut.exception() is not None:
        return f"raised {fut.exception()!r}"
    r = fut.result()
    return f"answered {r.status_code} {r.text[:200]!r}"
