"""The HTTP edge's CPU per request, in process: PrefixGate's vs the passthrough's, this tree vs another (not a test).

``python -m bench.edge_cpu --baseline DIR [--rounds 3] [--requests 2000] [--name edge_cpu] [--split]``

The edge is everything from the socket's bytes to the pipeline and back, without the pipeline's
own stages (authentication, admission, tokenize, keys, policy, routing, upstream): the guarded
httptools protocol of ``prefixgate serve`` (gateway/http_guard.py, body guard, coalescing and
lingering transports), then either

* **prefixgate**: the framing guard (gateway/framing.py) and the inference routes
  (gateway/inference_asgi.py) over a stub pipeline that reads the body (``read_body``), parses it
  (``parse_inference_request``), parses a replica's answer (``json_fast.loads_object``) and answers
  it (``gateway.pipeline_answer.PlainAnswer`` where the tree has it, else a Starlette ``Response``,
  with ``X-Request-Id``), as the real pipeline does; or
* **passthrough**: bench/overhead.py's feature-less Starlette app's edge (router, ``request.body()``,
  ``Response``), without its upstream call;
* **floor** (session 14): the stub pipeline's work (body parse, answer parse, the same answer bytes) on
  a bare ``asyncio.Protocol`` with httptools (bench/floor_proxy.py's shape): no uvicorn, no ASGI, no
  guards. PrefixGate's edge minus this is what uvicorn's ASGI cycle and the guards cost.

``--native`` (session 22): ``--split`` plus ``native-trivial`` and ``native-prefixgate``, the trivial app and the
prefixgate edge's app under the optimistic front of bench/native_front.py (no uvicorn cycle, no guards).

``--split`` (session 18, the split of the edge's cost): ``uvicorn-trivial`` (uvicorn's own
``HttpToolsProtocol``, no guards, a trivial ASGI app: ``receive`` then a plain answer's two sends),
``guarded-trivial`` (the guarded protocol of gateway/http_guard.py, same app), ``this`` (the full PrefixGate
edge), ``baseline`` and ``floor``; guarded-trivial - uvicorn-trivial is what the protocol guards cost per
request. Pass an A/A tree of this code as ``--baseline`` for the noise beside the A/B.

Requests: ``bench.loadgen``'s bodies (64 unique words, ``max_tokens`` 1) with a 600-byte bearer token,
fed to the protocol on one keep-alive connection over a fake transport, on uvloop. Each figure is
the best of 9 passes of ``--requests`` requests, in thread CPU µs per request; each tree runs in its
own process, the targets interleaved (this, baseline, passthrough) ``--rounds`` times, and the medians
are reported. Warm-loop figures: in a serving process the same code costs 2-3x more (caches,
other work between requests), so compare within one run only.
Results: ``bench/results/<name>.{json,md}``.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import click

from sim.click_options import ClickOptions

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "bench" / "results"
TARGETS = ("this", "baseline", "passthrough", "floor")
#: ``--split`` (session 18): target -> (tree: "this" or "baseline", child kind)
SPLIT = {"this": ("this", "prefixgate"), "baseline": ("baseline", "prefixgate"),
         "uvicorn-trivial": ("this", "trivial-uvicorn"), "guarded-trivial": ("this", "trivial"),
         "floor": ("this", "floor")}
#: ``--native`` (session 22): the split's targets plus the same two apps under bench/native_front.py
NATIVE = {**SPLIT, "native-trivial": ("this", "trivial-native"), "native-prefixgate": ("this", "prefixgate-native")}

_CHILD = r'''
import asyncio, sys, time
sys.path.insert(0, TREE)
import uvicorn, uvloop
from uvicorn.server import ServerState
from starlette.responses import Response
from bench.loadgen import _Body
from gateway.body_budget import BodyBudget
from gateway.framing import FramingGuard
from gateway.http_guard import guarded_protocol
from gateway.inference_asgi import InferenceRoutes
from gateway.request import parse_inference_request, read_body
from gateway import json_fast
try:
    from gateway.pipeline_answer import PlainAnswer
except ImportError:  # a tree before session 9
    PlainAnswer = None

UP = (b'{"id":"cmpl-1","object":"text_completion","created":1,"model":"sim-model","choices":[{"index":0,'
      b'"text":" w","finish_reason":"length"}],"usage":{"prompt_tokens":64,"completion_tokens":1,'
      b'"total_tokens":65,"prompt_tokens_details":{"cached_tokens":0}}}')

class Limits: client_write_stall_s = 10.0
class Cfg: limits = Limits()
class Recorder:
    def hand_off(self): pass
class Pipeline:
    cfg = Cfg()
    async def handle(self, request, endpoint):
        raw = await read_body(request, 1 << 20, 30.0)
        parse_inference_request(raw, endpoint, 32, max_messages=64, max_batch_prompts=16, max_json_items=10000)
        json_fast.loads_object(UP)
        if PlainAnswer is not None:  # session 9 on: the pipeline's own plain answer
            return PlainAnswer(UP, "0123456789abcdef")
        return Response(UP, media_type="application/json", headers={"X-Request-Id": "0123456789abcdef"})

def passthrough():
    from starlette.applications import Starlette
    from starlette.routing import Route
    async def forward(request):
        await request.body()
        return Response(UP, media_type="application/json")
    return Starlette(routes=[Route("/v1/completions", forward, methods=["POST"])])

class Transport(asyncio.Transport):
    def __init__(self):
        super().__init__(); self.out = []; self.closing = False; self.done = None
    def get_extra_info(self, name, default=None):
        return {"peername": ("127.0.0.1", 5555), "sockname": ("127.0.0.1", 8080)}.get(name, default)
    def write(self, data):
        self.out.append(bytes(data))
        if self.done is not None and not self.done.done():
            self.done.set_result(None)
    def is_closing(self): return self.closing
    def close(self): self.closing = True
    def abort(self): self.closing = True
    def pause_reading(self): pass
    def resume_reading(self): pass
    def get_write_buffer_size(self): return 0

bodies = _Body(False)
raws = [bodies() for _ in range(REQUESTS)]
auth = b"Bearer " + b"x" * 600
reqs = [b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1:8080\r\nUser-Agent: wrk\r\nAuthorization: " + auth
        + b"\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(r) + r for r in raws]
def prefixgate():
    framing = dict(max_drain_bytes=65536, drain_timeout_s=30.0, budget=BodyBudget(1 << 30, 1 << 28))
    if hasattr(FramingGuard, "open"):  # session 8 on: the routes in front of the framing guard
        return InferenceRoutes(FramingGuard(None, **framing), Pipeline(), Recorder())
    return FramingGuard(InferenceRoutes(None, Pipeline(), Recorder()), **framing)
class Floor(asyncio.Protocol):
    """The floor (session 14): the stub pipeline's work on a bare httptools protocol, no uvicorn, no ASGI."""
    def __init__(self):
        import httptools
        self.parser = httptools.HttpRequestParser(self); self.body = []
    def connection_made(self, transport): self.transport = transport
    def data_received(self, data): self.parser.feed_data(data)
    def on_message_begin(self): self.body = []
    def on_body(self, body): self.body.append(body)
    def on_message_complete(self):
        raw = b"".join(self.body)
        parse_inference_request(raw, "completions", 32, max_messages=64, max_batch_prompts=16, max_json_items=10000)
        json_fast.loads_object(UP)
        self.transport.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nX-Request-Id: 0123456789abcdef"
                             b"\r\nContent-Length: %d\r\n\r\n" % len(UP) + UP)

