"""Micro-benchmark: the routing stage of one request split by where its CPU falls, two trees
interleaved (not a test).

``python -m bench.route_stage_micro --baseline DIR [--rounds 4] [--requests 4000] [--replicas 1]``

Issue 14, session 15 (helper "route"). The setup is the gateway's (gateway/build.py): ``cache_aware``
with calibration (deferred observations), the calibrating and notifying load trackers, an
in-process prefix index of 4000 blocks, flow control with an in-process slot claim, a replica set.
Each request (five 16-token blocks, the first shared by one in 64, as the 64-word prompts of
``bench.overhead``) runs the steps ``InferencePipeline._route_and_proxy`` runs before the upstream
request is handed to the upstream client (``path``: ``FlowControl.release_now``, the record's
fields, the breaker attempt, the load snapshot), then what the replica wait runs of routing
(``wait``: ``Router.settle`` where the tree has it: ``Held.run_prep``), then the answer's end
(``end``: first byte, success, finish, the calibration flush). Per segment: thread CPU per request
(µs; median of 7 warm loops; ``time.thread_time_ns`` around each segment, the same in both trees)
and Python calls per request (``sys.setprofile`` call and c_call events: a noise-free proxy).
Each tree runs in a fresh process with ``PYTHONPATH`` set to it, the trees alternating.
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

CASE = """
import asyncio, statistics, sys, time
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
settle = getattr(router, "settle", None)
load_tokens = getattr(router, "load_tokens", None) or (lambda rid: loads.snapshot(rid).tokens)  # as the pipeline
t = Tenant(id="acme")
tt = time.thread_time_ns
acc = [0, 0, 0]
def step(i):
    remaining = rs.candidates(("default",), "acme")
    r = RouteRequest(tenant_id="acme", block_keys=[b"k%d" % (i % 64), b"u%d" % i, b"v%d" % i, b"w%d" % i,
                                                   b"x%d" % i], prompt_tokens=85, max_tokens=1, block_size=16)
    c0 = tt()
    rel = flow.release_now(t, r, [x.id for x in remaining], (), None)
    choice, ticket, _, _ = rel.as_record()
    replica = rs.get(choice.replica_id)
    att = rs.attempt(replica.id, "acme")
    load_tokens(replica.id)
    c1 = tt()
    if settle is not None:
        settle()
    c2 = tt()
    ticket.first_byte()
    att.succeeded()
    ticket.finish()
    cal.flush()
    c3 = tt()
    acc[0] += c1 - c0
    acc[1] += c2 - c1
    acc[2] += c3 - c2
def calls(n, base):
    seg = [0]
    def prof(frame, event, arg):
        if event == "call" or event == "c_call":
            seg[0] += 1
    global tt
    counts = [0, 0, 0]
    real = tt
    marks = []
    def mark():
        marks.append(seg[0])
        return 0
    tt = mark
    sys.setprofile(prof)
    for i in range(n):
        marks.clear()
        step(base + i)
        counts[0] += marks[1] - marks[0]
        counts[1] += marks[2] - marks[1]
        counts[2] += marks[3] - marks[2]
    sys.setprofile(None)
    tt = real
    return [c / n for c in counts]
N = __N__
for i in range(N):
    step(i)
runs = []
for k in range(7):
    acc[:] = [0, 0, 0]
    for i in range(N):
        step((k + 1) * N + i)
    runs.append([a / N / 1000.0 for a in acc])
cs = calls(1000, 9 * N)
med = [statistics.median(r[j] for r in runs) for j in range(3)]
print(" ".join(f"{x:.3f}" for x in med + cs))
"""


def measure(tree: Path, n: int, replicas: int) -> list[float]:
    """[path µs, wait µs, end µs, path calls, wait calls, end calls] per request under ``tree``."""
    code = CASE.replace("__R__", str(replicas)).replace("__N__", str(n))
    env = {**os.environ, "PYTHONPATH": str(tree)}
    out = subprocess.run([sys.executable, "-c", code], cwd=tree, env=env, capture_output=True, text=True,
                         check=True, timeout=600)
    return [float(x) for x in out.stdout.strip().splitlines()[-1].split()]


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point: one row per segment (medians over rounds; and every round's figure)."""
    ap = ClickOptions(prog="python -m bench.route_stage_micro", description=__doc__.splitlines()[0])
    ap.option("--baseline", type=click.Path(path_type=Path), required=True)
    ap.option("--this", "this", type=click.Path(path_type=Path), default=REPO, help="default: this tree")
    ap.option("--rounds", type=int, default=4)
    ap.option("--requests", type=int, default=4000)
    ap.option("--replicas", type=int, default=1)
    args = ap.parse(argv)
    got: dict[str, list[list[float]]] = {"this": [], "baseline": []}
    for r in range(args.rounds):
        order = (("this", Path(args.this)), ("baseline", Path(args.baseline)))
        for name, tree in order if r % 2 == 0 else order[::-1]:
            got[name].append(measure(tree, args.requests, args.replicas))
    print(f"replicas {args.replicas}, {args.requests} requests x 7 loops, {args.rounds} rounds; "
          f"this {args.this}, baseline {args.baseline}")
    print("| segment | baseline µs | this µs | saved µs | baseline calls | this calls | rounds this / baseline |")
    print("|---|---:|---:|---:|---:|---:|---|")
    for j, seg in enumerate(("path", "wait", "end")):
        b = statistics.median(x[j] for x in got["baseline"])
        t = statistics.median(x[j] for x in got["this"])
        print(f"| {seg} | {b:.1f} | {t:.1f} | {b - t:.1f} | {got['baseline'][0][j + 3]:.0f} | "
              f"{got['this'][0][j + 3]:.0f} | {', '.join(f'{x[j]:.1f}' for x in got['this'])} / "
              f"{', '.join(f'{x[j]:.1f}' for x in got['baseline'])} |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
