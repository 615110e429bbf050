"""The Markdown page of :mod:`bench.workers_peak` (split off in session 10 to keep that module short)."""

from __future__ import annotations

from typing import Any

from bench.harness import loadavg_text

__all__ = ["markdown"]


def markdown(r: dict[str, Any]) -> str:
    """The result document ``r`` of :func:`bench.workers_peak.run` as a Markdown page."""
    def f(x: float | None) -> str:
        return "-" if x is None else f"{x:.2f}"

    rows = "\n".join(f"| {name} | {g} | {s['rps']:.1f} | {', '.join(str(x['rps']) for x in r['runs'][g][name])} | "
                     f"{f(s['loadgen_cores'])} | {f(s['gateway_cores'])} ({f(s['serve_cores'])}) | "
                     f"{s['serve_us_per_req']:.0f} | {f(s['replica_cores'])} | "
                     f"{f(s['redis_cores'])} | {f(s['redis_cmds_per_req'])} | {f(s['redis_reads_per_req'])} | "
                     f"{s['errors']} |"
                     for g, per in r["summary"].items() for name, s in per.items())
    ratios = "; ".join(f"{g}: {k} {v:.2f}" for g, per in r["ratios"].items() for k, v in per.items())
    base = f"\n@base: the Redis targets run from {r['baseline']}.\n" if r.get("baseline") else ""
    counts = r["clients"] if isinstance(r["clients"], list) else [r["clients"]]
    clients = ", ".join(map(str, counts)) + (" (every target at each; load generator column: <generator> c<count>)"
                                             if len(counts) > 1 else "")
    peak = ""
    if r.get("peak_ratios"):  # session 11: each target's best over the client counts
        peak = ("peak over the client counts (median req/s at the best count): "
                + "; ".join(f"{g} {name} {p['rps']:.1f} (c{p['clients']})" for g, per in r["peaks"].items()
                            for name, p in per.items())
                + "\n\npeak ratios: " + "; ".join(f"{g}: {k} {v:.2f}" for g, per in r["peak_ratios"].items()
                                                   for k, v in per.items()) + "\n\n")
    return (f"# serve --workers: peak rate (bench/workers_peak.py)\n\n"
            f"{r['label']}\n\n"
            f"{clients} closed-loop clients (wrk: connections) x {r['seconds']} s per target and load generator, "
            f"{r['rounds']} interleaved rounds; load generator, replicas and Redis on the same {r['cpus']}-CPU machine "
            f"as the gateway (load average after the run {loadavg_text(r['loadavg'])}). Cores = CPU seconds / wall "
            f"seconds over the measured window (1.00 = one whole core); redis cmds and reads per request from "
            f"INFO commandstats / total_reads_processed (module doc). Replica fixture: rows without a suffix "
            f"stand in front of the simulated replicas (sim.cluster), rows named [lean] in front of "
            f"bench/lean_replica.py (same OpenAI shapes, no cache model; less CPU taken from the gateway's "
            f"cores); the gateway and its configuration are the same.\n{base}\n"
            f"| target | load generator | median req/s | runs | load gen cores | gateway cores (serve processes) | "
            f"serve µs/req | replica cores | redis cores | redis cmds/req | redis reads/req | errors |\n"
            f"|---|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|\n{rows}\n\n"
            f"median req/s ratios: {ratios}\n\n{peak}"
            f"cores of each serve process per run (busiest first; the kernel hands each new connection to "
            f"one worker, so a skewed split caps xN): "
            + "; ".join(f"{g} {name}: " + " | ".join(f"{x.get('worker_cores', '-')} (connections "
                                                     f"{x.get('worker_conns', '-')})" for x in xs)
                        for g, per in r["runs"].items() for name, xs in per.items() if " x1" not in name)
            + "\n\nserve processes' context switches per answered request (median; wakeups = voluntary: the "
            "event loop went idle and was woken; preempted = involuntary): "
            + "; ".join(f"{g} {name}: {s.get('serve_wakeups_per_req')} / {s.get('serve_preempted_per_req')}"
                        for g, per in r["summary"].items() for name, s in per.items()) + "\n\n"
            + ("redis-server execution time per answered request (µs, INFO commandstats usec: the server's wall "
               "time around each command, so on a busy machine it includes time it was preempted and can exceed "
               "its CPU; scripts = EVALSHA with the commands they call, stream = XADD + XREAD; on a quiet machine "
               "the rest of its CPU is socket I/O and its event loop): "
               + "; ".join(f"{g} {name}: scripts {s.get('redis_scripts_us_per_req')}, stream "
                           f"{s.get('redis_stream_us_per_req')}" for g, per in r["summary"].items()
                           for name, s in per.items() if s.get("redis_scripts_us_per_req") is not None)
               + "\n\n" if any(s.get("redis_scripts_us_per_req") is not None for per in r["summary"].values()
                               for s in per.values()) else "")
            + f"CPU per answered request (µs; serve processes / rest = audit worker, replicas, redis-server, load "
            f"generator) and, for one process, the ceiling on xN / x1 on {r['cpus']} CPUs if N processes paid the "
            f"same per request (cpus x serve / (serve + rest)):\n\n"
            + "\n".join(f"- {g} {name}: serve {c['serve_us']}, rest {c['rest_us']}"
                        + (f" (audit {c['audit_us']}, replicas {c['replica_us']}, redis {c['redis_us']}, load "
                           f"generator {c['loadgen_us']})" if "audit_us" in c else "")
                        + f", total {c['total_us']}"
                        + (f"; ceiling {c['ceiling_xN_over_x1']}" if "ceiling_xN_over_x1" in c else "")
                        + (f" ({c['ceiling_gateway_parts_only']} with the load generator and replicas on "
                           f"other cores)" if "ceiling_gateway_parts_only" in c else "")
                        for g, per in r.get("cpu_per_request", {}).items() for name, c in per.items()) + "\n"
            + ("\nserve µs per request at xN over x1 (what N processes on shared cores pay more each): "
               + "; ".join(f"{g} {name} {v:.2f}" for g, per in r["serve_growth"].items() for name, v in per.items())
               + "\n" if r.get("serve_growth") else ""))
