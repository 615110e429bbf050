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

__all__ = ["PROMPT", "n_replicas", "one_running_one_queued", "post", "queued", "replica_cfg", "running"]

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


def post(stack: Any, max_tokens: int = 20, workload: str = "tenant-a/app") -> asyncio.Future[Any]:
    """``POST /v1/completions`` (:data:`PROMPT`, ``max_tokens``) as ``workload``, in the background."""
    return asyncio.ensure_future(stack.client.post(
        "/v1/completions", json={"model": "sim-model", "prompt": PROMPT, "max_tokens": max_tokens},
        headers=stack.auth(workload)))


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
