from __future__ import annotations

import json
import urllib.request

import aiohttp
import pytest

from sim.cluster import ClusterStartError, spawn_cluster


async def test_in_process_cluster_has_distinct_replicas(make_cluster, session) -> None:
    c = await make_cluster(3)
    assert len(set(c.urls)) == 3
    ids = []
    for url in c.urls:
        async with session.get(url + "/health") as r:
            doc = await r.json()
            ids.append((doc["replica_id"], doc["instance_id"]))
    assert [i for i, _ in ids] == ["replica-0", "replica-1", "replica-2"]
    assert len({iid for _, iid in ids}) == 3
    # caches are per replica
    body = {"prompt": " ".join(f"w{i}" for i in range(64)), "max_tokens": 1}
    for url in (c.urls[0], c.urls[0], c.urls[1]):
        async with session.post(url + "/v1/completions", json=body) as r:
            last = (await r.json())["usage"]["prompt_tokens_details"]["cached_tokens"]
    assert last == 0
    assert c.ready_doc()[2] == {"replica_id": "replica-2", "url": c.urls[2]}


async def test_stop_closes_listeners(make_cluster) -> None:
    c = await make_cluster(1)
    url = c.urls[0]
    await c.stop()
    async with aiohttp.ClientSession() as s:
        with pytest.raises(aiohttp.ClientConnectionError):
            async with s.get(url + "/health") as r:
                await r.read()


def _get(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=5) as r:
        return json.loads(r.read())


def test_spawn_cluster_subprocess_serves_and_terminates() -> None:
    with spawn_cluster(2, time_scale=500.0, capacity_blocks=123, stream_chunk_tokens=4) as cp:
        assert [r["replica_id"] for r in cp.replicas] == ["replica-0", "replica-1"]
        proc = cp.proc
        info = _get(cp.urls[1] + "/sim/stats")
        assert info["replica_id"] == "replica-1"
        assert info["config"]["capacity_blocks"] == 123 and info["config"]["stream_chunk_tokens"] == 4
        assert info["config"]["time_scale"] == 500.0
    assert proc.poll() is not None


def test_spawn_cluster_rejects_bad_config() -> None:
    with pytest.raises(TypeError):
        spawn_cluster(1, no_such_field=1)
    with pytest.raises(ValueError):
        spawn_cluster(1, time_scale=0)
    with pytest.raises(ClusterStartError):
        spawn_cluster(1, base_port=70000)  # the CLI refuses it and exits before ready
