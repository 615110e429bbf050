"""The ``pre`` window of a plain request in process, this tree vs others, interleaved (not a test).

``python -m bench.pre_path --baseline DIR [--aa DIR] [--rounds 6] [--requests 1500] [--name NAME]``
``python -m bench.pre_path --profile FILE [--requests 3000]`` (this tree only: cProfile of the window)

Issue 14, session 16. :mod:`bench.critical_path` measures the gateway's ``pre`` window (the request's
arrival at the inference routes -> the upstream request written) in a serving process, where the
machine's noise is ±50 µs; this one measures the same window without sockets. Each tree runs in a
fresh ``python`` process (``PYTHONPATH`` = the tree) that builds a real :class:`gateway.build.Gateway`
from :func:`sim.demo.gateway_config` (one replica, the serving configuration of ``bench.overhead``:
JWT-SVID, HMAC chain, embedded OPA, flow control; only its audit hub started, the worker process taking
the events; no health checks) and
its public ASGI app (:func:`gateway.app.build_public_app`), opens its upstream pool on a uvloop loop
whose ``create_connection`` (a public method, the only thing replaced) gives a transport that answers
each write in the next loop step with the simulated replica's plain answer, and calls the app with the
scope the guarded listener makes (a :class:`gateway.client_io.ConnectionLoss`, the body complete in one
message, the plain ``Content-Length`` read) for ``--requests`` distinct 64-word ``/v1/completions``
bodies. Per request: thread CPU (``time.thread_time_ns``) from the app call to the return of
``UpstreamConnection.send`` (``pre``; the same wrapper in every tree) and of the whole call
(``total``: pre, the answer, the request's end, without sockets). Reported per tree: the median over
rounds of the median per request of the best of 3 passes, and the Python calls of one request's
``pre`` (``sys.setprofile``: ``call`` + ``c_call`` events, noise-free). The trees alternate (order
reversed every other round); an A/A copy of this tree (``--aa``) gives the noise beside the A/B.
Warm loop, no kernel send: in a serving gateway the same code costs ~2x more.
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import click

from bench.harness import ANSWERING_LOOP_CHILD, DEMO_GATEWAY_CHILD, replica_answer, run_child_json
from sim.click_options import ClickOptions

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "bench" / "results"

BODY = (b'{"id":"cmpl-5f1e2d3c4b5a69788796a5b4","object":"text_completion","created":1764670000,'
        b'"model":"sim-model","choices":[{"index":0,"text":"lorem","logprobs":null,"finish_reason":'
        b'"length"}],"usage":{"prompt_tokens":64,"completion_tokens":1,"total_tokens":65}}')
#: the simulated replica's plain answer, the transport's answer to each write
ANSWER = replica_answer(BODY, "Keep-Alive: timeout=75")

_CHILD_HEAD = r'''
import asyncio, cProfile, json, logging, sys, tempfile, time
from pathlib import Path
import uvloop
from sim.demo import DemoPaths, prepare_identity, gateway_config, bearer_headers
from gateway.config import load_config
from gateway.build import build
from gateway.app import build_public_app
from gateway.client_io import LOSS_KEY, ConnectionLoss
from gateway.upstream_conn import UpstreamConnection
import gateway
assert gateway.__file__.startswith(TREE), gateway.__file__
logging.disable(logging.CRITICAL)
'''

#: the rest of the child, after :data:`bench.harness.ANSWERING_LOOP_CHILD`: the gateway (:data:`bench.harness.DEMO_GATEWAY_CHILD`)
_CHILD = 'WORK_PREFIX = "pre-path-"\n' + DEMO_GATEWAY_CHILD + r'''
app = build_public_app(gw, manage_lifecycle=False)
loss = ConnectionLoss()
mark = [0]
sent = UpstreamConnection.send
def timed_send(self, *a, **k):
    out = sent(self, *a, **k)
    mark[0] = time.thread_time_ns()
    return out
UpstreamConnection.send = timed_send
statuses = []

def scope_of(body):
    return {"type": "http", "asgi": {"version": "3.0", "spec_version": "2.3"}, "http_version": "1.1",
            "method": "POST", "scheme": "http", "path": "/v1/completions", "raw_path": b"/v1/completions",
            "root_path": "", "query_string": b"", "server": ("127.0.0.1", 1), "client": ("127.0.0.1", 5555),
            "headers": [(b"host", b"127.0.0.1:1"), (b"content-type", b"application/json"), (b"authorization", tok),
                        (b"content-length", str(len(body)).encode())],
            "prefixgate.body_complete": True, LOSS_KEY: loss}

async def one(i):
    body = bodies[i]
    scope = scope_of(body)
    msg = {"type": "http.request", "body": body, "more_body": False}
    async def receive():
        return msg
    async def send(message):
        if message["type"] == "http.response.start":
            statuses.append(message["status"])
        elif statuses[-1] != 200:
            statuses.append(message.get("body", b"")[:300])
    mark[0] = 0
    t0 = time.thread_time_ns()
    await app(scope, receive, send)
    t1 = time.thread_time_ns()
    if statuses[-1] != 200 or not mark[0]:
        raise SystemExit(f"request {i}: {statuses[-3:]}")
    return mark[0] - t0, t1 - t0

async def main():
    gw.upstream.open_session()
    await gw.audit.start()  # the audit worker process: its pipe takes the events (else the log fills and refuses)
    try:
        await measure_all()
    finally:
        await gw.audit.close()

async def measure_all():
    for i in range(300):
        await one(i % N)
    if PROFILE:
        prof = cProfile.Profile(time.thread_time_ns, 1e-9)
        def prof_send(self, *a, **k):
            out = sent(self, *a, **k)
            prof.disable()
            return out
        UpstreamConnection.send = prof_send
        for i in range(N):
            body = bodies[i]
            scope = scope_of(body)
            msg = {"type": "http.request", "body": body, "more_body": False}
            async def receive():
                return msg
            async def send(message):
                pass
            prof.enable()
            await app(scope, receive, send)
            prof.disable()
        prof.dump_stats(PROFILE)
        print(json.dumps({"profiled": N}))
        return
    calls = [0, 0]
    def count(frame, event, arg):
        if event in ("call", "c_call"):
            calls[0] += 1
    def counting_send(self, *a, **k):
        out = sent(self, *a, **k)
        sys.setprofile(None)
        calls[1] = calls[0]
        return out
    UpstreamConnection.send = counting_send
    body = bodies[7]
    scope = scope_of(body)
    msg = {"type": "http.request", "body": body, "more_body": False}
    async def receive():
        return msg
    async def send(message):
        pass
    sys.setprofile(count)
    await app(scope, receive, send)
    sys.setprofile(None)
    UpstreamConnection.send = timed_send
    best = None
    for _ in range(3):
        got = [await one(i) for i in range(N)]
        pre = statistics.median(g[0] for g in got) / 1e3
        tot = statistics.median(g[1] for g in got) / 1e3
        if best is None or pre < best[0]:
            best = (pre, tot)
    print(json.dumps({"pre_us": round(best[0], 2), "total_us": round(best[1], 2), "pre_calls": calls[1]}))

asyncio.Runner(loop_factory=Loop).run(main())
'''


def measure(tree: Path, n: int, profile: str | None = None) -> dict[str, Any]:
    """One child process on ``tree``; returns its JSON line. Raises ``RuntimeError`` when it fails."""
    code = (f"TREE = {str(tree)!r}\nN = {n}\nPROFILE = {profile!r}\nimport statistics\n" + _CHILD_HEAD
            + f"ANSWER = {ANSWER!r}\n" + ANSWERING_LOOP_CHILD + _CHILD)
    return run_child_json(tree, code)  # type: ignore[no-any-return]


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point: the table to stdout and ``bench/results/<name>.{json,md}``."""
    ap = ClickOptions("bench.pre_path", __doc__ or "")
    ap.option("--baseline", type=click.Path(path_type=Path, exists=True), default=None)
    ap.option("--aa", type=click.Path(path_type=Path, exists=True), default=None, help="a copy of this tree")
    ap.option("--rounds", type=int, default=6)
    ap.option("--requests", type=int, default=1500)
    ap.option("--profile", default=None, help="cProfile the pre window of this tree into FILE (thread CPU)")
    ap.option("--out", type=click.Path(path_type=Path), default=RESULTS)
    ap.option("--name", default="pre_path")
    args = ap.parse(argv)
    if args.profile:
        print(measure(REPO, args.requests, str(Path(args.profile).resolve())))
        return 0
    if args.baseline is None:
        raise SystemExit("--baseline is required (or --profile)")
    trees = {"this": REPO, "baseline": args.baseline.resolve(), **({"aa": args.aa.resolve()} if args.aa else {})}
    runs: dict[str, list[dict[str, Any]]] = {k: [] for k in trees}
    for r in range(args.rounds):
        for label in (list(trees) if r % 2 == 0 else list(trees)[::-1]):
            runs[label].append(measure(trees[label], args.requests))
        print(f"round {r + 1}/{args.rounds}: " + ", ".join(
            f"{k} pre {v[-1]['pre_us']:.1f} total {v[-1]['total_us']:.1f}" for k, v in runs.items()), flush=True)
    med = {k: {m: statistics.median(x[m] for x in v) for m in ("pre_us", "total_us", "pre_calls")}
           for k, v in runs.items()}
    diff = {k: {m: statistics.median(a[m] - b[m] for a, b in zip(runs["this"], v, strict=True))
                for m in ("pre_us", "total_us")} for k, v in runs.items() if k != "this"}
    doc = {"benchmark": "pre_path", "trees": {k: str(v) for k, v in trees.items()}, "rounds": args.rounds,
           "requests": args.requests, "runs": runs, "median": med, "this_minus": diff}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"{args.name}.json").write_text(json.dumps(doc, indent=2) + "\n")
    lines = [f"# The pre window in process (`python -m bench.pre_path`), {args.name}", "",
             f"{args.rounds} interleaved rounds, {args.requests} requests, best of 3 passes; thread CPU µs per request "
             "(median per request), Python calls of one request's pre.", "",
             "| tree | path | pre µs | total µs | pre calls |", "|---|---|---:|---:|---:|"]
    for k, m in med.items():
        lines.append(f"| {k} | `{trees[k]}` | {m['pre_us']:.1f} | {m['total_us']:.1f} | {m['pre_calls']:.0f} |")
    lines += ["", "Median per-round difference, this minus: " + "; ".join(
        f"{k}: pre {d['pre_us']:+.1f} µs, total {d['total_us']:+.1f} µs" for k, d in diff.items()) + "."]
    (args.out / f"{args.name}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
