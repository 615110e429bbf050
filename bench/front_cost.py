"""The front of an inference request, in-process, this tree vs another, interleaved (not a test).

``python -m bench.front_cost --baseline DIR [--rounds 6] [--requests 2000] [--prompts 1]``

Session 15 (issue 14). The front is everything :meth:`gateway.pipeline.InferencePipeline.handle` does
before it calls ``_route_and_proxy``: shed/enter, the record and its span, authentication (a
verified-token cache hit), tenant, CPU meter, limits, body read and parse, tokenize, the ledger
reservation, the HMAC prefix chain, candidates, the policy decision (a decision-cache hit), clamp
and the upstream body. Each round runs one fresh ``python`` process per tree (``PYTHONPATH`` = the
tree, the two alternating, order reversed every other round) that builds a real
:class:`gateway.build.Gateway` from :func:`sim.demo.gateway_config` (not started, no socket; the
serving configuration of ``bench.overhead``: no ``usage_cached_tokens``), replaces
``_route_and_proxy`` by a stub that records what it was given and answers 200, and calls ``handle``
on ``--requests`` distinct 64-word ``/v1/completions`` bodies (delivered as the framing guard
does: the length read and the body complete in one ASGI message). Each call's thread CPU is timed
alone (``time.thread_time_ns``); the request's end (settle, give back; no audit record: no audit worker) runs
after the clock stops. Reported per tree: µs thread CPU per request (median of the best of 5
loops per round) and the Python calls of one request (``sys.setprofile``: ``call`` + ``c_call``
events, a noise-free proxy). Warm loops: in a serving gateway the same code costs ~2-3x more.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from pathlib import Path

import click

from bench.harness import DEMO_GATEWAY_CHILD, run_child_json
from sim.click_options import ClickOptions

REPO = Path(__file__).resolve().parents[1]

_CHILD = r'''
import asyncio, json, sys, tempfile, time
from pathlib import Path
from sim.demo import DemoPaths, prepare_identity, gateway_config, bearer_headers
from gateway.config import load_config
from gateway.build import build
from gateway.pipeline import InferencePipeline
from starlette.requests import Request
from starlette.responses import Response

N = int(sys.argv[1])
WORK_PREFIX = "front-cost-"
''' + DEMO_GATEWAY_CHILD + r'''
pipe = InferencePipeline(gw)
seen = []
async def stub(request, req, rec, tenant, route_req, chains, allowed, body, held):
    held.handed_off = True  # its end runs after the clock (end())
    seen.append((rec, held))
    return Response(b"ok")
pipe._route_and_proxy = stub
loop = asyncio.new_event_loop()
def run(co):
    try:
        co.send(None)
    except StopIteration as s:
        return s.value
    return loop.run_until_complete(co)
def request(i):
    body = bodies[i]
    scope = {"type": "http", "method": "POST", "path": "/v1/completions", "query_string": b"",
             "headers": [(b"host", b"x"), (b"content-type", b"application/json"), (b"authorization", tok),
                         (b"content-length", str(len(body)).encode())],
             "client": ("127.0.0.1", 5555), "prefixgate.plain_content_length": len(body),
             "prefixgate.body_complete": True}
    msg = {"type": "http.request", "body": body, "more_body": False}
    async def receive():
        return msg
    return Request(scope, receive)
def end():
    for rec, held in seen:  # what _end gives back, without the audit record (no audit worker here)
        held.ended = True
        pipe._settle(rec, held, [])
        held.leave(gw.overload)
        held.release()
    seen.clear()
def one(i):
    r = request(i)
    t = time.thread_time_ns()
    resp = run(pipe.handle(r, "completions"))
    t = time.thread_time_ns() - t
    if resp.status_code != 200:
        raise SystemExit(f"status {resp.status_code}: {resp.body[:300]!r}")
    end()
    return t
for i in range(300):
    one(i % N)
calls = [0]
def prof(frame, event, arg):
    if event in ("call", "c_call"):
        calls[0] += 1
r = request(7)
sys.setprofile(prof); run(pipe.handle(r, "completions")); sys.setprofile(None)
end()
best = 1e18
for _ in range(5):
    tot = 0
    for i in range(N):
        tot += one(i)
    best = min(best, tot / N / 1e3)
print(json.dumps({"front": {"us": round(best, 3), "calls": calls[0] - 1}}))
'''


def measure(tree: Path, n: int) -> dict[str, dict[str, float]]:
    """One child process on ``tree``: ``{"front": {"us", "calls"}}``. Raises ``RuntimeError`` when it fails."""
    return run_child_json(tree, _CHILD, str(n))  # type: ignore[no-any-return]


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point: prints one Markdown table."""
    ap = ClickOptions("bench.front_cost", __doc__ or "")
    ap.option("--baseline", type=click.Path(path_type=Path, exists=True), required=True)
    ap.option("--this", "this", type=click.Path(path_type=Path, exists=True), default=None,
              help="the tree measured as 'this' (default: this file's tree)")
    ap.option("--rounds", type=int, default=6)
    ap.option("--requests", type=int, default=2000)
    args = ap.parse(argv)
    trees = {"this": (args.this or REPO).resolve(), "baseline": args.baseline.resolve()}
    got: dict[str, list[dict[str, dict[str, float]]]] = {k: [] for k in trees}
    for r in range(args.rounds):
        for name in (list(trees) if r % 2 == 0 else list(trees)[::-1]):
            got[name].append(measure(trees[name], args.requests))
    lines = [f"{args.rounds} rounds, {args.requests} requests; µs thread CPU per request (median of rounds), "
             "Python calls", "", "| stage | baseline µs | this µs | change | baseline calls | this calls |",
             "|---|---:|---:|---:|---:|---:|"]
    b = statistics.median(x["front"]["us"] for x in got["baseline"])
    t = statistics.median(x["front"]["us"] for x in got["this"])
    lines.append(f"| front | {b:.2f} | {t:.2f} | {100 * (t - b) / b:+.0f} % | {got['baseline'][0]['front']['calls']:.0f} "
                 f"| {got['this'][0]['front']['calls']:.0f} |")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
