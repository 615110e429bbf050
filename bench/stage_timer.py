"""In-situ time per call of the pipeline's steps before routing, in a serving gateway (not a test).

``python -m bench.stage_timer [--requests 2000] [--rounds 3] [--set pre|route|post] [--out DIR] [--name NAME]``

Issue 14, session 8. The audit events' stage timings (``latency``: authentication, parse, prefix
keys, policy; wall ms between the pipeline's marks) hold more than the step they are named after:
``authentication`` runs from the record's start (span start, send-order turn, the audit check) to
the identity; ``parse`` holds admission (tenant, CPU meter, limits) and the body read;
``prefix keys`` holds tokenizing, the token-ledger reservation and the candidates. cProfile
inflates the pure-Python steps ~4x. This benchmark answers "which call costs what, in situ"
instead: one ``prefixgate serve`` process (the :mod:`bench.gateway_cpu_ab` configuration: JWT-SVID,
HMAC chain, embedded OPA, JSONL + OCSF audit), started by a child entry point that wraps each
listed function (:data:`TARGETS`) with a ``time.perf_counter_ns`` pair (about 0.1 µs each) before
serving, then ``--requests`` sequential requests (64 unique words, ``max_tokens`` 1) per round.
Reported per function: calls per request and the median and 25th percentile of its wall time per
call in µs (medians drop the preemptions of a shared machine; a coroutine's figure includes its
awaits), and the median of each audit stage window. Results: ``bench/results/<name>.{json,md}``.
"""

from __future__ import annotations

import asyncio
import functools
import importlib
import inspect
import json
import os
import shutil
import signal
import statistics
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import click

from bench.overhead import REPO, WARMUP, _Body, _second_config, sequential
from bench.sampled_serve import collect, options, serve_sampled

#: (module, attribute path) of each function timed; class attributes are patched on the class. Session 9:
#: no wrapper around a step a hit no longer calls (``JwtSvidVerifier._bundle``, ``_check_claims``,
#: ``CachedDecisionPoint.decide_keyed``): a wrapper is a coroutine and two clock reads inside its caller,
#: so a tree that still calls it would show its callers slower by the wrapper's own cost.
TARGETS: tuple[tuple[str, str], ...] = (
    ("gateway.auditing", "AuditHub.start_span"),
    ("gateway.send_order", "SendOrder.wait_turn"),
    ("gateway.authn", "Authenticator.authenticate"),
    ("gateway.authn", "extract_bearer"),
    ("gateway.identity.jwtsvid", "JwtSvidVerifier.verify"),
    ("gateway.identity.token_cache", "VerifiedTokenCache.get"),
    ("gateway.admission", "Admission.resolve_tenant"),
    ("gateway.admission", "Admission.admit"),
    ("gateway.admission", "Admission.request_bounds"),
    ("gateway.admission", "Admission.check_request"),
    ("gateway.admission", "Admission.prompt_room"),
    ("gateway.admission", "Admission.prompt_tokens"),
    ("gateway.admission", "Admission.check_prompt"),
    ("gateway.cpu_budget", "CpuBudget.meter"),
    ("gateway.pipeline", "read_body"),
    ("gateway.admission_front", "parse_and_count"),
    ("gateway.admission_front", "parse_inference_request"),
    ("tenancy.tokenizer", "WordTokenizer.encode"),
    ("gateway.prefix_keys", "PrefixKeys.prefix_chains"),
    ("tenancy.keys", "KeyRing.lookup_keys"),
    ("tenancy.keys", "block_hash_chain"),
    ("gateway.replicas", "ReplicaSet.candidates"),
    ("gateway.pep", "PolicyEnforcementPoint.decide"),
    ("gateway.pep", "head_key_fields"),
    ("gateway.auditing", "AuditHub.active_alerts"),
)

