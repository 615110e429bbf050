"""``sim.replay.replay(base_urls=...)``: a round-robin client over several gateway instances (bench.scaleout)."""
from __future__ import annotations

from sim.replay import ReplayConfig, replay
from sim.replica import STATE_KEY, ReplicaConfig, create_app, run_app_on
from sim.trace import TraceRequest


async def test_request_i_goes_to_base_url_i_mod_n_and_records_its_target() -> None:
    apps, runners, urls = [], [], []
    for i in range(3):
        app = create_app(ReplicaConfig(replica_id=f"r{i}", time_scale=50.0, decode_s_per_token=0.01))
        runner, url = await run_app_on(app, "127.0.0.1", 0)
        apps.append(app), runners.append(runner), urls.append(url)
    try:
        reqs = [TraceRequest(i, i * 0.5, 1024, 2, (100 + i, 200 + i)) for i in range(7)]
        res = await replay(reqs, ReplayConfig(base_url="http://127.0.0.1:9", time_scale=50.0), base_urls=urls)
    finally:
        for runner in runners:
            await runner.cleanup()
    assert res.errors_by_kind() == {}
    assert [r.target for r in res.records] == [0, 1, 2, 0, 1, 2, 0]
    assert [app[STATE_KEY].counters.requests for app in apps] == [3, 2, 2]
