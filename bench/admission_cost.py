"""Micro-benchmark: CPU of the admission step per request, in process and through Redis (issue 16).

``python -m bench.admission_cost [--requests N] [--rounds R] [--redis-url URL] [--out FILE]``

One admitted request's limit work, as the pipeline does it: ``admit``
(request bucket + concurrency), ``check_prompt`` (the ledger's
reservation), then at the end ``settle`` and the lease ``release``. Three
variants, in interleaved rounds in one process (median of ``R`` rounds of
``N`` requests, process CPU time per request, microseconds):

- ``sync in-process``: the same in-process objects and metrics called
  synchronously, as the gateway did before issue 16 wired
  ``tenancy.shared.make_limits``;
- ``memory (async admission)``: :class:`gateway.admission.Admission` of a
  ``state.backend: memory`` gateway (``await adm.admit``, ``await
  adm.check_prompt``): what a request pays now in one process;
- ``redis``: the same through a ``state.backend: redis`` gateway on
  ``--redis-url`` (skipped without it), with wall time per request and the
  queued settle/release flushed in each round. Client CPU only: the
  redis-server's own CPU is not in the figure.

Results go to ``bench/results/admission_cost.json`` and ``.md`` (or
``--out``). A benchmark, not a test: the numbers depend on the machine and
what else runs on it.
"""

from __future__ import annotations

import asyncio
import os
import statistics
import time
from typing import Any

from bench.harness import loadavg_text, write_json_and_markdown
from gateway.admission import Admission
from gateway.metrics import GatewayMetrics
from sim.click_options import ClickOptions
from tenancy.registry import Tenant
from tenancy.shared import make_limits
from tenancy.tokenizer import get_tokenizer

TENANT = Tenant(id="bench", rate_rps=1e9, rate_burst=1e9, max_concurrency=1_000_000,
                prompt_tokens_per_s=1e12, prompt_tokens_burst=1e12, output_tokens_per_s=1e12,
                output_tokens_burst=1e12)


def _admission(state: Any) -> Admission:
    limits = make_limits(state, failover=True)
    return Admission(None, limits,  # type: ignore[arg-type]  # the registry is not used here
                     get_tokenizer("word"), ["m"], GatewayMetrics(),
                     max_messages=64, max_output_tokens=256)


def _sync_round(adm: Admission, n: int) -> float:
    """The pre-issue-16 admission: the same in-process objects and metrics, called synchronously."""
    lim, led, m = adm.limiter, adm.ledger, adm.metrics
    t0 = time.process_time()
    for _ in range(n):
        lease = lim.admit(TENANT, time.monotonic())
        res = led.reserve(TENANT, 100, 64, time.monotonic())
        m.tenant_tokens_reserved.labels(TENANT.id, "prompt").inc(100)
        m.tenant_tokens_reserved.labels(TENANT.id, "output").inc(64)
        adm.settle(res, usage={"prompt_tokens": 100, "completion_tokens": 10}, progress="streamed",
                   relayed_output=10)
        lease.release()
    return (time.process_time() - t0) / n


async def _async_round(adm: Admission, n: int) -> tuple[float, float]:
    t0, w0 = time.process_time(), time.perf_counter()
    for _ in range(n):
        lease = await adm.admit(TENANT)
        res = await adm.check_prompt(TENANT, 100, 1, 64)
        adm.settle(res, usage={"prompt_tokens": 100, "completion_tokens": 10}, progress="streamed",
                   relayed_output=10)
        lease.release()
    await adm.limits.flush()
    return (time.process_time() - t0) / n, (time.perf_counter() - w0) / n


async def run(n: int, rounds: int, redis_url: str | None) -> dict[str, Any]:
    from gateway.config import StateConfig

    memory = _admission(StateConfig())
    redis_adm = None
    if redis_url:
        redis_adm = _admission(StateConfig(backend="redis", url=redis_url, key_prefix="pgbench:"))
        redis_adm.limits.start()
    out: dict[str, list[float]] = {"sync in-process": [], "memory (async admission)": [], "redis": [],
                                   "redis wall": []}
    for _ in range(rounds):
        out["sync in-process"].append(_sync_round(memory, n))
        out["memory (async admission)"].append((await _async_round(memory, n))[0])
        if redis_adm is not None:
            cpu, wall = await _async_round(redis_adm, max(1, n // 10))
            out["redis"].append(cpu)
            out["redis wall"].append(wall)
    if redis_adm is not None:
        await redis_adm.limits.aclose()
    med = {k: statistics.median(v) * 1e6 for k, v in out.items() if v}
    return {"requests_per_round": n, "rounds": rounds, "median_us_per_request": med,
            "memory_over_sync": med["memory (async admission)"] / med["sync in-process"],
            "loadavg": os.getloadavg(), "cpus": os.cpu_count()}


def _markdown(r: dict[str, Any]) -> str:
    rows = "\n".join(f"| {k} | {v:.2f} |" for k, v in r["median_us_per_request"].items())
    return (f"# Admission cost per request (bench/admission_cost.py)\n\n"
            f"{r['rounds']} interleaved rounds of {r['requests_per_round']} requests (redis: a tenth), "
            f"median; process CPU µs per request (redis wall: elapsed µs). {r['cpus']} CPUs, load average "
            f"{loadavg_text(r['loadavg'])} (shared machine).\n\n"
            f"| variant | µs / request |\n|---|---|\n{rows}\n\n"
            f"memory (async admission) / sync in-process: {r['memory_over_sync']:.3f}\n")


def main() -> None:
    ap = ClickOptions(description=__doc__.splitlines()[0])
    ap.option("--requests", type=int, default=20000)
    ap.option("--rounds", type=int, default=7)
    ap.option("--redis-url", default=None)
    ap.option("--out", default="bench/results/admission_cost")
    a = ap.parse()
    r = asyncio.run(run(a.requests, a.rounds, a.redis_url))
    write_json_and_markdown(a.out, r, _markdown(r))


if __name__ == "__main__":
    main()
