"""A streamed answer's gateway CPU, per request and per SSE event, beside smg and the passthrough (not a test).

``python -m bench.stream_cost [--events 1,8,32] [--requests 120] [--rounds 3] [--gap-ms 1]
[--baseline DIR] [--aa DIR] [--profile 32]`` (issue 14, session 21). The one-token bench
(:mod:`bench.overhead`) never measured what a streamed answer of hundreds of tokens costs the
gateway: its per-event relay work (upstream read, SSE scan, accounting, the client write) runs once
per event. Here one simulated replica (``sim.cluster``, time scale 10^6: prefill is instant)
streams ``max_tokens = 1 + 16 (N - 1)`` tokens as N SSE events (16 tokens per event after the first,
the grid's replicas' ``stream_chunk_tokens``), one event every ``--gap-ms`` wall ms (its decode time:
each event reaches the gateway in a read of its own, as in the live grid where events are 16-40 ms
apart), plus the ``[DONE]`` event (and the usage event when the gateway asked for it).

Targets, all started once and measured interleaved: ``prefixgate`` (this tree, the demo config of
:func:`sim.demo.gateway_config` with the default usage privacy: JWT-SVID, HMAC chain, embedded OPA,
``cache_aware``, audit JSONL + OCSF), ``baseline`` and ``aa`` (``prefixgate serve`` from other source
trees, e.g. the session's start and an export of this tree: the A/B and the A/A), ``smg`` (SGLang's
router) and ``passthrough`` (:func:`bench.overhead.passthrough_app`: the same server stack relaying
each upstream chunk with a plain Starlette ``StreamingResponse``: the floor of that stack).
Per round, per N, per target (order rotated each round, reversed every other N): ``--requests``
sequential streamed requests on one keep-alive connection after 10 warm-up ones, the process's CPU
(the scheduler's ns count of every thread of the main process; ``loop thread``: its main thread alone;
``+ children``: with the audit worker) read
around them. Figures: the median over rounds of CPU µs per request, and the **per-event** CPU, the
least-squares slope of CPU per request over N (µs per event).

``--profile N``: then one ``prefixgate serve`` of this tree under cProfile (thread-CPU clock, the
child of :func:`bench.overhead._serve_profiled`), ``--requests`` requests of 1 and of N events
profiled apart; the per-function own CPU per request of the N-event run minus that of the 1-event
run, divided by N - 1, is each function's **per-event** CPU (profiled µs: cProfile inflates
call-heavy code). Results: ``bench/results/<name>.md`` (and ``.json``).
"""

from __future__ import annotations

import json
import os
import pstats
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import click

from bench.loadgen import _one, _prompt
from bench.native_front import start_target
from bench.overhead import (NATIVE_TARGETS, REPO, RESULTS, _second_config, _spawn, _start_passthrough, _start_slot,
                            settle)
from bench.harness import profiled_window, write_json_and_markdown
from bench.sched_cpu import SchedCpu as _Cpu
from sim.click_options import ClickOptions

WARMUP = 10
#: output tokens per SSE event after the first (the replicas' ``stream_chunk_tokens``, as in the grid)
CHUNK_TOKENS = 16


class StreamBodies:
    """Request bodies: a 64-word prompt unique per request, ``stream`` on, ``max_tokens`` for ``events``
    SSE events of output (1 + 16 (events - 1) tokens)."""

    def __init__(self, events: int) -> None:
        self.n = 0
        self.max_tokens = 1 + CHUNK_TOKENS * (events - 1)

    def __call__(self) -> bytes:
        self.n += 1
        return json.dumps({"model": "sim-model", "prompt": _prompt(self.n), "max_tokens": self.max_tokens,
                           "stream": True}).encode()


async def sequential_cpu(url: str, headers: Mapping[str, str], n: int, bodies: StreamBodies,
                         cpus: Sequence[_Cpu]) -> tuple[list[float], list[float], int]:
    """``n`` sequential requests on one connection: (CPU µs per request of each of ``cpus``, latencies ms,
    errors)."""
    import aiohttp

    lat: list[float] = []
    errors = 0
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=1)) as session:
        before = [c.seconds() for c in cpus]
        for _ in range(n):
            t = time.perf_counter()
            if await _one(session, url, headers, bodies()):
                lat.append((time.perf_counter() - t) * 1e3)
            else:
                errors += 1
        used = [(c.seconds() - b) * 1e6 / n for c, b in zip(cpus, before)]
    return used, lat, errors


def slope(xs: Sequence[float], ys: Sequence[float]) -> float:
    """Least-squares slope of ``ys`` over ``xs`` (same length >= 2, not all ``xs`` equal)."""
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)


