"""Three gateway instances share one tenant's limits through a real redis-server (issue 16).

Each instance is a whole :class:`gateway.build.Gateway` built from the same
configuration (``state.backend: redis``) with its own Redis client, in front of
the same simulated replicas; requests reach each instance's public app
round robin (httpx's ASGI transport). The same runs with ``state.backend:
memory`` show what the test guards against: each instance enforcing the whole
limit on its own.
"""
from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import yaml

from gateway.app import build_public_app
from gateway.auditing import AuditHub
from gateway.build import Gateway, build
from gateway.config import load_config
from sim.cluster import Cluster, start_cluster
from sim.replica import ReplicaConfig
from sim.spiffe_issuer import DemoIssuer
from tests.conftest import TD, base_config
from tests.support.waiting import wait_for

PROMPT = "shared limits across instances " * 4


@dataclass
class Instances:
    """N started gateways on one config; ``clients[i]`` talks to instance i's public app."""

    cluster: Cluster
    issuer: DemoIssuer
    gateways: list[Gateway]
    clients: list[httpx.AsyncClient]
    tmp: Path
    secret_hex: str

    def auth(self, workload: str = "tenant-lim/app") -> dict[str, str]:
        return {"Authorization": f"Bearer {self.issuer.mint(f'spiffe://{TD}/{workload}', 'prefixgate')}"}

    async def complete(self, i: int, max_tokens: int = 4, prompt: str = PROMPT) -> httpx.Response:
        return await self.clients[i % len(self.clients)].post(
            "/v1/completions", headers=self.auth(),
            json={"model": "sim-model", "prompt": prompt, "max_tokens": max_tokens})


@contextlib.asynccontextmanager
async def instances(tmp: Path, state: dict[str, Any], tenant: dict[str, Any], *, n: int = 3,
                    replica: ReplicaConfig | None = None, flow: dict[str, Any] | None = None) -> AsyncIterator[Instances]:
    """``n`` gateways with ``state`` (and ``flow``) and one extra tenant ``tenant-lim`` (limits in ``tenant``)."""
    cluster = await start_cluster(2, replica or ReplicaConfig(time_scale=100.0, decode_s_per_token=0.02))
    issuer = DemoIssuer(TD)
    doc = base_config(tmp, cluster.urls, issuer, state=state, **({"flow": flow} if flow else {}))
    doc["tenancy"]["tenants"].append({"id": "tenant-lim", "spiffe_ids": [f"spiffe://{TD}/tenant-lim/"],
                                      "models": ["sim-model"], "pools": ["default"], "max_output_tokens": 256,
                                      **tenant})
    cfg_file = tmp / "gateway.yaml"
    cfg_file.write_text(yaml.safe_dump(doc))
    gws: list[Gateway] = []
    clients: list[httpx.AsyncClient] = []
    try:
        for _ in range(n):
            gw = build(load_config(cfg_file), audit=AuditHub(None), config_path=str(cfg_file))
            await gw.start()
            gws.append(gw)
            clients.append(httpx.AsyncClient(transport=httpx.ASGITransport(app=build_public_app(gw, manage_lifecycle=False)),
                                             base_url="http://gw", timeout=30))
        yield Instances(cluster, issuer, gws, clients, tmp, (tmp / "master.key").read_text().strip())
    finally:
        for c in clients:
            await c.aclose()
        for gw in gws:
            await gw.stop()
        await cluster.stop()


#: the state client's command timeout in the outage tests: a stopped redis-server refuses or resets at
#: once, so the outage is seen without a timeout; 0.3 s made a live Redis "unavailable" whenever the shared
#: event loop (two or three gateways, replicas, client) was held that long on a loaded machine, and the
#: counted 200/429/503 answers moved
CMD_TIMEOUT_S = 2.0


def _redis(url: str, **kw: Any) -> dict[str, Any]:
    return {"backend": "redis", "url": url, "key_prefix": "pgs2:", "lease_ttl_s": 2.0, **kw}


async def _rate_run(inst: Instances, duration_s: float) -> tuple[int, int, float]:
    """Requests round robin over the instances, one at a time, for ``duration_s``:
    (admitted, rate-limited, elapsed seconds from the first request to the last answer)."""
    admitted = limited = 0
    t0 = time.monotonic()
    i = 0
    while time.monotonic() - t0 < duration_s:
        r = await inst.complete(i)
        i += 1
        if r.status_code == 200:
            admitted += 1
        else:
            assert r.status_code == 429 and r.json()["error"]["code"] == "rate_limited", r.text
            limited += 1
    return admitted, limited, time.monotonic() - t0


