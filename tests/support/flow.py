"""Support for the flow-control tests on an in-process stack (``tests/conftest.py`` ``stack``, issue 17).

Import :func:`replica_cfg` and :func:`n_replicas` into a test module to run its
stack on one replica that decodes slowly (50 ms per output token, unscaled),
so requests stay running while the test looks. :func:`post` sends a
completion in the background; :func:`running` and :func:`queued` read the
replica's running requests and the flow-control queue's length.
"""
from __future__ import annotations

import asyncio
from typing import Any

import pytest

from sim.replica import ReplicaConfig
from tests.support.waiting import wait_for

__all__ = ["HOLDING_TOKENS", "HOLD_UNTIL_CANCELLED", "PROMPT", "n_replicas", "one_running_one_queued", "post", "queued",
           "replica_cfg", "running"]

#: A 40-word prompt.
PROMPT = " ".join(f"w{i}" for i in range(40))


@pytest.fixture
def replica_cfg() -> ReplicaConfig:
    """Slow decode (50 ms per output token, unscaled) so requests stay running while we look."""
    return ReplicaConfig(time_scale=1.0, decode_s_per_token=0.05, stream_chunk_tokens=4)


@pytest.fixture
def n_replicas() -> int:
    """One replica (``r0``)."""
    return 1


def post(stack: Any, max_tokens: int = 20, workload: str = "tenant-a/app", **client: Any) -> asyncio.Future[Any]:
    """``POST /v1/completions`` (:data:`PROMPT`, ``max_tokens``) as ``workload``, in the background;
    ``client``: more keyword arguments of the httpx call (e.g. ``timeout=None``: the client never gives
    up, its request ends when the test cancels it or the gateway answers)."""
    return asyncio.ensure_future(stack.client.post(
        "/v1/completions", json={"model": "sim-model", "prompt": PROMPT, "max_tokens": max_tokens},
        headers=stack.auth(workload), **client))


#: ``upstream`` and ``policy`` overrides for a test whose first request must hold the replica's only running
#: slot until the test cancels it, however slowly the rest of the test runs (the stack's own upstream
#: deadlines, 5 s to the first byte and 10 s in all, ended that request early on a loaded machine and let
#: the request meant to queue run instead: session 17; so can the 2 s connect deadline while tracemalloc
#: and a load of 12 hold the loop: the request is counted running before it connects), and whose decisions
#: must not fail closed on the policy deadline under load (the PDP's budget is not these tests' subject)
HOLD_UNTIL_CANCELLED: dict[str, Any] = {
    "upstream": {"connect_timeout_s": 600, "first_byte_timeout_s": 600, "read_timeout_s": 600,
                 "total_timeout_s": 600},
    "policy": {"timeout_s": 10.0},
}
#: ``max_tokens`` of a request that holds the slot: 4096 x 50 ms = 205 s of decoding on :func:`replica_cfg`'s
#: replica, longer than any wait of a test that cancels it (the tenant's ``max_output_tokens`` must allow it)
HOLDING_TOKENS = 4096


def running(stack: Any) -> int:
    """Requests running on replica ``r0`` (the router's load view)."""
    return stack.components.router.loads.snapshot("r0").running_requests


def queued(stack: Any) -> int:
    """Requests waiting in the flow-control queue (every tenant)."""
    return len(stack.components.flow.queue)


async def one_running_one_queued(stack: Any, first_max_tokens: int) -> tuple[asyncio.Future[Any], asyncio.Future[Any]]:
    """With room for one running request: start one (``first_max_tokens``), wait until it runs,
    start a second and wait until it is queued; return both (the caller cancels them)."""
    first = post(stack, first_max_tokens)
    await wait_for(lambda: running(stack) == 1, what="first request running")
    second = post(stack)
    await wait_for(lambda: queued(stack) == 1, what="second request queued")
    return first, second
