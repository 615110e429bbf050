"""Micro-benchmark: CPU per request of routing-state sharing (issue 16), without Redis.

``python -m bench.shared_routing_cpu [--requests N] [--reps R] [--entry-events E] [--out FILE]``

Routes ``N`` requests (tenant-keyed chains of 8 KV blocks, 64 distinct
prompts, 6 replicas, cache-aware policy) and measures process CPU time
(``time.process_time_ns``; microseconds per request, best of ``R``
repetitions), side by side in one run:

* ``route_memory``: ``Router.route`` + ``first_token`` + ``finish`` over the
  in-process index and load tracker (what ``state.backend: memory`` builds);
* ``route_shared``: the same through ``routing.shared`` wrappers whose events go
  to the bounded queue of :class:`gateway.shared_routing.RoutingStream` (what the
  request path pays with ``state.backend: redis``; the writer's I/O is not on it);
* ``encode_and_mac``: the writer's share per request (JSON body + HMAC of batches of
  ``--entry-events`` events (default 256), the events of one request; since session 7 an
  entry's load deltas are summed per replica first, as the writer does:
  :func:`gateway.shared_events.coalesce_deltas`);
* ``verify_and_apply``: a receiving instance's share per request (MAC check,
  decode, apply to its index and remote load view).

Results go to ``bench/results/shared_routing_cpu.json`` (or ``--out``). A
benchmark, not a test: numbers depend on the machine (and its load).
"""
from __future__ import annotations

import json
import os
import platform
from collections.abc import Callable
from pathlib import Path

from bench.harness import best_cpu_us
from gateway.shared_events import coalesce_deltas
from gateway.shared_routing import RoutingStream, encode_events
from routing.index import InProcessPrefixIndex
from routing.load import InProcessLoadTracker
from routing.policies import build_policy
from routing.router import Router
from routing.shared import PublishingPrefixIndex, RemoteLoadView, SharedLoadTracker
from routing.types import RouteRequest
from sim.click_options import ClickOptions
from tenancy.keys import KeyRing

REPLICAS = [f"r{i}" for i in range(6)]


def _requests(n: int) -> list[RouteRequest]:
    ring = KeyRing(os.urandom(32))
    chains = [ring.prefix_chain("tenant-a", [p * 1000 + i for i in range(128)], 16).current for p in range(64)]
    return [RouteRequest("tenant-a", chains[i % 64], 128, 32, 16) for i in range(n)]


def _best(fn: Callable[[], None], reps: int, n: int) -> float:
    return round(best_cpu_us(fn, reps, n), 3)


class _Client:
    """Stands in for redis: ``register_script`` only (never called on this path)."""

    def register_script(self, _script: str) -> None:
        return None


def main() -> None:
    ap = ClickOptions(description=__doc__.splitlines()[0])
    ap.option("--requests", type=int, default=20000)
    ap.option("--reps", type=int, default=5)
    ap.option("--entry-events", type=int, default=256, help="events per stream entry (the writer's batch)")
    ap.option("--out", default="bench/results/shared_routing_cpu.json")
    args = ap.parse()
    reqs = _requests(args.requests)
    policy = build_policy("cache_aware")

    def run_memory() -> None:
        router = Router(policy, InProcessPrefixIndex(), InProcessLoadTracker(), 16)
        for r in reqs:
            _, t = router.route(r, REPLICAS)
            t.first_byte()
            t.finish()

    captured: list[object] = []

    def make_stream() -> tuple[Router, RoutingStream]:
        index = InProcessPrefixIndex()
        holder: list[RoutingStream] = []
        loads = SharedLoadTracker(InProcessLoadTracker(), RemoteLoadView(), lambda e: holder[0].emit(e))
        stream = RoutingStream(_Client(), "pg:", "0123456789abcdef", os.urandom(32), index, loads, REPLICAS,
                               lease_ttl_s=10, queue_max=10**9)
        holder.append(stream)
        return Router(policy, PublishingPrefixIndex(index, stream.emit), loads, 16), stream

    def run_shared() -> None:
        router, stream = make_stream()
        for r in reqs:
            _, t = router.route(r, REPLICAS)
            t.first_byte()
            t.finish()
        captured[:] = list(stream._queue)  # noqa: SLF001 - the bench reads what the writer would send

    mac_key = os.urandom(32)
    sender = RoutingStream(_Client(), "pg:", "0123456789abcdef", mac_key, InProcessPrefixIndex(),
                           SharedLoadTracker(InProcessLoadTracker(), RemoteLoadView(), lambda e: None), REPLICAS,
                           lease_ttl_s=10)
    entries: list[dict[bytes, bytes]] = []

    def run_encode() -> None:
        entries.clear()
        n = args.entry_events
        for i in range(0, len(captured), n):
            body = encode_events(coalesce_deltas(captured[i:i + n]))  # type: ignore[arg-type]
            entries.append({b"i": b"0123456789abcdef", b"b": body,
                            b"m": sender._mac("0123456789abcdef", body).encode()})  # noqa: SLF001

    def run_apply() -> None:
        recv = RoutingStream(_Client(), "pg:", "fedcba9876543210", mac_key, InProcessPrefixIndex(),
                             SharedLoadTracker(InProcessLoadTracker(), RemoteLoadView(), lambda e: None), REPLICAS,
                             lease_ttl_s=10)
        for e in entries:
            recv.apply_entry(e)

    results = {
        "route_memory_us": _best(run_memory, args.reps, args.requests),
        "route_shared_us": _best(run_shared, args.reps, args.requests),
    }
    results["encode_and_mac_us"] = _best(run_encode, args.reps, args.requests)
    results["verify_and_apply_us"] = _best(run_apply, args.reps, args.requests)
    results["events_per_request"] = round(len(captured) / args.requests, 2)
    out = {"bench": "shared_routing_cpu", "requests": args.requests, "reps": args.reps,
           "entry_events": args.entry_events,
           "python": platform.python_version(), "machine": platform.machine(),
           "note": "process CPU time, best of reps, microseconds per request; shared 2-core machine",
           "results": results}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=2) + "\n")
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
