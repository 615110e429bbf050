from __future__ import annotations

import asyncio
import json
from typing import Any

import aiohttp
import pytest

from sim.replica import FaultSpecError, Faults, parse_faults

PROMPT = " ".join(f"t{i}" for i in range(40))


async def set_faults(session: aiohttp.ClientSession, url: str, body: Any) -> tuple[int, Any]:
    async with session.post(url + "/sim/faults", json=body) as r:
        return r.status, await r.json()


async def test_status_fault_then_clear(make_cluster, session) -> None:
    c = await make_cluster()
    url = c.urls[0]
    assert (await set_faults(session, url, {"status": 503}))[0] == 200
    async with session.post(url + "/v1/completions", json={"prompt": PROMPT}) as r:
        assert r.status == 503
        err = (await r.json())["error"]
        assert err["type"] == "server_error" and err["code"] == "sim_injected_fault"
    async with session.get(url + "/health") as r:
        assert r.status == 503
    async with session.get(url + "/metrics") as r:
        assert r.status == 200  # control and metrics endpoints stay up
    await set_faults(session, url, {})
    async with session.post(url + "/v1/completions", json={"prompt": PROMPT}) as r:
        assert r.status == 200
    async with session.get(url + "/sim/stats") as r:
        s = await r.json()
    assert s["faulted"] == 1 and s["completed"] == 1 and s["faults"] == {}


async def test_stall_before_first_byte(make_cluster, session) -> None:
    c = await make_cluster()
    await set_faults(session, c.urls[0], {"stall_before_first_byte_s": 1.0})
    with pytest.raises(asyncio.TimeoutError):
        async with session.post(c.urls[0] + "/v1/completions", json={"prompt": PROMPT},
                                timeout=aiohttp.ClientTimeout(total=0.1)) as r:
            await r.read()


async def test_stall_mid_stream_after_first_event(make_cluster, session) -> None:
    c = await make_cluster()
    await set_faults(session, c.urls[0], {"stall_mid_stream_s": 1.0})
    async with session.post(c.urls[0] + "/v1/completions", json={"prompt": PROMPT, "stream": True, "max_tokens": 4}) as r:
        first = await asyncio.wait_for(r.content.readuntil(b"\n\n"), 2.0)
        assert json.loads(first[len(b"data: "):])["choices"][0]["text"].strip()
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(r.content.readuntil(b"\n\n"), 0.1)


async def test_reset_mid_stream_aborts_after_first_event(make_cluster, session) -> None:
    c = await make_cluster()
    url = c.urls[0]
    await set_faults(session, url, {"reset_mid_stream": True})
    got = b""
    with pytest.raises(aiohttp.ClientError):
        async with session.post(url + "/v1/completions", json={"prompt": PROMPT, "stream": True, "max_tokens": 8}) as r:
            assert r.status == 200
            async for line in r.content:
                got += line
    assert got.startswith(b"data: {") and b"[DONE]" not in got
    with pytest.raises(aiohttp.ClientError):
        async with session.post(url + "/v1/completions", json={"prompt": PROMPT}) as r:
            await r.read()


async def test_invalid_json_fault(make_cluster, session) -> None:
    c = await make_cluster()
    url = c.urls[0]
    await set_faults(session, url, {"invalid_json": True})
    async with session.post(url + "/v1/completions", json={"prompt": PROMPT}) as r:
        assert r.status == 200
        with pytest.raises(json.JSONDecodeError):
            json.loads(await r.text())
    async with session.post(url + "/v1/completions", json={"prompt": PROMPT, "stream": True, "max_tokens": 2}) as r:
        events = (await r.text()).split("\n\n")
    assert events[0].startswith("data: ")
    with pytest.raises(json.JSONDecodeError):
        json.loads(events[0][len("data: "):])


async def test_broken_sse_fault(make_cluster, session) -> None:
    c = await make_cluster()
    await set_faults(session, c.urls[0], {"broken_sse": True})
    async with session.post(c.urls[0] + "/v1/chat/completions",
                            json={"messages": [{"role": "user", "content": PROMPT}], "stream": True}) as r:
        raw = await r.text()
    assert "[DONE]" not in raw and not raw.startswith("data:")


async def test_slow_factor_multiplies_service_time(make_cluster, session) -> None:
    c = await make_cluster(2)
    await set_faults(session, c.urls[1], {"slow_factor": 4})
    busy = []
    for url in c.urls:
        async with session.post(url + "/v1/completions", json={"prompt": PROMPT, "max_tokens": 1}) as r:
            assert r.status == 200
        async with session.get(url + "/sim/stats") as r:
            busy.append((await r.json())["prefill_busy_s"])
    assert busy[1] == pytest.approx(4 * busy[0])


@pytest.mark.parametrize("body", [
    [], {"status": 200}, {"status": "503"}, {"slow_factor": 0}, {"reset_mid_stream": 1},
    {"stall_mid_stream_s": -1}, {"explode": True},
])
async def test_bad_fault_spec_400(make_cluster, session, body: Any) -> None:
    c = await make_cluster()
    st, err = await set_faults(session, c.urls[0], body)
    assert st == 400 and "message" in err["error"]
    assert c.states[0].faults == Faults()


def test_parse_faults_roundtrip() -> None:
    f = parse_faults({"status": 500, "slow_factor": 2.5, "broken_sse": True})
    assert f.to_json() == {"status": 500, "slow_factor": 2.5, "broken_sse": True}
    assert parse_faults({}) == Faults()
    with pytest.raises(FaultSpecError):
        parse_faults({"status": True})


async def test_restart_keeps_faults(make_cluster, session) -> None:
    c = await make_cluster()
    await set_faults(session, c.urls[0], {"slow_factor": 3})
    async with session.post(c.urls[0] + "/sim/restart") as r:
        assert r.status == 200
    async with session.get(c.urls[0] + "/sim/stats") as r:
        assert (await r.json())["faults"] == {"slow_factor": 3.0}
