"""Micro-benchmark: the session 7 pipeline cuts, this tree vs another, interleaved (not a test).

``python -m bench.pipeline_cuts_micro --baseline DIR [--rounds 3] [--name s7-cost]``

Each case runs in a fresh ``python`` process with ``PYTHONPATH`` set to one tree (this one,
or ``--baseline``: e.g. ``git archive main | tar -x -C DIR``), the two trees alternating
``--rounds`` times; a case prints the best of 7 repetitions of a warm loop, in µs of thread
CPU per request (``time.thread_time``). Reported: the median over the rounds per tree and
their difference. Warm-loop figures: in the gateway under load the same code costs ~2-3x
more (cache misses between stages; docs/benchmarks.md, session 6).

Cases (one request's share of each):

* ``alerts``: the policy's read of the active concentration alerts (``AuditHub.active_alerts``)
  plus one ``ConcentrationMonitor.observe`` (2 replicas, one pool);
* ``admission``: ``Admission.request_bounds``, ``check_prompt`` (ledger reservation and its
  counters), ``lower_reservation``, ``settle`` (memory backend, token limits on);
* ``pep``: ``PolicyEnforcementPoint.decide`` on a decision-cache hit (2 candidates, no alert);
* ``flow``: flow control's fast path (``_release_now``: placement check and route, 3 replicas,
  ``flow.replica_max_queued_prefill_tokens`` set) and the ticket's finish;
* ``prefix``: ``block_hash_chain`` of 80 tokens (5 blocks of 16) and the audit fingerprint;
* ``plain_answer`` (session 9): the plain path of one request after its routing decision, without
  sockets: the inference routes (framing guard, body read) over a stub pipeline that runs
  ``open_upstream`` (inside ``unless_client_leaves``) on a stub pool whose answer (the sim replica's
  ~250 B JSON) is whole when its head arrives, ``plain_response`` and ``Held.end_attempt``, then the
  answer's two ASGI messages to a no-op ``send``;
* ``sse_event`` (session 9): ``SseScanner.feed`` of one LF-only chat chunk event (~170 B);
* ``route_step``, ``route_step3`` (session 8): the pipeline's route step as each tree's pipeline runs it
  (flow control on, ``cache_aware``, calibration, a :class:`ConnectionLoss` in the scope as on the
  guarded listener; 1 or 3 replicas): the release (``release_now`` where the tree has it, else
  ``release`` under ``unless_client_leaves``), the breaker attempt, first byte, finish and the
  calibration flush; 64-word prompts of 4 blocks, the first shared by 1 in 64 requests.

Results: ``bench/results/pipeline_cuts_micro-<name>.{json,md}``.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

import click

from sim.click_options import ClickOptions

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "bench" / "results"

_LOOP = """
import time
def best(step, n={n}):
    def run():
        c0 = time.thread_time()
        for i in range(n):
            step(i)
        return (time.thread_time() - c0) / n * 1e6
    return min(run() for _ in range(7))
"""

CASES: dict[str, str] = {
    "alerts": """
from audit.concentration import ConcentrationMonitor
from gateway.auditing import AuditHub
mon = ConcentrationMonitor(pools={"default": ["r0", "r1"]})
hub = AuditHub(None, monitor=mon)
def step(i):
    hub.active_alerts()
    mon.observe("default", "r0" if i & 1 else "r1", 100, 128, 28, time.monotonic(), tenant="acme")
print(best(step))
""",
    "admission": """
from gateway.admission import Admission
from gateway.config_state import StateConfig
from gateway.metrics import GatewayMetrics
from tenancy.registry import Tenant, TenantRegistry
from tenancy.shared import make_limits
from tenancy.tokenizer import WordTokenizer
adm = Admission(TenantRegistry.from_config([]), make_limits(StateConfig()), WordTokenizer(), ["m"],
                GatewayMetrics(), max_messages=256, max_output_tokens=4096, default_max_prompt_tokens=8192)
t = Tenant(id="acme", max_prompt_tokens=1000, prompt_tokens_per_s=1e9, output_tokens_per_s=1e9)
usage = {"prompt_tokens": 80, "completion_tokens": 1}
def step(i):
    adm.request_bounds(t)
    co = adm.check_prompt(t, 80, 1, 16)
    try:
        co.send(None)
    except StopIteration as stop:
        res = stop.value
    adm.lower_reservation(res, 1)
    adm.settle(res, usage=usage, progress="unknown", relayed_output=0)
print(best(step))
""",
    "pep": """
from tests.policy.test_s6_pep_key import _identity, _pep
from gateway.replicas import Replica
from gateway.request import InferenceRequest
from tenancy.registry import Tenant
pep = _pep([])[0]
ident = _identity("spiffe://t/ns/a")
t = Tenant(id="acme", models=frozenset({"m"}), pools=frozenset({"p"}))
cands = [Replica("r0", "http://x", pool="p"), Replica("r1", "http://y", pool="p")]
req = InferenceRequest("completions", "m", False, 5, False, {}, "")
def step(i):
    co = pep.decide(ident, t, req, 64, cands, "/v1/completions", 0)
    try:
        co.send(None)
    except StopIteration:
        pass