async def run(args: SimpleNamespace, log: Any = print) -> dict[str, Any]:
    """The whole bench (module doc); returns the result document."""
    from bench.harness import start_demo_stack
    from sim.bench import start_sglang_router
    from sim.demo import ClusterSpec
    from sim.procs import stop_process

    events = [int(x) for x in args.events.split(",")]
    decode = args.gap_ms / 1e3 * 1e6 / CHUNK_TOKENS  # trace s per token at time scale 10^6: gap_ms per event
    stack = await start_demo_stack(Path(tempfile.mkdtemp(prefix="pg-stream-")),
                                   ClusterSpec(replicas=1, time_scale=1e6, decode_s_per_token=decode,
                                               stream_chunk_tokens=CHUNK_TOKENS))
    paths, cluster = stack.paths, stack.cluster
    direct = stack.replicas[0]["url"]
    cfg = stack.gateway_config(["tenant-a"])
    plain = {"Content-Type": "application/json"}
    auth = {**plain, **dict(stack.headers_for(["tenant-a"])("tenant-a"))}
    trees = {"prefixgate": REPO, "baseline": args.baseline, "aa": args.aa}
    for item in args.tree:  # NAME=DIR: more source trees (e.g. a variant with one part stubbed: its ceiling)
        name, _, tree = item.partition("=")
        trees[name] = Path(tree)
    names = [n for n in args.targets.split(",") if n not in trees or trees[n] is not None]
    live: dict[str, tuple[Any, str]] = {}
    rows: dict[str, dict[int, list[dict[str, Any]]]] = {n: {e: [] for e in events} for n in names}
    profile = None
    try:
        for name in names:
            if name == "smg":
                live[name] = await start_sglang_router("cache_aware", [direct], paths)
            elif name == "passthrough":
                live[name] = await _start_passthrough(direct, paths)
            elif name in NATIVE_TARGETS:  # session 22: bench/native_front.py
                live[name] = await start_target(name, 0, direct, _second_config(cfg, paths, name), paths)
            else:
                live[name] = await _start_slot(name, trees[name], _second_config(cfg, paths, name), paths)
        cpus = {n: (_Cpu(p.pid, children=False), _Cpu(p.pid), _Cpu(p.pid, children=False, main_thread=True))
                for n, (p, _) in live.items()}
        every = [c[1] for c in cpus.values()]
        for name in names:
            for ev in events:
                await sequential_cpu(live[name][1] + "/v1/completions", auth if name in trees or name == "prefixgate-native" else plain, WARMUP,
                                     StreamBodies(ev), cpus[name])
        for rnd in range(args.rounds):
            k = rnd % len(names)
            order = names[k:] + names[:k]
            for i, ev in enumerate(events):
                for name in (order if i % 2 == 0 else order[::-1]):
                    await settle(every)
                    used, lat, err = await sequential_cpu(live[name][1] + "/v1/completions",
                                                          auth if name in trees or name == "prefixgate-native" else plain, args.requests,
                                                          StreamBodies(ev), cpus[name])
                    rows[name][ev].append({"cpu_us": round(used[0], 1), "cpu_all_us": round(used[1], 1),
                                           "cpu_loop_us": round(used[2], 1),
                                           "p50_ms": round(statistics.median(lat), 3) if lat else None,
                                           "errors": err})
            log(f"round {rnd + 1}/{args.rounds}: " + "; ".join(
                f"{n} " + "/".join(f"{rows[n][e][-1]['cpu_us']:.0f}" for e in events) for n in names))
    finally:
        for proc, _ in live.values():
            stop_process(proc)
    if args.profile:
        try:
            profile = await profile_events(cfg, paths, auth, args.requests, args.profile, log)
        finally:
            stop_process(cluster)
    else:
        stop_process(cluster)
    if not args.keep_workdir:
        shutil.rmtree(paths.work, ignore_errors=True)
    return {"benchmark": "stream_cost", "args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
            "python": sys.version.split()[0], "cpus": os.cpu_count(), "loadavg_end": os.getloadavg(),
            "summary": summarize(rows, events), "rows": {n: {str(e): v for e, v in r.items()} for n, r in rows.items()},
            "profile": profile}