async def test_a_request_rate_holds_across_three_instances(tmp_path: Path, redis_server) -> None:
    # the run is 30 s: PREFIXGATE_RATE_RUN_S=30 (default 3 s to keep the suite short)
    duration = float(os.environ.get("PREFIXGATE_RATE_RUN_S", "3"))
    async with instances(tmp_path, _redis(redis_server.url), {"rate_rps": 10, "rate_burst": 10}) as inst:
        admitted, limited, elapsed = await _rate_run(inst, duration)
    print(f"rate run: {admitted} admitted, {limited} limited in {elapsed:.2f} s "
          f"(bound 10 x t + 10 = {10 * elapsed + 10:.1f})")
    assert admitted <= 10 * elapsed + 10, (admitted, elapsed)
    assert admitted >= 10 and limited > 0, (admitted, limited)


async def test_with_in_process_state_three_instances_admit_three_times_the_burst(tmp_path: Path) -> None:
    # the failure the shared state prevents: every instance has its own bucket
    async with instances(tmp_path, {"backend": "memory"}, {"rate_rps": 0.01, "rate_burst": 10}) as inst:
        statuses = [(await inst.complete(i)).status_code for i in range(45)]
    assert statuses.count(200) == 30, statuses


async def test_concurrency_four_holds_across_three_instances(tmp_path: Path, redis_server) -> None:
    slow = ReplicaConfig(time_scale=1.0, decode_s_per_token=0.02)  # 200 output tokens: ~4 s in flight
    # no queue: beyond the concurrency a request is refused at once (with a queue it waits holding
    # no slot: tests/scaleout/test_s2_flow_slots.py)
    async with instances(tmp_path, _redis(redis_server.url), {"max_concurrency": 4}, replica=slow,
                         flow={"tenant_max_queued_requests": 0}) as inst:
        first = [asyncio.ensure_future(inst.complete(i, max_tokens=200)) for i in range(4)]
        limiter = inst.gateways[0].limiter
        await wait_for(lambda: _eq(limiter.in_flight("tenant-lim"), 4), what="4 slots held in Redis")
        refused = [await inst.complete(i) for i in range(6)]  # each instance twice, while 4 are in flight
        assert [r.status_code for r in refused] == [429] * 6
        assert {r.json()["error"]["code"] for r in refused} == {"concurrency_limited"}
        done = await asyncio.gather(*first)
        assert [r.status_code for r in done] == [200] * 4
        for gw in inst.gateways:
            await gw.admission.limits.flush()
        assert await limiter.in_flight("tenant-lim") == 0
        assert (await inst.complete(5)).status_code == 200  # released slots are free on every instance


async def _eq(coro: Any, want: int) -> bool:
    return await coro == want


def _metric(gw: Gateway, name: str, labels: dict[str, str] | None = None) -> float:
    for reg in (gw.metrics.public, gw.metrics.admin):
        v = reg.get_sample_value(name, labels or {})
        if v is not None:
            return v
    raise AssertionError(f"no sample {name} {labels}")


async def test_fail_closed_answers_503_while_redis_is_down_and_recovers_without_restart(
        tmp_path: Path, redis_server) -> None:
    state = _redis(redis_server.url, on_unavailable="fail_closed", probe_interval_s=0.2, command_timeout_s=CMD_TIMEOUT_S)
    async with instances(tmp_path, state, {"rate_rps": 100, "rate_burst": 100}, n=2) as inst:
        assert (await inst.complete(0)).status_code == 200
        redis_server.stop()
        for i in range(4):
            r = await inst.complete(i)
            assert r.status_code == 503, r.text
            assert r.json()["error"]["code"] == "state_unavailable" and int(r.headers["Retry-After"]) >= 1
        gw = inst.gateways[0]
        assert _metric(gw, "prefixgate_state_available") == 0
        assert _metric(gw, "prefixgate_state_unavailable_admissions_total", {"behaviour": "refused"}) >= 2
        assert "shared state (Redis) unavailable: admissions answer 503" in gw.readiness.local_problems()
        redis_server.start()  # same port, empty: a Redis restart that lost everything
        for i in range(2):
            await wait_for(lambda i=i: _status(inst.complete(i), 200), what=f"instance {i} admits again")
        assert _metric(gw, "prefixgate_state_available") == 1
        assert not any("shared state" in p for p in gw.readiness.local_problems())