#: session 11: the route window (``t_decided`` → ``t_route``) and the step to the upstream write, per call
#: (``--set route``); ``InferencePipeline._prepare`` runs in the replica wait (for comparison)
ROUTE_TARGETS: tuple[tuple[str, str], ...] = (
    ("gateway.admission", "Admission.clamp_max_tokens"),
    ("gateway.pep", "PolicyEnforcementPoint.allowed_candidates"),
    ("gateway.pipeline", "upstream_body"),
    ("gateway.prefix_keys", "PrefixKeys.upstream_user"),
    ("gateway.admission", "Admission.slot_claim"),
    ("gateway.flow", "FlowControl.release_now"),
    ("gateway.flow", "FlowControl._place"),
    ("gateway.flow", "FlowControl._route"),
    ("gateway.flow", "FlowControl._released"),
    ("routing.router", "Router.candidates"),
    ("routing.router", "Router.route_among"),
    ("routing.policies.cache_aware", "CacheAwarePolicy.choose"),
    ("routing.index", "InProcessPrefixIndex.record"),
    ("routing.index", "InProcessPrefixIndex.match_many"),
    ("gateway.flow_load", "NotifyingLoadTracker.dispatch"),
    ("routing.calibration", "Calibration.estimate"),
    ("gateway.replicas", "ReplicaSet.attempt"),
    ("gateway.replicas", "ReplicaSet.get"),
    ("gateway.prefix_keys", "PrefixKeys.cache_salt"),
    ("gateway.auditing", "AuditHub.inject_trace_headers"),
    ("gateway.upstream_conn", "UpstreamConnection.send"),
    ("gateway.pipeline", "InferencePipeline._prepare"),
    ("gateway.pipeline", "InferencePipeline._end"),
    ("gateway.pipeline_answer", "plain_response"),
)
#: session 12: the answer window (the replica's answer → the last part's send) and the end, per call (``--set post``)
POST_TARGETS: tuple[tuple[str, str], ...] = (
    ("gateway.pipeline", "plain_response"),
    ("gateway.json_fast", "loads_answer"),
    ("gateway.pipeline", "InferencePipeline._end"),
    ("gateway.pipeline", "InferencePipeline._settle"),
    ("gateway.pipeline", "InferencePipeline._complete"),
    ("gateway.admission", "Admission.settle"),
    ("gateway.recording", "Recorder.record"),
    ("gateway.recording", "Recorder.hand_off"),
    ("gateway.recording", "Recorder.finish"),
    ("gateway.auditing", "AuditHub.emit_request"),
    ("gateway.auditing", "AuditHub.observe_request"),
    ("gateway.held", "Held.release"),
    ("gateway.held", "Held.leave"),
    ("routing.calibration", "Calibration.flush"),
    ("gateway.upstream", "Upstream.answered"),
    ("gateway.upstream_conn", "UpstreamConnection.data_received"),
)
SETS = {"pre": TARGETS, "route": ROUTE_TARGETS, "post": POST_TARGETS}


def _wrap(fn: Any, samples: list[int]) -> Any:
    clock = time.perf_counter_ns
    if inspect.iscoroutinefunction(fn):
        @functools.wraps(fn)
        async def timed_async(*a: Any, **k: Any) -> Any:
            t = clock()
            try:
                return await fn(*a, **k)
            finally:
                samples.append(clock() - t)
        return timed_async

    @functools.wraps(fn)
    def timed(*a: Any, **k: Any) -> Any:
        t = clock()
        try:
            return fn(*a, **k)
        finally:
            samples.append(clock() - t)
    return timed


def _install(targets: tuple[tuple[str, str], ...] = TARGETS) -> dict[str, list[int]]:
    """Wrap every function of ``targets`` that exists in this tree; returns name -> samples (ns)."""
    out: dict[str, list[int]] = {}
    for mod_name, path in targets:
        try:
            owner: Any = importlib.import_module(mod_name)
        except ImportError:
            continue
        *parents, attr = path.split(".")
        for p in parents:
            owner = getattr(owner, p, None)
        raw = owner.__dict__.get(attr) if owner is not None and hasattr(owner, "__dict__") else None
        if raw is None:
            continue
        samples: list[int] = []
        if isinstance(raw, staticmethod):
            setattr(owner, attr, staticmethod(_wrap(raw.__func__, samples)))
        else:
            setattr(owner, attr, _wrap(raw, samples))
        out[f"{mod_name}:{path}"] = samples
    return out