def summarize(rows: Mapping[str, Mapping[int, list[dict[str, Any]]]], events: Sequence[int]) -> dict[str, Any]:
    """Per target: median over rounds of CPU µs per request at each N, their min-max spread, and the
    per-event slope (µs per event) of the medians and of every round."""
    out: dict[str, Any] = {}
    for name, by_ev in rows.items():
        med = {e: statistics.median(r["cpu_us"] for r in by_ev[e]) for e in events}
        med_all = {e: statistics.median(r["cpu_all_us"] for r in by_ev[e]) for e in events}
        med_loop = {e: statistics.median(r["cpu_loop_us"] for r in by_ev[e]) for e in events}
        spread = {e: (min(r["cpu_us"] for r in by_ev[e]), max(r["cpu_us"] for r in by_ev[e])) for e in events}
        rounds = len(next(iter(by_ev.values())))
        per_round = [round(slope(events, [by_ev[e][i]["cpu_us"] for e in events]), 2) for i in range(rounds)]
        loop_rounds = [round(slope(events, [by_ev[e][i]["cpu_loop_us"] for e in events]), 2) for i in range(rounds)]
        out[name] = {"cpu_us": med, "cpu_all_us": med_all, "cpu_loop_us": med_loop, "spread": spread,
                     "per_event_loop_us": round(slope(events, [med_loop[e] for e in events]), 2) if len(events) > 1
                     else None, "per_event_loop_rounds": loop_rounds if len(events) > 1 else [],
                     "per_event_us": round(slope(events, [med[e] for e in events]), 2) if len(events) > 1 else None,
                     "per_event_rounds": per_round if len(events) > 1 else [],
                     "p50_ms": {e: statistics.median(r["p50_ms"] for r in by_ev[e]) for e in events},
                     "errors": sum(r["errors"] for v in by_ev.values() for r in v)}
    return out


async def profile_events(cfg: Mapping[str, Any], paths: Any, headers: Mapping[str, str], n: int, events: int,
                         log: Any) -> dict[str, Any]:
    """Profile this tree's gateway over ``n`` requests of 1 event and ``n`` of ``events`` events (module doc);
    returns per-function own and cumulative µs per event (profiled) and the profiled CPU per request."""
    import yaml

    from sim.procs import stop_process

    doc = _second_config(cfg, paths, "profiled")
    cfg_path = paths.work / "profiled.yaml"
    cfg_path.write_text(yaml.safe_dump(doc, sort_keys=False))
    stats: dict[int, pstats.Stats] = {}
    cpu_us: dict[int, float] = {}
    for ev in (1, events):
        out = paths.work / f"gateway-{ev}.prof"
        proc, base = await _spawn(f"profiled-{ev}", ["bench.overhead", "--profiled-gateway", str(cfg_path),
                                                     "--profile-out", str(out)], paths, doc["listen"]["port"], "/readyz")
        try:
            cpu = _Cpu(proc.pid, children=False)
            url = base + "/v1/completions"
            await sequential_cpu(url, headers, 3 * WARMUP, StreamBodies(ev), [cpu])
            used, _, _ = await profiled_window(proc.pid, out, sequential_cpu(url, headers, n, StreamBodies(ev), [cpu]))
            cpu_us[ev] = round(used[0], 1)
        finally:
            stop_process(proc)
        stats[ev] = pstats.Stats(str(out))
    own: dict[str, float] = {}
    cum: dict[str, float] = {}
    calls: dict[str, float] = {}
    for ev, sign in ((events, 1.0), (1, -1.0)):
        for func, (_cc, nc, tt, ct, _callers) in stats[ev].stats.items():  # type: ignore[attr-defined]
            key = f"{_short(func[0])}:{func[2]}"
            own[key] = own.get(key, 0.0) + sign * tt * 1e6 / n / (events - 1)
            cum[key] = cum.get(key, 0.0) + sign * ct * 1e6 / n / (events - 1)
            calls[key] = calls.get(key, 0.0) + sign * nc / n / (events - 1)
    files: dict[str, float] = {}
    for key, v in own.items():
        files[key.rsplit(":", 1)[0]] = files.get(key.rsplit(":", 1)[0], 0.0) + v
    log(f"  profiled: CPU/request {cpu_us} µs (1 and {events} events)")
    top = sorted(own, key=lambda k: -own[k])[:40]
    return {"requests": n, "events": events, "cpu_us_profiled": cpu_us,
            "per_event_own_us": {k: round(own[k], 2) for k in top},
            "per_event_calls": {k: round(calls[k], 2) for k in top},
            "per_event_cum_us": {k: round(cum[k], 2) for k in sorted(cum, key=lambda k: -cum[k])[:40]},
            "per_event_by_file_us": {k: round(v, 2) for k, v in sorted(files.items(), key=lambda kv: -kv[1])[:25]}}


def _short(path: str) -> str:
    """A profile entry's file as ``package/module.py`` (site-packages and the tree's root cut off)."""
    p = path.replace(os.sep, "/")
    for marker in ("/site-packages/", "/python3.11/", str(REPO) + "/"):
        if marker in p:
            return p.split(marker, 1)[1]
    return p


