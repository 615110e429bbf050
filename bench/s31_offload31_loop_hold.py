"""Session 31 (offload31): how long one tenant's heavy preparations hold the event loop, inline vs on the worker thread.

In process, no server. Each body of tenant B (:func:`bench.s30_attack30_neighbour.candidates`, plus two schemas whose
quote-free patterns cost ~100 ms to count under the default limits, each sent with a pattern no earlier call counted:
S30-review30-3) is prepared by :func:`gateway.admission_front.parse_and_count` under the default limits:

* ``cpu``: its thread CPU per preparation (``time.thread_time``, median of ``--n``), the loop's CPU when inline;
* ``hold``: an event loop in the main thread runs an open-loop ticker (tick ``k`` due ``k`` x ``--tick-ms`` after the
  start, waited for with ``asyncio.sleep``: the stand-in for another tenant's small requests and the readiness probe,
  arriving whatever the loop is doing, so a stall of ``d`` ms makes ``d / --tick-ms`` ticks late), while B's preparations run back to back for
  ``--seconds``, either ``inline`` (on the loop, as before session 31, one per loop turn) or ``thread`` (on a
  :class:`gateway.prep_thread.PrepThread`, metered into a ``CpuMeter``), at a duty cycle of ``--duty`` (the fraction
  of the time B's preparations run: the CPU budget lets ~100 ms/s of refused work through, ~0.1). Reported: the
  ticks' lateness (ms: p50, p99, max: how long after its due time each ran) and B's preparations done.
  ``--switch-ms``: ``sys.setswitchinterval`` for the run (CPython's default 5 ms).

Wall-clock figures: the machine is shared; the load average is printed beside each row.

Usage: ``python -m bench.s31_offload31_loop_hold [--n 5] [--seconds 3] [--tick-ms 1] [--duty 0.1 ...]
[--switch-ms 5 ...] [--bodies NAME ...] [--hop 2000]``; ``--hop N`` first measures the thread hop itself (:func:`hop`).
"""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

import click

from sim.click_options import ClickOptions

_FRESH = itertools.count()


def _pattern_bodies() -> dict[str, Callable[[], bytes]]:
    """Bodies whose patterns are counted (each call a pattern not counted before: the counts are cached)."""
    def rf(props: dict[str, Any]) -> bytes:
        return json.dumps({"model": "sim-model", "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}],
                           "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {
                               "type": "object", "properties": props}}}}, separators=(",", ":")).encode()

    def literals() -> bytes:  # S30-review30-3: 400 literal cells + [^"]*a[^"]{12} (refused, ~86-107 ms)
        lit = "".join(chr(0x100 + 2 * i) for i in range(400))
        return rf({"a": {"type": "string", "pattern": f"x{next(_FRESH)}{lit}[^\"]*a[^\"]{{12}}"}})

    def alternation() -> bytes:  # an anyOf of two x[ab]*a[ab]{11}-style patterns, twice (refused, ~94-99 ms)
        n = next(_FRESH)
        two = {"anyOf": [{"type": "string", "pattern": f"x{n}[ab]*a[ab]{{11}}"},
                         {"type": "string", "pattern": f"y{n}[ab]*a[ab]{{11}}"}]}
        return rf({"a": two, "b": {"anyOf": [{"type": "string", "pattern": f"z{n}[ab]*a[ab]{{11}}"},
                                             {"type": "string", "pattern": f"w{n}[ab]*a[ab]{{11}}"}]}})

    return {"pattern 400 literals": literals, "pattern anyOf x2": alternation}


def bodies() -> dict[str, Callable[[], bytes]]:
    """Every candidate body, as a maker (a fixed body's maker returns it)."""
    from bench.s30_attack30_neighbour import candidates

    out: dict[str, Callable[[], bytes]] = {k: (lambda b=b: b) for k, b in candidates().items()}
    out["plain"] = lambda: json.dumps({"model": "sim-model", "max_tokens": 4, "messages": [
        {"role": "user", "content": "What is the capital of France? Answer in one word."}]}).encode()
    return out | _pattern_bodies()


def front() -> Callable[[bytes], Any]:
    """``prep(raw)``: :func:`parse_and_count` of a chat body under the default limits (its errors returned)."""
    from gateway.admission import Admission
    from gateway.admission_front import parse_and_count
    from gateway.config_http import LimitsConfig
    from gateway.config_state import StateConfig
    from gateway.errors import GatewayError
    from gateway.metrics import GatewayMetrics
    from tenancy.registry import Tenant, TenantRegistry
    from tenancy.shared import make_limits
    from tenancy.tokenizer import WordTokenizer

    limits = LimitsConfig()
    adm = Admission(TenantRegistry.from_config([]), make_limits(StateConfig()), WordTokenizer(), ["sim-model"],
                    GatewayMetrics(), max_messages=limits.max_messages, max_output_tokens=limits.max_output_tokens,
                    default_max_prompt_tokens=limits.max_prompt_tokens)
    tenant = Tenant(id="tenant-b", models=frozenset({"sim-model"}))
    bounds = adm.request_bounds(tenant)

    def prep(raw: bytes) -> Any:
        try:
            return parse_and_count(adm, raw, "chat", limits, bounds, tenant, None, False)
        except GatewayError as err:
            return err.code

    return prep