async def _status(coro: Any, want: int) -> bool:
    return (await coro).status_code == want


async def test_local_fallback_enforces_the_limit_divided_by_the_instances(tmp_path: Path, redis_server) -> None:
    state = _redis(redis_server.url, on_unavailable="local", instances_expected=3, probe_interval_s=0.2,
                   command_timeout_s=CMD_TIMEOUT_S)
    async with instances(tmp_path, state, {"rate_rps": 0.01, "rate_burst": 9}) as inst:
        assert (await inst.complete(0)).status_code == 200  # 1 of the shared 9
        redis_server.stop()
        statuses = [(await inst.complete(i)).status_code for i in range(15)]
        # each instance: 9 / 3 = 3 locally, then 429; 9 in all (not 27)
        assert statuses.count(200) == 9 and statuses.count(429) == 6, statuses
        gw = inst.gateways[1]
        assert _metric(gw, "prefixgate_state_available") == 0
        assert _metric(gw, "prefixgate_state_unavailable_admissions_total", {"behaviour": "local"}) >= 3
        redis_server.start()  # empty: the shared bucket starts full again (documented)
        await wait_for(lambda: _state_up(inst), what="every instance back on Redis")
        statuses = [(await inst.complete(i)).status_code for i in range(12)]
        assert statuses.count(200) == 9, statuses  # one shared bucket again


def _state_up(inst: Instances) -> bool:
    return all(_metric(gw, "prefixgate_state_available") == 1 for gw in inst.gateways)


async def test_an_instance_started_while_redis_is_down_serves_once_it_answers(tmp_path: Path, redis_server) -> None:
    redis_server.stop()
    state = _redis(redis_server.url, probe_interval_s=0.2, command_timeout_s=CMD_TIMEOUT_S)
    async with instances(tmp_path, state, {"rate_rps": 100}, n=1) as inst:
        assert (await inst.complete(0)).status_code == 503
        redis_server.start()
        await wait_for(lambda: _status(inst.complete(0), 200), what="admits once Redis answers")


async def test_redis_holds_no_prompt_text_token_or_secret_after_traffic(tmp_path: Path, redis_server) -> None:
    marker = "zebracanary" * 3
    limits = {"rate_rps": 100, "rate_burst": 100, "max_concurrency": 8, "prompt_tokens_per_s": 1e5,
              "output_tokens_per_s": 1e5}
    async with instances(tmp_path, _redis(redis_server.url), limits) as inst:
        tokens = []
        for i in range(9):
            headers = inst.auth()
            tokens.append(headers["Authorization"].split()[1])
            r = await inst.clients[i % 3].post("/v1/completions", headers=headers, json={
                "model": "sim-model", "prompt": f"{marker} {i} {PROMPT}", "max_tokens": 4, "user": marker})
            assert r.status_code == 200, r.text
        for gw in inst.gateways:
            await gw.admission.limits.flush()
        secret = inst.secret_hex
        import redis.asyncio as aioredis

        client = aioredis.Redis.from_url(redis_server.url)
        try:
            assert await client.dbsize() > 0  # traffic did leave state there
            await client.config_set("rdbcompression", "no")
            await client.save()
            values = [k async for k in client.scan_iter(count=1000)]
            for key in list(values):
                values.extend(await _values(client, key))
        finally:
            await client.aclose()
    dump = (redis_server.tmp / "dump.rdb").read_bytes()
    blobs = [dump, *[v if isinstance(v, bytes) else str(v).encode() for v in values]]
    for needle in [marker, "shared limits across", secret, *tokens, *(t.split(".")[1] for t in tokens)]:
        for blob in blobs:
            assert needle.encode() not in blob, f"{needle[:12]}... found in Redis"
        assert needle.lower().encode() not in dump.lower()


async def _values(client: Any, key: bytes) -> list[Any]:
    kind = (await client.type(key)).decode()
    if kind == "hash":
        return [x for kv in (await client.hgetall(key)).items() for x in kv]
    if kind == "zset":
        return [m for m, _ in await client.zrange(key, 0, -1, withscores=True)]
    if kind == "set":
        return list(await client.smembers(key))
    if kind == "string":
        return [await client.get(key)]
    if kind == "list":
        return list(await client.lrange(key, 0, -1))
    if kind == "stream":
        return [x for _, fields in await client.xrange(key) for kv in fields.items() for x in kv]
    return []