print(best(step))
""",
    "flow": """
from gateway.config_flow import FlowConfig
try:
    from gateway.flow_waiting import Waiting as _Waiting
except ImportError:  # a tree before session 8's split
    from gateway.flow import _Waiting
from tests.gateway.test_s2_flow_dispatch import make, req
flow = make(FlowConfig(replica_max_queued_prefill_tokens=10**9, replica_max_running_requests=10**6), n=3)
ids = ["r0", "r1", "r2"]
def step(i):
    w = _Waiting("a", 1.0, req(prompt=100, keys=(b"k%d" % (i % 64), b"u%d" % i)), ids, ())
    flow._release_now(w)
    w.result[1].finish()
print(best(step))
""",
    "prefix": """
from gateway.prefix_keys import ChainView, PrefixKeys
from tenancy.keys import PrefixChains
from tenancy.prefix import block_hash_chain
key = bytes(range(32))
toks = [(i * 2654435761) & 0xFFFFFFFF for i in range(80)]
def step(i):
    ch = block_hash_chain(key, toks, 16, key_id="v1")
    PrefixKeys.prefix_fingerprint(ChainView(PrefixChains(current=tuple(ch), kid="v1", previous=())))
print(best(step))
""",
}

#: the timing loop of the async cases (``step(i)`` defined by the case): best of 7, CPU µs per step
_ASYNC_MAIN = """
async def main(n):
    best = 1e9
    for _ in range(7):
        c0 = time.thread_time()
        for i in range(n):
            await step(i)
        best = min(best, (time.thread_time() - c0) / n * 1e6)
    print(best)
asyncio.run(main(__N__))
"""

_ROUTE_STEP = """
import asyncio
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
from gateway.client_io import ConnectionLoss, LOSS_KEY, unless_client_leaves
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
class Req:
    scope = {LOSS_KEY: ConnectionLoss()}
request = Req()
fast = hasattr(flow, "release_now")
async def step(i):
    remaining = rs.candidates(("default",), "acme")
    r = RouteRequest(tenant_id="acme", block_keys=[b"k%d" % (i % 64), b"u%d" % i, b"v%d" % i, b"w%d" % i],
                     prompt_tokens=70, max_tokens=1, block_size=16, sequences=1)
    ids = [x.id for x in remaining]
    rel = flow.release_now(t, r, ids, (), None) if fast else None
    if rel is None:
        kw = {"tried": True} if fast else {}
        rel = await unless_client_leaves(request, flow.release(t, r, ids, (), 1e18, None, **kw))
    choice, ticket, _, _ = rel.as_record()
    att = rs.attempt(choice.replica_id, "acme")
    ticket.first_byte()
    att.succeeded()
    ticket.finish()
    cal.flush()
"""
_PLAIN_ANSWER = """
import asyncio
from gateway.body_budget import BodyBudget
from gateway.body_guard import BODY_COMPLETE_KEY
from gateway.client_io import ConnectionLoss, LOSS_KEY, unless_client_leaves
from gateway.framing import FramingGuard
from gateway.held import Held
from gateway.inference_asgi import InferenceRoutes
from gateway.pipeline_answer import plain_response
from gateway.proxy import open_upstream
from gateway.record import RequestRecord
from gateway.request import read_body
from gateway.upstream_response import UpstreamResponse
UP = (b'{"id":"cmpl-1","object":"text_completion","created":1,"model":"sim-model","choices":[{"index":0,'
      b'"text":" w","finish_reason":"length"}],"usage":{"prompt_tokens":64,"completion_tokens":1,'
      b'"total_tokens":65,"prompt_tokens_details":{"cached_tokens":0}}}')
BODY = {"model": "sim-model", "prompt": " ".join("w%d" % i for i in range(64)), "max_tokens": 1}
RAW = b'{"model":"sim-model","prompt":"' + b" ".join(b"w%d" % i for i in range(64)) + b'","max_tokens":1}'
class Conn:
    def resume(self): pass
    def abort(self): pass
class Pool:  # the replica's answer is whole when its head arrives (a short answer in one read)
    async def request(self, method, url, data, headers, deadline=None):
        r = UpstreamResponse(Conn())
        r.status, r.headers = 200, {"content-type": "application/json", "content-length": str(len(UP))}
        r._head_seen = True
        r._feed(UP)
        r._finish()
        return r
class Attempt:
    retry = True
    def succeeded(self, served=True): pass
    def release(self): pass
class Limits: client_write_stall_s = 10.0
class Cfg: limits = Limits()
class Recorder:
    def hand_off(self): pass
pool, attempt = Pool(), Attempt()
rec = RequestRecord(request_id="0123456789abcdef0123456789abcdef", endpoint="/v1/completions",
                    client_addr="127.0.0.1", t0=0.0)
