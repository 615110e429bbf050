"""Micro-benchmark: the route step and the upstream client step of one request, two trees interleaved (not a test).

``python -m bench.route_micro --baseline DIR [--rounds 4] [--requests 4000] [--case route|upstream]``

Issue 14, session 13. Each case runs in a fresh ``python`` process with ``PYTHONPATH`` set to one tree
(this one or ``--baseline``), the trees alternating; a case prints the median of 7 warm loops of thread
CPU per request (µs) and the Python calls per request (``sys.setprofile``: call and c_call events; a
noise-free proxy for the CPU). Cases:

* ``route``: the pipeline's route step as ``InferencePipeline._route_and_proxy`` runs it (flow control's
  ``release_now`` with the tenant's in-process slot claim, ``cache_aware`` with calibration, 1 replica),
  the record's fields (``replica_set.get``, the breaker attempt, the load snapshot), then what the
  answer's end does to the routing state (first byte, success, finish, the calibration flush).
* ``upstream``: ``open_upstream`` on a warm :class:`gateway.upstream_pool.UpstreamPool` (uvloop) to an
  in-process loopback replica that answers a canned ~250 B JSON completion with five headers, then the
  rest of the answer read and ``json_fast.loads_answer`` (the plain answer's parse). The replica's side
  (a bare ``asyncio.Protocol``) is in the figure too, the same for both trees.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

import click

from sim.click_options import ClickOptions

REPO = Path(__file__).resolve().parents[1]

_MAIN = """
import asyncio, statistics, sys, time
def _count(n):
    calls = [0]
    def prof(frame, event, arg):
        if event == "call" or event == "c_call":
            calls[0] += 1
    async def go():
        sys.setprofile(prof)
        for i in range(n):
            await step(i)
        sys.setprofile(None)
    return go, calls
async def main(n):
    for i in range(n):
        await step(i)
    runs = []
    for _ in range(7):
        c0 = time.thread_time()
        for i in range(n):
            await step(i)
        runs.append((time.thread_time() - c0) / n * 1e6)
    go, calls = _count(1000)
    await go()
    print(statistics.median(runs), calls[0] / 1000)
LOOP(main(__N__))
"""

ROUTE = """
import time
from routing.calibration import CalibratingLoadTracker, Calibration
from routing.load import InProcessLoadTracker
from routing.index import InProcessPrefixIndex
from routing.config import policy_from_config
from routing.policies.cache_aware import CacheAwareConfig
from routing.router import Router
from routing.types import RouteRequest
from gateway.flow import FlowControl, NotifyingLoadTracker
from gateway.config_flow import FlowConfig
from gateway.replicas import ReplicaSet, Replica
from gateway.metrics import GatewayMetrics
from tenancy.tiers import TierWeights
from tenancy.registry import Tenant
cal = Calibration(prior_rate=10000.0)
cal.defer_observations(True)
loads = NotifyingLoadTracker(CalibratingLoadTracker(InProcessLoadTracker(), cal, time.monotonic))
router = Router(policy_from_config(CacheAwareConfig()), InProcessPrefixIndex(4000), loads, 16, cal)
rs = ReplicaSet([Replica(f"r{i}", f"http://127.0.0.1:{9 + i}", "default", {}, True) for i in range(__R__)],
                failure_threshold=3, cooldown_s=5)
flow = FlowControl(FlowConfig(), router, rs, GatewayMetrics(), TierWeights({}), cal)
loads.on_release = flow.on_load_released
t = Tenant(id="acme")
async def step(i):
    remaining = rs.candidates(("default",), "acme")
    r = RouteRequest(tenant_id="acme", block_keys=[b"k%d" % (i % 64), b"u%d" % i, b"v%d" % i, b"w%d" % i],
                     prompt_tokens=70, max_tokens=1, block_size=16, sequences=1)
    ids = [x.id for x in remaining]
    rel = flow.release_now(t, r, ids, (), None)
    choice, ticket, _, _ = rel.as_record()
    replica = rs.get(choice.replica_id)
    att = rs.attempt(replica.id, "acme")
    loads.snapshot(replica.id).tokens
    ticket.first_byte()
    att.succeeded()
    ticket.finish()
    cal.flush()
