"""Replica-side vs client-side mean TTFT per router (trace s): how much of TTFT the router itself adds.

``python -m bench.ttft_split CELL ROWS`` (a cell of ``sim.grid``); prints one line per router. Not a test.
"""
from __future__ import annotations

import asyncio
import sys
import tempfile
from pathlib import Path
import aiohttp
from prometheus_client.parser import text_string_to_metric_families
from sim.grid import CELLS, start_smg_router
from sim.demo import DemoPaths, prepare_identity, start_cluster_proc, start_gateway, gateway_config, bearer_headers, run_target
from sim.procs import free_port, stop_process
from sim.replay import ReplayConfig
from sim.trace import load_mooncake, DEFAULT_TRACE_PATH, assign_tenants
from sim.bounds import tenant_names



async def ttft_sums(urls):
    """Sum and count of ``vllm:time_to_first_token_seconds`` over the replicas at ``urls`` (trace s)."""
    s = c = 0.0
    async with aiohttp.ClientSession() as sess:
        for u in urls:
            async with sess.get(u + "/metrics") as r:
                text = await r.text()
            for fam in text_string_to_metric_families(text):
                for smp in fam.samples:
                    if smp.name == "vllm:time_to_first_token_seconds_sum": s += smp.value
                    if smp.name == "vllm:time_to_first_token_seconds_count": c += smp.value
    return s, c

async def main():
    """Replay the first ROWS rows of cell CELL through PrefixGate, then smg; print the split per router."""
    cellname, rows = sys.argv[1], int(sys.argv[2])
    cell = [c for c in CELLS if c.name == cellname][0]
    work = Path(tempfile.mkdtemp(prefix="split-")); paths = DemoPaths.under(work); issuer = prepare_identity(paths)
    spec = cell.spec(6); reqs = load_mooncake(DEFAULT_TRACE_PATH, rows)
    names = tenant_names(cell.tenants); tenants = assign_tenants(reqs, names, 0)
    cluster, replicas = await start_cluster_proc(spec, paths); urls = [r["url"] for r in replicas]
    try:
        rcfg = ReplayConfig(base_url="", time_scale=spec.time_scale, seed=0, total_timeout_s=6 * reqs[-1].timestamp / spec.time_scale + 180)
        for router in ("prefixgate", "smg"):
            if router == "smg":
                proc, base = await start_smg_router(urls, paths)
            else:
                gcfg = gateway_config("cache_aware", replicas, names, paths, listen_port=free_port(), admin_port=free_port(),
                                      block_size=spec.block_size, index_capacity_blocks=spec.capacity_blocks)
                proc, base = await start_gateway("gw", gcfg, paths)
            try:
                s0, c0 = 0.0, 0.0  # /sim/reset (in run_target) clears the histograms
                summ, res = await run_target(router, base, urls, reqs, tenants, rcfg, None,
                    headers_for=bearer_headers(issuer, names) if router == "prefixgate" else None,
                    salt_for=(lambda t: t) if router == "smg" else None)
                s1, c1 = await ttft_sums(urls)
                client = [r.ttft_s for r in res.records if r.ttft_s is not None]
                cm = sum(client) / len(client)
                print(f"{cellname} {router}: client mean TTFT {cm:.3f} s, replica-side mean {(s1-s0)/(c1-c0):.3f} s "
                      f"(n={int(c1-c0)}), added {cm-(s1-s0)/(c1-c0):.3f} s trace = {1000*(cm-(s1-s0)/(c1-c0))/spec.time_scale:.1f} ms wall; p50 {summ.ttft_p50:.3f}", flush=True)
            finally:
                stop_process(proc)
    finally:
        stop_process(cluster)

if __name__ == "__main__":
    asyncio.run(main())