class Pipeline:
    cfg = Cfg()
    async def handle(self, request, endpoint):
        await read_body(request, 1 << 20, 30.0)
        held = Held()
        held.attempt = attempt
        headers = {"X-Request-Id": rec.request_id, "traceparent": "00-0123456789abcdef0123456789abcdef-0123456789abcdef-01"}
        held.up = await unless_client_leaves(request, open_upstream(pool, "http://r/v1/completions", BODY, headers, 30.0))
        resp = await plain_response(request, rec, held, 30.0, None)
        held.end_attempt()
        return resp
framing = dict(max_drain_bytes=65536, drain_timeout_s=30.0, budget=BodyBudget(1 << 30, 1 << 28))
routes = InferenceRoutes(FramingGuard(None, **framing), Pipeline(), Recorder())
HEADERS = [(b"host", b"gw"), (b"authorization", b"Bearer " + b"x" * 600), (b"content-type", b"application/json"),
           (b"content-length", str(len(RAW)).encode())]
sent = []
async def send(message):
    sent.append(message)
async def step(i):
    scope = {"type": "http", "asgi": {"version": "3.0", "spec_version": "2.4"}, "http_version": "1.1",
             "method": "POST", "scheme": "http", "path": "/v1/completions", "raw_path": b"/v1/completions",
             "query_string": b"", "root_path": "", "headers": HEADERS, "client": ("127.0.0.1", 5555),
             "server": ("127.0.0.1", 8080), LOSS_KEY: ConnectionLoss(), BODY_COMPLETE_KEY: True}
    msgs = [{"type": "http.request", "body": RAW, "more_body": False}]
    async def receive():
        return msgs.pop() if msgs else {"type": "http.disconnect"}
    await routes(scope, receive, send)
    assert sent[-1]["body"] == UP
    sent.clear()
"""
CASES["plain_answer"] = _PLAIN_ANSWER + _ASYNC_MAIN

CASES["sse_event"] = """
from gateway.sse import SseScanner
s = SseScanner(keep_usage_chunk=False)
s.feed(b": ok\\n\\n")
EV = (b'data: {"id":"cmpl-1","object":"chat.completion.chunk","created":1,"model":"sim-model","choices":'
      b'[{"index":0,"delta":{"content":" w"},"finish_reason":null}]}\\n\\n')
def step(i):
    s.feed(EV)
print(best(step))
"""
CASES["route_step"] = _ROUTE_STEP.replace("__R__", "1") + _ASYNC_MAIN
CASES["route_step3"] = _ROUTE_STEP.replace("__R__", "3") + _ASYNC_MAIN


def measure(tree: Path, case: str, n: int) -> float:
    """µs of thread CPU per request of ``case`` under ``tree`` (best of 7 warm loops of ``n``)."""
    code = _LOOP.format(n=n) + CASES[case].replace("__N__", str(n))
    env = {**os.environ, "PYTHONPATH": str(tree)}
    out = subprocess.run([sys.executable, "-c", code], cwd=tree, env=env, capture_output=True, text=True,
                         check=True, timeout=600)
    return float(out.stdout.strip().splitlines()[-1])


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point."""
    ap = ClickOptions(prog="python -m bench.pipeline_cuts_micro", description=__doc__.splitlines()[0])
    ap.option("--baseline", type=click.Path(path_type=Path), required=True)
    ap.option("--rounds", type=int, default=3)
    ap.option("--requests", type=int, default=20000, help="loop length per repetition")
    ap.option("--case", "cases", multiple=True, type=click.Choice(sorted(CASES)), help="default: all")
    ap.option("--name", default="s7-cost")
    args = ap.parse(argv)
    rows: dict[str, dict[str, list[float]]] = {}
    for case in args.cases or sorted(CASES):
        rows[case] = {"this": [], "baseline": []}
        for r in range(args.rounds):
            order = (("this", REPO), ("baseline", args.baseline))
            for name, tree in order if r % 2 == 0 else order[::-1]:
                rows[case][name].append(measure(Path(tree), case, args.requests))
    doc = {"benchmark": "pipeline_cuts_micro", "baseline": str(args.baseline), "rounds": args.rounds,
           "load_average": os.getloadavg(), "cases": rows}
    lines = [f"# Session 7 pipeline cuts, warm loops (`python -m bench.pipeline_cuts_micro`, baseline "
             f"{args.baseline})", "",
             f"µs of thread CPU per request, best of 7 loops of {args.requests}; median of {args.rounds} "
             f"interleaved rounds; load average {doc['load_average'][0]:.1f}.", "",
             "| case | baseline µs | this µs | saved µs | rounds (this / baseline) |", "|---|---:|---:|---:|---|"]
    for case, got in rows.items():
        b, t = statistics.median(got["baseline"]), statistics.median(got["this"])
        lines.append(f"| {case} | {b:.2f} | {t:.2f} | {b - t:.2f} | "
                     f"{', '.join(f'{x:.2f}' for x in got['this'])} / {', '.join(f'{x:.2f}' for x in got['baseline'])} |")
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / f"pipeline_cuts_micro-{args.name}.json").write_text(json.dumps(doc, indent=2) + "\n")
    (RESULTS / f"pipeline_cuts_micro-{args.name}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