import asyncio
LOOP = asyncio.run
"""

UPSTREAM = """
import asyncio, uvloop
from gateway.proxy import open_upstream
from gateway.upstream_pool import UpstreamPool
from gateway import json_fast
BODY_TEXT = (b'{"id":"cmpl-1","object":"text_completion","created":1,"model":"sim-model","choices":[{"index":0,'
             b'"text":" w","finish_reason":"length"}],"usage":{"prompt_tokens":64,"completion_tokens":1,'
             b'"total_tokens":65,"prompt_tokens_details":{"cached_tokens":0}}}')
class Replica(asyncio.Protocol):
    def connection_made(self, t):
        self.t = t
    def data_received(self, data):
        i = data.find(b"X-Request-Id: ")
        rid = data[i + 14:data.index(b"\\r\\n", i)]
        self.t.write(b"HTTP/1.1 200 OK\\r\\ndate: Wed, 02 Dec 2026 07:00:00 GMT\\r\\nserver: uvicorn\\r\\n"
                     b"content-length: %d\\r\\ncontent-type: application/json\\r\\nx-request-id: %s\\r\\n\\r\\n%s"
                     % (len(BODY_TEXT), rid, BODY_TEXT))
BODY = {"model": "sim-model", "prompt": " ".join("w%d" % i for i in range(64)), "max_tokens": 1, "user": "u-0123456789abcdef"}
state = {}
async def step(i):
    pool = state["pool"]
    headers = {"X-Request-Id": "%032x" % i, "traceparent": "00-0123456789abcdef0123456789abcdef-0123456789abcdef-01"}
    up = await open_upstream(pool, state["url"], BODY, headers, 30.0)
    data = up.whole_body()
    if data is None:
        data = up.first_chunk
        while not up.finished:
            data += await up.read_chunk()
    obj = json_fast.loads_answer(data)
    up.response.close()
    assert obj["usage"]["prompt_tokens"] == 64
def LOOP(coro):
    async def go():
        loop = asyncio.get_running_loop()
        srv = await loop.create_server(Replica, "127.0.0.1", 0)
        port = srv.sockets[0].getsockname()[1]
        state["url"] = "http://127.0.0.1:%d/v1/completions" % port
        state["pool"] = UpstreamPool(8, 5.0)
        await coro
        srv.close()
    uvloop.run(go())
"""

CASES = {"route": ROUTE.replace("__R__", "1"), "route3": ROUTE.replace("__R__", "3"), "upstream": UPSTREAM}


def measure(tree: Path, case: str, n: int) -> tuple[float, float]:
    """(µs of thread CPU per request, Python calls per request) of ``case`` under ``tree``."""
    code = CASES[case] + _MAIN.replace("__N__", str(n))
    env = {**os.environ, "PYTHONPATH": str(tree)}
    out = subprocess.run([sys.executable, "-c", code], cwd=tree, env=env, capture_output=True, text=True,
                         check=True, timeout=600)
    us, calls = out.stdout.strip().splitlines()[-1].split()
    return float(us), float(calls)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point: prints one row per case (median over rounds, each tree; and every round)."""
    ap = ClickOptions(prog="python -m bench.route_micro", description=__doc__.splitlines()[0])
    ap.option("--baseline", type=click.Path(path_type=Path), required=True)
    ap.option("--rounds", type=int, default=4)
    ap.option("--requests", type=int, default=4000)
    ap.option("--case", "cases", multiple=True, type=click.Choice(sorted(CASES)), help="default: all")
    args = ap.parse(argv)
    print("| case | baseline µs | this µs | saved µs | baseline calls | this calls | rounds this / baseline |")
    print("|---|---:|---:|---:|---:|---:|---|")
    for case in args.cases or sorted(CASES):
        got: dict[str, list[tuple[float, float]]] = {"this": [], "baseline": []}
        for r in range(args.rounds):
            order = (("this", REPO), ("baseline", args.baseline))
            for name, tree in order if r % 2 == 0 else order[::-1]:
                got[name].append(measure(Path(tree), case, args.requests))
        b = statistics.median(x[0] for x in got["baseline"])
        t = statistics.median(x[0] for x in got["this"])
        print(f"| {case} | {b:.1f} | {t:.1f} | {b - t:.1f} | {got['baseline'][0][1]:.0f} | {got['this'][0][1]:.0f} | "
              f"{', '.join(f'{x[0]:.1f}' for x in got['this'])} / {', '.join(f'{x[0]:.1f}' for x in got['baseline'])} |",
              flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
