from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Awaitable
from typing import Any

import aiohttp
import pytest

from sim.cluster import Cluster, start_cluster
from sim.replica import ReplicaConfig

# Fast defaults: 1 trace second = 1 ms of wall time.
FAST = ReplicaConfig(time_scale=1000.0)


@pytest.fixture
async def session() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as s:
        yield s


@pytest.fixture
async def make_cluster() -> AsyncIterator[Callable[..., Awaitable[Cluster]]]:
    started: list[Cluster] = []

    async def make(n: int = 1, **cfg: Any) -> Cluster:
        params = {"time_scale": FAST.time_scale, **cfg}
        c = await start_cluster(n, ReplicaConfig(**params))
        started.append(c)
        return c

    yield make
    for c in started:
        await c.stop()
