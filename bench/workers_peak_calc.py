"""Arithmetic of :mod:`bench.workers_peak` (split off in session 11 to keep that module short): client
counts, each target's peak over them, the peak ratios, and CPU per request by part with the ceiling
the rest of the machine puts on ``xN / x1``. Pure functions of the result document's parts."""

from __future__ import annotations

import os
from typing import Any

__all__ = ["client_counts", "cpu_per_request", "peak_ratios", "peaks", "serve_growth"]


def client_counts(text: str | int) -> list[int]:
    """``--clients``: one count or a comma-separated list (``32,64``); raises :class:`SystemExit` for
    anything but positive integers."""
    try:
        counts = [int(x) for x in str(text).split(",") if x.strip()]
    except ValueError:
        counts = []
    if not counts or min(counts) < 1:
        raise SystemExit(f"error: --clients: positive integers, comma-separated (got {text!r})")
    return counts


def peaks(summary: dict[str, dict[str, dict[str, Any]]],
          generators: list[tuple[str, str, int]]) -> dict[str, dict[str, dict[str, Any]]]:
    """Per load generator and target: the highest median req/s over the client counts measured and
    the count that gave it (``{g: {target: {"rps", "clients"}}}``). Session 11: a target's peak rate
    is its best over offered concurrency, so every target (one process or N) gets the same counts and
    is credited with its own best; with one count this is just that count's median."""
    out: dict[str, dict[str, dict[str, Any]]] = {}
    for key, g, n in generators:
        for name, s in summary.get(key, {}).items():
            best = out.setdefault(g, {}).get(name)
            if s.get("rps") and (best is None or s["rps"] > best["rps"]):
                out[g][name] = {"rps": s["rps"], "clients": n}
    return out


def peak_ratios(best: dict[str, dict[str, dict[str, Any]]], workers: int) -> dict[str, dict[str, float]]:
    """``redis xN / redis x1`` (and ``@base``, each replica fixture) on the peaks of :func:`peaks`."""
    out: dict[str, dict[str, float]] = {}
    for g, per in best.items():
        for name, p in per.items():
            if not name.startswith(f"redis x{workers}") or workers == 1:
                continue
            one = per.get(name.replace(f"redis x{workers}", "redis x1", 1))
            if one and one["rps"]:
                out.setdefault(g, {})[f"{name} / {name.replace(f'redis x{workers}', 'redis x1', 1)}"] = round(
                    p["rps"] / one["rps"], 3)
    return out


def cpu_per_request(summary: dict[str, dict[str, dict[str, Any]]]) -> dict[str, dict[str, Any]]:
    """Per generator and target: µs of CPU per answered request of the serve processes, of the rest
    (audit worker, replicas, redis-server, load generator), and the ceiling they put on ``xN / x1``
    on this machine: ``cpus x serve / (serve + rest)`` of the one-process target (its serve process
    saturates one core; N processes share all cores with the rest), i.e. if N processes paid what one
    pays per request."""
    out: dict[str, dict[str, Any]] = {}
    cpus = os.cpu_count() or 1
    for g, per in summary.items():
        for name, x in per.items():
            if not x.get("rps"):
                continue
            us = 1e6 / x["rps"]
            serve = (x.get("serve_cores") or 0) * us
            rest = ((x.get("gateway_cores") or 0) - (x.get("serve_cores") or 0) + (x.get("replica_cores") or 0)
                    + (x.get("redis_cores") or 0) + (x.get("loadgen_cores") or 0)) * us
            row = {"serve_us": round(serve), "rest_us": round(rest), "total_us": round(serve + rest),
                   # session 11: the rest by part (audit = the gateway tree beside the serve processes)
                   "audit_us": round(((x.get("gateway_cores") or 0) - (x.get("serve_cores") or 0)) * us),
                   "replica_us": round((x.get("replica_cores") or 0) * us),
                   "redis_us": round((x.get("redis_cores") or 0) * us),
                   "loadgen_us": round((x.get("loadgen_cores") or 0) * us)}
            if " x1" in name and serve + rest > 0:
                row["ceiling_xN_over_x1"] = round(cpus * serve / (serve + rest), 2)
                # session 11: the same with the load generator and the replicas on other cores (only the
                # gateway's own parts, audit worker and redis-server, share the cores with the serve ones)
                own = serve + row["audit_us"] + row["redis_us"]
                if own > 0:
                    row["ceiling_gateway_parts_only"] = round(cpus * serve / own, 2)
            out.setdefault(g, {})[name] = row
    return out


def serve_growth(cpu: dict[str, dict[str, Any]], workers: int) -> dict[str, dict[str, float]]:
    """Per generator: serve µs per request of ``redis xN`` over ``redis x1`` (same fixture and tree;
    session 11: what N processes on shared cores pay more per request than one; 1.0 = nothing)."""
    out: dict[str, dict[str, float]] = {}
    for g, per in cpu.items():
        for name, row in per.items():
            if workers > 1 and name.startswith(f"redis x{workers}"):
                one = per.get(name.replace(f"redis x{workers}", "redis x1", 1))
                if one and one.get("serve_us"):
                    out.setdefault(g, {})[name] = round(row["serve_us"] / one["serve_us"], 2)
    return out