class Trivial:
    """The split's trivial ASGI app (session 18): receive, then a plain answer's two sends."""
    async def __call__(self, scope, receive, send):
        await receive()
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"application/json"),
                    (b"x-request-id", b"0123456789abcdef"), (b"content-length", b"%d" % len(UP))]})
        await send({"type": "http.response.body", "body": UP})

app = (passthrough() if KIND == "passthrough" else None if KIND == "floor" else Trivial() if KIND.startswith("trivial")
       else prefixgate())
if KIND.endswith("-native"):  # session 22: the same app under bench/native_front.py (no uvicorn, no guards)
    from bench.native_front import NativeFront

async def main():
    loop = asyncio.get_running_loop()
    cls = guarded_protocol("httptools")
    if KIND == "trivial-uvicorn":  # uvicorn's own protocol, unguarded
        from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol as cls
    config = uvicorn.Config(app or passthrough(), http=cls, proxy_headers=False, lifespan="off", log_level="warning",
                            access_log=False, server_header=False)
    config.load()
    proto = (Floor() if KIND == "floor" else NativeFront(app, "127.0.0.1", 8080).protocol() if KIND.endswith("-native")
             else cls(config=config, server_state=ServerState(), app_state={}, _loop=loop))
    t = Transport()
    proto.connection_made(t)
    best = float("inf")
    for _ in range(9):
        t0 = time.thread_time_ns()
        for r in reqs:
            t.done = loop.create_future()
            proto.data_received(r)
            await t.done
            await asyncio.sleep(0)
        best = min(best, (time.thread_time_ns() - t0) / len(reqs) / 1000)
        assert any(o.startswith(b"HTTP/1.1 200") for o in t.out[-2:]), t.out[-2:]
        t.out.clear()
    print(best)