def to_markdown(doc: Mapping[str, Any]) -> str:
    """The result document as markdown."""
    a, s = doc["args"], doc["summary"]
    events = [int(x) for x in a["events"].split(",")]
    lines = [f"# Streamed answers: gateway CPU per request and per SSE event (`python -m bench.stream_cost`), {a['name']}",
             "", f"{a['rounds']} rounds x {a['requests']} sequential requests per target and N; one replica, "
             f"N events of 16 tokens (the first: 1), {a['gap_ms']} ms apart; Python {doc['python']}, {doc['cpus']} CPUs "
             f"shared; load average at the end {doc['loadavg_end'][0]:.1f}. CPU: the target's main process (the scheduler's ns count, bench.sched_cpu), "
             "median over rounds (min-max of rounds); `loop thread`: its main thread alone (the event loop: no Go "
             "runtime or tokenizer threads); `+children`: with the audit worker.", "",
             "| target | " + " | ".join(f"CPU µs/req, {e} ev" for e in events) + " | per event µs (rounds) | "
             + " | ".join(f"loop thread {e} ev" for e in events) + " | loop thread per event µs (rounds) | "
             + " | ".join(f"+children {e} ev" for e in events) + " | p50 ms " + "/".join(map(str, events)) + " | errors |",
             "|---|" + "---:|" * (3 * len(events) + 4)]
    for name, r in s.items():
        cells = [f"{r['cpu_us'][e]:.0f} ({r['spread'][e][0]:.0f}-{r['spread'][e][1]:.0f})" for e in events]
        lines.append(f"| {name} | " + " | ".join(cells) + f" | {r['per_event_us']} ({', '.join(map(str, r['per_event_rounds']))}) | "
                     + " | ".join(f"{r['cpu_loop_us'][e]:.0f}" for e in events)
                     + f" | {r['per_event_loop_us']} ({', '.join(map(str, r['per_event_loop_rounds']))}) | "
                     + " | ".join(f"{r['cpu_all_us'][e]:.0f}" for e in events) + " | "
                     + "/".join(f"{r['p50_ms'][e]:.2f}" for e in events) + f" | {r['errors']} |")
    p = doc.get("profile")
    if p:
        lines += ["", f"Profile of this tree (cProfile, thread CPU; {p['requests']} requests of 1 and of {p['events']} "
                  f"events; profiled CPU/request {p['cpu_us_profiled']} µs): per-event own CPU (µs per event, the "
                  f"{p['events']}-event run minus the 1-event run over {p['events'] - 1} events), by file:", "",
                  "| file | own µs/event |", "|---|---:|"]
        lines += [f"| {k} | {v} |" for k, v in p["per_event_by_file_us"].items()]
        lines += ["", "By function (own µs/event, calls/event):", "", "| function | own µs/event | calls/event |",
                  "|---|---:|---:|"]
        lines += [f"| {k} | {v} | {p['per_event_calls'][k]} |" for k, v in p["per_event_own_us"].items()]
        lines += ["", "By function, cumulative µs/event:", "", "| function | cum µs/event |", "|---|---:|"]
        lines += [f"| {k} | {v} |" for k, v in p["per_event_cum_us"].items()]
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point."""
    ap = ClickOptions(prog="python -m bench.stream_cost", description=__doc__.splitlines()[0])
    ap.option("--events", default="1,8,32", help="comma-separated SSE event counts per answer")
    ap.option("--requests", type=int, default=120, help="sequential requests per target, N and round")
    ap.option("--rounds", type=int, default=3)
    ap.option("--gap-ms", type=float, default=1.0, help="wall ms between the replica's events")
    ap.option("--targets", default="prefixgate,baseline,aa,smg,passthrough",
              help="also passthrough-native, prefixgate-native (bench/native_front.py, session 22)")
    ap.option("--baseline", type=click.Path(path_type=Path), default=None, help="source tree of target 'baseline'")
    ap.option("--aa", type=click.Path(path_type=Path), default=None, help="source tree of target 'aa' (a copy of this)")
    ap.option("--tree", multiple=True, default=[], metavar="NAME=DIR",
              help="another `prefixgate serve` target NAME from source tree DIR (repeatable; name it in --targets)")
    ap.option("--profile", type=int, default=0, help="also profile this tree at this many events (0: no profile)")
    ap.option("--keep-workdir", is_flag=True)
    ap.option("--out", type=click.Path(path_type=Path), default=RESULTS)
    ap.option("--name", default="stream-cost")
    args = ap.parse(argv)
    import uvloop

    doc = uvloop.run(run(args))
    args.out.mkdir(parents=True, exist_ok=True)
    write_json_and_markdown(args.out / args.name, doc, to_markdown(doc))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