def cpu_ms(prep: Callable[[bytes], Any], make: Callable[[], bytes], n: int) -> tuple[float, Any]:
    """Median thread CPU (ms) of ``prep`` over ``n`` fresh bodies, and the last outcome (an error code or ok)."""
    xs, out = [], None
    for _ in range(n):
        raw = make()
        t0 = time.thread_time()
        out = prep(raw)
        xs.append((time.thread_time() - t0) * 1e3)
    return statistics.median(xs), out if isinstance(out, str) else "ok"


async def hold(prep: Callable[[bytes], Any], make: Callable[[], bytes], mode: str, seconds: float, tick_s: float,
               duty: float) -> dict[str, Any]:
    """The ticker's lateness while B's preparations run ``inline`` or on a ``thread`` (module doc)."""
    from gateway.config_http import LimitsConfig
    from gateway.cpu_budget import CpuBudget
    from gateway.prep_thread import PrepThread
    from tenancy.registry import Tenant

    budget = CpuBudget(LimitsConfig(refused_cpu_ms_per_s=None))
    tenant = Tenant(id="tenant-b")
    thread = PrepThread()
    stop = time.perf_counter() + seconds
    late: list[float] = []
    done = 0

    async def ticker() -> None:  # open loop: tick k is due at t0 + k x tick_s, late by how long after that it ran
        t0, k = time.perf_counter(), 0
        while (now := time.perf_counter()) < stop:
            k += 1
            due = t0 + k * tick_s
            await asyncio.sleep(max(0.0, due - now))
            late.append((time.perf_counter() - due) * 1e3)

    async def sender() -> None:
        nonlocal done
        while time.perf_counter() < stop:
            raw = make()
            w0 = time.perf_counter()
            if mode == "inline":
                prep(raw)
            else:
                await thread.run(budget.meter(tenant, 1), prep, raw)
            done += 1
            busy = time.perf_counter() - w0
            await asyncio.sleep(busy * (1 / duty - 1) if duty < 1 else 0)

    await asyncio.gather(ticker(), sender())
    await thread.stop()
    return {"ticks": len(late), "late_p50_ms": round(statistics.median(late), 3),
            "late_p99_ms": round(sorted(late)[int(0.99 * (len(late) - 1))], 3), "late_max_ms": round(max(late), 3),
            "b_done": done}


async def hop(n: int) -> dict[str, float]:
    """The thread hop a heavy body pays: wall µs (median, p99) of ``await thread.run(meter, fn)`` for a step that
    does nothing, and the loop thread's CPU µs per hop (thread time around the awaits), an idle loop otherwise."""
    from gateway.config_http import LimitsConfig
    from gateway.cpu_budget import CpuBudget
    from gateway.prep_thread import PrepThread
    from tenancy.registry import Tenant

    budget, tenant, thread = CpuBudget(LimitsConfig(refused_cpu_ms_per_s=None)), Tenant(id="t"), PrepThread()
    walls = []
    c0 = time.thread_time()
    for _ in range(n):
        t = time.perf_counter()
        await thread.run(budget.meter(tenant, 1), int)
        walls.append((time.perf_counter() - t) * 1e6)
    cpu = (time.thread_time() - c0) / n * 1e6
    await thread.stop()
    walls.sort()
    return {"hop_wall_us_p50": round(walls[n // 2], 1), "hop_wall_us_p99": round(walls[int(0.99 * (n - 1))], 1),
            "hop_loop_cpu_us": round(cpu, 1)}


def main() -> None:
    p = ClickOptions(description=__doc__.splitlines()[0])
    p.option("--n", type=int, default=5)
    p.option("--seconds", type=float, default=3.0)
    p.option("--tick-ms", type=float, default=1.0)
    p.option("--duty", type=float, multiple=True, default=(0.1,))
    p.option("--switch-ms", type=float, multiple=True, default=(5.0,))
    p.option("--bodies", multiple=True, default=())
    p.option("--modes", type=click.Choice(["inline", "thread"]), multiple=True, default=("inline", "thread"))
    p.option("--no-cpu", is_flag=True, default=False)
    p.option("--hop", type=int, default=0, help="measure the thread hop over this many steps first")
    args = p.parse()
    if args.hop:
        print(json.dumps({**asyncio.run(hop(args.hop)), "load": os.getloadavg()}), flush=True)
    prep = front()
    makers = bodies()
    names = list(args.bodies) or list(makers)
    default_switch = sys.getswitchinterval()
    for name in names:
        if not args.no_cpu:
            ms, out = cpu_ms(prep, makers[name], args.n)
            print(json.dumps({"body": name, "bytes": len(makers[name]()), "cpu_ms": round(ms, 3), "outcome": out,
                              "load": os.getloadavg()}), flush=True)
        for duty in args.duty:
            for sw in args.switch_ms:
                for mode in args.modes:
                    if mode == "inline" and sw != args.switch_ms[0]:
                        continue  # one thread only: the interval changes nothing
                    sys.setswitchinterval(sw / 1e3)
                    try:
                        row = asyncio.run(hold(prep, makers[name], mode, args.seconds, args.tick_ms / 1e3, duty))
                    finally:
                        sys.setswitchinterval(default_switch)
                    print(json.dumps({"body": name, "mode": mode, "duty": duty, "switch_ms": sw, **row,
                                      "load": [round(x, 2) for x in os.getloadavg()]}), flush=True)


if __name__ == "__main__":
    main()