uvloop.run(main())
'''


def one(tree: Path, kind: str, requests: int) -> float:
    """Best-of-9 µs/request of ``kind`` (``prefixgate`` or ``passthrough``) on the code of ``tree``."""
    code = f"TREE = {str(tree)!r}\nKIND = {kind!r}\nREQUESTS = {requests}\n" + _CHILD
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True, cwd=str(tree))
    return float(out.stdout.strip().splitlines()[-1])


def run(baseline: Path, rounds: int, requests: int, split: bool = False, native: bool = False) -> dict[str, Any]:
    """The interleaved rounds (module doc); returns the result document."""
    plan = NATIVE if native else SPLIT if split else {"this": ("this", "prefixgate"), "baseline": ("baseline", "prefixgate"),
                                "passthrough": ("this", "passthrough"), "floor": ("this", "floor")}
    runs: dict[str, list[float]] = {t: [] for t in plan}
    for i in range(rounds):
        for target, (tree, kind) in plan.items():
            runs[target].append(one(REPO if tree == "this" else baseline, kind, requests))
        print(f"round {i + 1}/{rounds}: " + ", ".join(f"{t} {runs[t][-1]:.1f}" for t in plan), flush=True)
    return {"baseline": str(baseline), "rounds": rounds, "requests": requests, "runs": runs,
            "median_us": {t: statistics.median(v) for t, v in runs.items()}}


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point: run, print and write ``bench/results/<name>.{json,md}``."""
    ap = ClickOptions(prog="python -m bench.edge_cpu", description=__doc__.splitlines()[0])
    ap.option("--baseline", type=click.Path(path_type=Path), required=True)
    ap.option("--rounds", type=int, default=3)
    ap.option("--requests", type=int, default=2000)
    ap.option("--out", type=click.Path(path_type=Path), default=RESULTS)
    ap.option("--name", default="edge_cpu")
    ap.option("--split", is_flag=True, default=False,
              help="session 18: uvicorn trivial / guarded trivial / full edge / floor")
    ap.option("--native", is_flag=True, default=False,
              help="session 22: --split plus native-trivial and native-prefixgate (bench/native_front.py)")
    args = ap.parse(argv)
    args.split = args.split or args.native
    doc = run(args.baseline.resolve(), args.rounds, args.requests, args.split, args.native)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"{args.name}.json").write_text(json.dumps(doc, indent=2) + "\n")
    med = doc["median_us"]
    lines = [f"# HTTP edge CPU per request, in process (`python -m bench.edge_cpu`), {args.name}", "",
             f"Baseline tree: `{doc['baseline']}`; {doc['rounds']} interleaved rounds, best of 9 x "
             f"{doc['requests']} requests each; thread CPU µs/request (warm loop).", "",
             "| target | median µs/req | runs |", "|---|---:|---|"]
    for t in doc["runs"]:
        lines.append(f"| {t} | {med[t]:.1f} | {', '.join(f'{v:.1f}' for v in doc['runs'][t])} |")
    if args.split:
        lines += ["", "Split (µs/request, medians): the protocol guards with a trivial app (guarded-trivial - "
                  f"uvicorn-trivial) {med['guarded-trivial'] - med['uvicorn-trivial']:+.1f}; uvicorn's cycle over the "
                  f"bare protocol (uvicorn-trivial - floor) {med['uvicorn-trivial'] - med['floor']:+.1f}; the routes, "
                  f"framing guard and stub pipeline (this - guarded-trivial) {med['this'] - med['guarded-trivial']:+.1f}; "
                  f"this - baseline {med['this'] - med['baseline']:+.1f} (run with --baseline an A/A tree of this "
                  "code for the noise)."]
        if args.native:
            lines += ["", f"Native front (bench/native_front.py, no guards): native-trivial - floor "
                      f"{med['native-trivial'] - med['floor']:+.1f}; uvicorn-trivial - native-trivial "
                      f"{med['uvicorn-trivial'] - med['native-trivial']:+.1f}; this - native-prefixgate "
                      f"{med['this'] - med['native-prefixgate']:+.1f} (guards + uvicorn's cycle over the native front)."]
        (args.out / f"{args.name}.md").write_text("\n".join(lines) + "\n")
        print("\n".join(lines))
        return 0
    lines += ["", f"this - baseline: {med['this'] - med['baseline']:+.1f} µs/request; "
              f"PrefixGate's edge beyond the passthrough's: this {med['this'] - med['passthrough']:+.1f}, "
              f"baseline {med['baseline'] - med['passthrough']:+.1f} µs/request; beyond the floor's (bare "
              f"protocol): this {med['this'] - med['floor']:+.1f}, passthrough {med['passthrough'] - med['floor']:+.1f}."]
    (args.out / f"{args.name}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