async def run(requests: int, rounds: int, target_set: str = "pre") -> dict[str, Any]:
    """The measurement (module doc); returns the result document."""
    from bench.overhead import _spawn
    from sim.demo import ClusterSpec, DemoPaths, bearer_headers, gateway_config, prepare_identity, start_cluster_proc
    from sim.procs import free_port, stop_process

    paths = DemoPaths.under(Path(tempfile.mkdtemp(prefix="pg-stage-timer-")))
    issuer = prepare_identity(paths)
    cluster, replicas = await start_cluster_proc(ClusterSpec(replicas=1, time_scale=1e6, decode_s_per_token=0.0),
                                                 paths)
    proc = None
    try:
        import yaml

        cfg = gateway_config("cache_aware", replicas, ["tenant-a"], paths, listen_port=free_port(),
                             admin_port=free_port())
        doc = _second_config(cfg, paths, "timed")
        cfg_path = paths.work / "timed.yaml"
        cfg_path.write_text(yaml.safe_dump(doc, sort_keys=False))
        out = paths.work / "samples.json"
        proc, base = await _spawn("timed", ["bench.stage_timer", "--child", str(cfg_path), "--samples-out", str(out),
                                            "--set", target_set],
                                  paths, doc["listen"]["port"], "/readyz")
        headers = {"Content-Type": "application/json", **dict(bearer_headers(issuer, ["tenant-a"])("tenant-a"))}
        bodies = _Body(False)
        url = base + "/v1/completions"
        await sequential(url, headers, WARMUP * 4, bodies)
        per_round: list[dict[str, list[int]]] = []
        for _ in range(rounds):
            os.kill(proc.pid, signal.SIGUSR1)
            await asyncio.sleep(0.2)
            await sequential(url, headers, requests, bodies)
            per_round.append(await collect(proc.pid, out))
        windows = _windows(doc)
    finally:
        if proc is not None:
            stop_process(proc)
        stop_process(cluster)
        shutil.rmtree(paths.work, ignore_errors=True)
    rows = {}
    for name in per_round[0]:
        meds = [statistics.median(r[name]) / 1000 for r in per_round if r[name]]
        q1 = [statistics.quantiles(r[name], n=4)[0] / 1000 for r in per_round if len(r[name]) > 1]
        rows[name] = {"calls_per_request": round(statistics.median(len(r[name]) / requests for r in per_round), 2),
                      "median_us": round(statistics.median(meds), 2) if meds else None,
                      "q1_us": round(statistics.median(q1), 2) if q1 else None}
    return {"benchmark": "stage_timer", "requests_per_round": requests, "rounds": rounds, "functions": rows,
            "audit_windows_ms": windows}


def _windows(doc: dict[str, Any]) -> dict[str, float]:
    """Median of each ``latency`` field of the audit events written so far (wall ms)."""
    vals: dict[str, list[float]] = {}
    for f in Path(doc["audit"]["jsonl"]["dir"]).glob("*.jsonl"):
        for line in f.read_text().splitlines():
            try:
                rec = json.loads(line)
            except ValueError:
                continue
            lat = rec.get("body", {}).get("latency") if rec.get("type") == "event" else None
            if not isinstance(lat, dict):
                continue
            for k, v in lat.items():
                if isinstance(v, (int, float)):
                    vals.setdefault(k, []).append(v)
    return {k: round(statistics.median(v), 4) for k, v in vals.items()}


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point."""
    ap = options("bench.stage_timer", __doc__ or "", requests=2000, rounds=3)
    ap.option("--set", "target_set", type=click.Choice(sorted(SETS)), default="pre")
    args = ap.parse(argv)
    if args.child:
        serve_sampled("bench.stage_timer", args.child, args.samples_out, lambda: _install(SETS[args.target_set]))
        return 0
    import uvloop

    doc = uvloop.run(run(args.requests, args.rounds, args.target_set))
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"{args.name}.json").write_text(json.dumps(doc, indent=2) + "\n")
    lines = [f"# In-situ time per call (`python -m bench.stage_timer`, tree {REPO})", "",
             f"{args.rounds} rounds of {args.requests} sequential requests; wall µs per call, median of the "
             "rounds' medians (a coroutine's includes its awaits).", "",
             "| function | calls/request | median µs | q1 µs |", "|---|---:|---:|---:|"]
    for name, row in doc["functions"].items():
        lines.append(f"| `{name}` | {row['calls_per_request']} | {row['median_us']} | {row['q1_us']} |")
    lines += ["", "Audit stage windows (median wall ms): " + ", ".join(
        f"{k} {v}" for k, v in doc["audit_windows_ms"].items())]
    (args.out / f"{args.name}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
