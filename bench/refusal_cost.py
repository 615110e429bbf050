"""Micro-benchmark: gateway CPU of one request refused at the door (issue 17 flood criterion).

``python -m bench.refusal_cost [--requests N] [--rounds R]``

In process, no sockets: a gateway built from :mod:`bench.fairness`'s configuration (flow control
on, ``tenant_max_queued_requests`` 8, no audit sinks) whose tenant ``f`` has a full queue (eight
placeholders, the dispatcher stopped), and ``N`` completion requests of ``f`` (a cached token, a
100-word body) called through the public ASGI app (framing guard, inference front, pipeline,
response, the deferred record). Each is answered 429 ``queue_full`` after authentication and
tenant resolution, before its body is read. Reported: process CPU microseconds per refusal, the
best of ``R`` rounds (the round least disturbed by other jobs). What it leaves out: the HTTP
server's parsing and the socket writes (``bench.fairness_flood`` measures the whole process).
A benchmark, not a test.
"""

from __future__ import annotations

import asyncio
import json
import tempfile
from pathlib import Path
from typing import Any

import yaml

from bench.fairness import TD, _config
from bench.harness import asgi_post_best_cpu_ns
from sim.click_options import ClickOptions
from sim.spiffe_issuer import DemoIssuer


async def measure(requests: int, rounds: int) -> dict[str, Any]:
    """(statuses seen, best CPU microseconds per refused request)."""
    from gateway.app import build_public_app
    from gateway.auditing import AuditHub
    from gateway.build import build
    from gateway.config import load_config

    tmp = Path(tempfile.mkdtemp(prefix="pg-refusal-"))
    issuer = DemoIssuer(TD)
    doc = _config(tmp, "http://127.0.0.1:9", issuer,
                  {"enabled": True, "tenant_max_queued_requests": 8, "shed_loop_lag_s": None}, {})
    (tmp / "gw.yaml").write_text(yaml.safe_dump(doc))
    gw = build(load_config(tmp / "gw.yaml"), audit=AuditHub(None))
    await gw.start()
    app = build_public_app(gw, manage_lifecycle=False)
    assert gw.flow is not None
    gw.flow._pump = lambda: None  # the placeholders are never released  # type: ignore[method-assign]
    for _ in range(8):
        gw.flow.queue.push("f", object(), 1.0)
    token = issuer.mint(f"spiffe://{TD}/f/app", "prefixgate", ttl_s=600)
    body = json.dumps({"model": "sim-model", "prompt": " ".join(f"w{i}" for i in range(100)),
                       "max_tokens": 8, "stream": True}).encode()
    statuses, ns = await asgi_post_best_cpu_ns(app, body, token, warm=200,  # warm the token cache and code paths
                                               requests=requests, rounds=rounds)
    await gw.stop()
    return {"statuses": statuses, "cpu_us_per_refusal": round(ns / 1000.0, 1)}


def main() -> None:
    """Print the result as JSON."""
    ap = ClickOptions(description=__doc__.splitlines()[0])
    ap.option("--requests", type=int, default=3000)
    ap.option("--rounds", type=int, default=5)
    args = ap.parse()
    print(json.dumps(asyncio.run(measure(args.requests, args.rounds))))


if __name__ == "__main__":
    main()
