"""The main job: simulated replicas + the PrefixGate gateway + a real-trace replay per routing policy.

``prefixgate-sim demo`` (``make demo``) calls :func:`main`; also ``python -m sim.demo``. Steps:

1. spawn ``python -m sim.cluster`` (6 replicas, time-scaled, 16-token KV
   blocks, 4000 blocks each, 10k real tokens/s prefill) and read its ready file;
2. write a random 32-byte master secret (mode 0600) and a SPIFFE trust bundle
   of a demo JWT-SVID issuer (:class:`sim.spiffe_issuer.DemoIssuer`);
3. for each routing policy (round_robin, least_load, consistent_hash,
   cache_aware): write the gateway YAML config, start
   ``python -m gateway.cli serve --config CFG``, wait for ``GET /readyz``
   = 200, reset the replicas (``POST /sim/reset``), replay the first
   ``--rows`` rows of the Mooncake trace at ``--time-scale`` with one
   JWT-SVID per tenant workload, read every replica's ``/sim/stats``, stop
   the gateway;
4. skew phase (``--skew-rows``, default 160; 0 skips it): cache_aware with the
   load guard turned off (routing.policy parameters) on a hot-prefix workload (every
   request shares a 12-block prefix), with short concentration windows: the
   audit trail gets a ``replica_concentration`` alert;
5. print the comparison table and write ``results/demo.{md,json}`` (``--out``;
   ``results/`` is git-ignored, so a run never dirties the tree; the
   committed reference run is ``bench/results/demo.reference.{md,json}``);
6. verify the audit hash chain (:func:`audit.verify.verify_files` over the
   JSONL files with ``keys/audit-signing.key.pub``) and print a summary of
   events by outcome and the alerts (:func:`audit_summary`).

Defaults (600 rows at time scale 10, about 20 s of wall time per policy)
finish in a few minutes on 2 cores. Helpers here (:func:`start_cluster_proc`,
:func:`gateway_config`, :func:`start_gateway`, :func:`run_target`) are
reused by :mod:`sim.bench`.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import secrets
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import click
import yaml

from sim.bounds import HitRateBounds, compute_bounds, tenant_names
from sim.click_options import ClickOptions
from sim.procs import (
    ManagedProcess,
    free_port,
    python_module_cmd,
    start_process,
    stop_process,
    wait_for_json_file,
    wait_for_url,
)
from sim.replay import HeadersFor, ReplayConfig, ReplayResult, SaltFor, replay
from sim.report import RouterSummary, fetch_replica_stats, reset_replicas, summarize, write_report
from sim.trace import DEFAULT_TRACE_PATH, TraceRequest, assign_tenants, load_mooncake

__all__ = [
    "POLICIES",
    "TRUST_DOMAIN",
    "AUDIENCE",
    "MODEL",
    "ClusterSpec",
    "DemoPaths",
    "start_cluster_proc",
    "prepare_identity",
    "tenant_spiffe_id",
    "gateway_config",
    "start_gateway",
    "run_target",
    "main",
]

POLICIES = ("round_robin", "least_load", "consistent_hash", "cache_aware")
TRUST_DOMAIN = "demo.prefixgate.test"
AUDIENCE = "prefixgate"
MODEL = "sim-model"
REPO_ROOT = Path(__file__).resolve().parent.parent
#: Where a run writes its table (git-ignored); the committed reference run is
#: ``bench/results/demo.reference.{md,json}`` (copy a run there to update it).
RESULTS_DIR = REPO_ROOT / "results"


@dataclasses.dataclass(frozen=True)
class ClusterSpec:
    """Simulated replica cluster: ``replicas`` count, ``capacity_blocks`` per replica (16-token
    blocks), ``prefill_tokens_per_s`` real tokens per trace second, ``time_scale`` trace s per wall s,
    ``stream_chunk_tokens`` output tokens per SSE event, ``decode_s_per_token`` trace seconds
    per output token (None: the simulator's default), ``replica_model`` ``fifo`` or ``chunked``
    (:mod:`sim.replica`)."""

    replicas: int = 6
    capacity_blocks: int = 4000
    block_size: int = 16
    prefill_tokens_per_s: float = 10000.0
    time_scale: float = 10.0
    stream_chunk_tokens: int = 16
    decode_s_per_token: float | None = None
    replica_model: str = "fifo"

    def cli_args(self) -> list[str]:
        """Flags for ``python -m sim.cluster``."""
        args = [
            "--replicas", str(self.replicas), "--base-port", "0", "--host", "127.0.0.1",
            "--capacity-blocks", str(self.capacity_blocks), "--block-size", str(self.block_size),
            "--prefill-tokens-per-s", str(self.prefill_tokens_per_s), "--time-scale", str(self.time_scale),
            "--stream-chunk-tokens", str(self.stream_chunk_tokens),
        ]
        if self.decode_s_per_token is not None:
            args += ["--decode-s-per-token", str(self.decode_s_per_token)]
        if self.replica_model != "fifo":
            args += ["--replica-model", self.replica_model]
        return args


@dataclasses.dataclass(frozen=True)
class DemoPaths:
    """Files of one demo/bench run inside its work directory (secrets stay there, mode 0600)."""

    work: Path
    master_secret: Path
    bundle: Path
    audit_dir: Path
    logs: Path
    signing_key: Path

    @classmethod
    def under(cls, work: Path) -> DemoPaths:
        """Create the layout under ``work`` (the audit signing key lives apart from the audit log)."""
        p = cls(work, work / "master.key", work / "bundle.json", work / "audit", work / "logs",
                work / "keys" / "audit-signing.key")
        p.audit_dir.mkdir(parents=True, exist_ok=True)
        p.signing_key.parent.mkdir(parents=True, exist_ok=True)
        p.logs.mkdir(parents=True, exist_ok=True)
        return p


async def start_cluster_proc(spec: ClusterSpec, paths: DemoPaths) -> tuple[ManagedProcess, list[dict[str, str]]]:
    """Spawn ``python -m sim.cluster`` and return it with its ready document ``[{replica_id, url}]``.

    Raises :class:`sim.procs.ProcessStartError` if it exits or is not ready in 30 s.
    """
    ready = paths.work / "cluster-ready.json"
    ready.unlink(missing_ok=True)
    proc = start_process("cluster", python_module_cmd("sim.cluster", *spec.cli_args(), "--ready-file", str(ready)),
                         paths.logs, cwd=REPO_ROOT)
    try:
        doc = await wait_for_json_file(ready, timeout_s=30.0, proc=proc)
    except BaseException:
        stop_process(proc)
        raise
    return proc, list(doc)


def tenant_spiffe_id(tenant: str, workload: str = "replay") -> str:
    """SPIFFE ID of a tenant's demo workload: ``spiffe://demo.prefixgate.test/<tenant>/<workload>``."""
    return f"spiffe://{TRUST_DOMAIN}/{tenant}/{workload}"


def prepare_identity(paths: DemoPaths) -> Any:
    """Write the master secret (32 random bytes, 0600) and the trust bundle; return the issuer.

    The issuer is :class:`sim.spiffe_issuer.DemoIssuer` for :data:`TRUST_DOMAIN`.
    """
    fd = os.open(paths.master_secret, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as fh:
        fh.write(secrets.token_hex(32).encode())
    from sim.spiffe_issuer import DemoIssuer

    issuer = DemoIssuer(TRUST_DOMAIN)
    issuer.write_bundle(paths.bundle)
    from audit.keys import generate_signing_key

    generate_signing_key(paths.signing_key)
    return issuer


def bearer_headers(issuer: Any, tenants: Sequence[str], ttl_s: float = 1800.0) -> HeadersFor:
    """Return ``headers_for(tenant)`` giving a JWT-SVID bearer header per tenant workload.

    Tokens are minted once per tenant and re-minted when less than a third of
    ``ttl_s`` is left.
    """
    cache: dict[str, tuple[float, dict[str, str]]] = {}

    def headers_for(tenant: str) -> Mapping[str, str]:
        hit = cache.get(tenant)
        now = time.time()
        if hit is None or hit[0] - now < ttl_s / 3:
            tok = issuer.mint(tenant_spiffe_id(tenant), AUDIENCE, ttl_s)
            hit = (now + ttl_s, {"Authorization": f"Bearer {tok}"})
            cache[tenant] = hit
        return hit[1]

    for t in tenants:
        headers_for(t)
    return headers_for


def gateway_config(
    policy: str,
    replicas: Sequence[Mapping[str, str]],
    tenants: Sequence[str],
    paths: DemoPaths,
    *,
    listen_port: int,
    admin_port: int,
    block_size: int = 16,
    index_capacity_blocks: int = 4000,
    params: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """Return the gateway YAML config (as a dict) in the agreed demo format (docs/architecture.md)."""
    return {
        "listen": {"host": "127.0.0.1", "port": listen_port},
        "admin": {"host": "127.0.0.1", "port": admin_port},
        "routing": {"policy": {"name": policy, **dict(params or {})}, "block_size": block_size,
                    "index_capacity_blocks": index_capacity_blocks},
        "replicas": [{"id": r["replica_id"], "url": r["url"], "pool": "default", "labels": {}} for r in replicas],
        "tenancy": {
            "master_secret_file": str(paths.master_secret),
            # the benchmark clients read usage.prompt_tokens_details.cached_tokens (sim/replay.py's client
            # hit rate; bench/scaleout.py's windows): relayed here, dropped by default (review R12-1)
            "usage_cached_tokens": "pass",
            "tenants": [
                {"id": t, "spiffe_ids": [f"spiffe://{TRUST_DOMAIN}/{t}/"], "models": [MODEL], "pools": ["default"]}
                for t in tenants
            ],
        },
        "identity": {"trust_domains": {TRUST_DOMAIN: {"bundle_file": str(paths.bundle)}}, "audience": AUDIENCE},
        "policy": {"mode": "embedded", "dir": str(REPO_ROOT / "rego")},
        "audit": {
            "jsonl": {"dir": str(paths.audit_dir / "jsonl"), "signing_key_file": str(paths.signing_key),
                      "checkpoint_s": 10},
            "ocsf": {"file": str(paths.audit_dir / "ocsf.jsonl")},
            "spill": {"dir": str(paths.audit_dir / "spill")},
        },
    }


async def start_gateway(name: str, config: Mapping[str, Any], paths: DemoPaths,
                        timeout_s: float = 30.0) -> tuple[ManagedProcess, str]:
    """Write ``config`` to ``paths.work/name.yaml``, start the gateway, wait for ``/readyz`` = 200.

    Returns the process and the public base URL. Raises
    :class:`sim.procs.ProcessStartError` (with the log tail) otherwise.
    """
    cfg_path = paths.work / f"{name}.yaml"
    cfg_path.write_text(yaml.safe_dump(dict(config), sort_keys=False), encoding="utf-8")
    proc = start_process(name, python_module_cmd("gateway.cli", "serve", "--config", str(cfg_path)),
                         paths.logs, cwd=REPO_ROOT)
    base = f"http://127.0.0.1:{config['listen']['port']}"
    try:
        await wait_for_url(f"{base}/readyz", timeout_s=timeout_s, proc=proc)
    except BaseException:
        stop_process(proc)
        raise
    return proc, base


async def run_target(
    label: str,
    base_url: str,
    replica_urls: Sequence[str],
    reqs: Sequence[TraceRequest],
    tenants: Sequence[str],
    cfg: ReplayConfig,
    bounds: HitRateBounds | None,
    *,
    headers_for: HeadersFor | None = None,
    salt_for: SaltFor | None = None,
    settle_s: float = 0.2,
) -> tuple[RouterSummary, ReplayResult]:
    """Reset the replicas, replay ``reqs`` through ``base_url``, read replica stats, summarise."""
    await reset_replicas(replica_urls)
    cfg = dataclasses.replace(cfg, base_url=base_url)
    result = await replay(reqs, cfg, tenants, headers_for=headers_for, salt_for=salt_for)
    await asyncio.sleep(settle_s)
    stats = await fetch_replica_stats(replica_urls)
    result.meta["label"] = label
    return summarize(label, result, stats, bounds), result


def hot_prefix_requests(n: int, shared_blocks: int = 12, interval_s: float = 0.5,
                        output_tokens: int = 32) -> list[TraceRequest]:
    """``n`` synthetic trace requests sharing one ``shared_blocks``-block prefix (512-token
    blocks) plus one unique block each, one every ``interval_s`` trace seconds."""
    shared = tuple(range(10_000_000, 10_000_000 + shared_blocks))
    return [TraceRequest(i, i * interval_s, (shared_blocks + 1) * 512, output_tokens, shared + (20_000_000 + i,))
            for i in range(n)]


async def _skew_phase(rows: int, replicas: Sequence[Mapping[str, str]], names: Sequence[str], paths: DemoPaths,
                      spec: ClusterSpec, rcfg: ReplayConfig, headers_for: HeadersFor,
                      log: Callable[[str], None]) -> None:
    """Hot-prefix workload through cache_aware with the load guard off: a concentration alert."""
    cfg = gateway_config("cache_aware", replicas, names, paths, listen_port=free_port(), admin_port=free_port(),
                         block_size=spec.block_size, index_capacity_blocks=spec.capacity_blocks,
                         params={"guard_tokens": False, "max_request_factor": 1000.0})
    cfg["audit"]["concentration"] = {"window_s": 5.0, "hold_s": 2.0, "min_requests": 20,
                                     "pools": {"default": [r["replica_id"] for r in replicas]}}
    reqs = hot_prefix_requests(rows)
    gw, base = await start_gateway("gateway-skew", cfg, paths)
    try:
        await reset_replicas([r["url"] for r in replicas])
        t = time.monotonic()
        result = await replay(reqs, dataclasses.replace(rcfg, base_url=base), [names[0]] * len(reqs),
                              headers_for=headers_for)
    finally:
        stop_process(gw)
    log(f"  skew phase (cache_aware, load guard off, one hot prefix): {len(result.ok)}/{len(reqs)} ok "
        f"({time.monotonic() - t:.0f} s wall)")


def audit_summary(paths: DemoPaths, log: Callable[[str], None] = print) -> dict[str, Any]:
    """Verify the demo's audit chain and print events by outcome and the alerts.

    Returns ``{"verified": bool, "records", "checkpoints", "outcomes": {kind:outcome: n},
    "alerts": [{outcome, alert_kind, pool, replica, tenant_id, value, threshold}]}``
    (``tenant_id``: the tenant an attributed alert names, None = all tenants).
    """
    import json
    from collections import Counter

    from audit.keys import load_public_key
    from audit.verify import verify_files
    from audit.verify_report import format_report

    jdir = paths.audit_dir / "jsonl"
    pub = paths.signing_key.with_name(paths.signing_key.name + ".pub")
    report = verify_files([jdir], load_public_key(pub))
    outcomes: Counter[str] = Counter()
    alerts: list[dict[str, Any]] = []
    for f in sorted(jdir.glob("*.jsonl")):
        for line in f.read_text(encoding="utf-8").splitlines():
            rec = json.loads(line)
            if rec.get("type") != "event":
                continue
            body = rec["body"]
            outcomes[f"{body['kind']}:{body['outcome']}"] += 1
            if body["kind"] == "alert":
                a = body.get("alert", {})
                alerts.append({"outcome": body["outcome"], **{k: a.get(k) for k in
                               ("alert_kind", "pool", "replica", "tenant_id", "value", "threshold")}})
    log(f"audit chain: {'verified' if report.ok else 'BROKEN'} ({report.files} files, {report.records} records, "
        f"{report.checkpoints} signed checkpoints)")
    if not report.ok:
        log(format_report(report))
    log("audit events by kind:outcome: " + ", ".join(f"{k} {n}" for k, n in sorted(outcomes.items())))
    for a in alerts:
        log(f"  alert {a['outcome']}: {a['alert_kind']} pool={a['pool']} replica={a['replica']} "
            f"tenant={a['tenant_id'] or 'all'} value={a['value']} threshold={a['threshold']}")
    if not any(a["alert_kind"] in ("replica_concentration", "pool_concentration") for a in alerts):
        log("  (no concentration alert)")
    return {"verified": report.ok, "records": report.records, "checkpoints": report.checkpoints,
            "outcomes": dict(outcomes), "alerts": alerts}


def _parse(argv: Sequence[str] | None) -> SimpleNamespace:
    ap = ClickOptions(prog="prefixgate-sim demo", description="Replay a real trace through PrefixGate, "
                      "one run per routing policy, and compare.", show_default=True)  # R11-D2
    ap.option("--trace", type=click.Path(path_type=Path), default=DEFAULT_TRACE_PATH, help="Mooncake trace (JSONL)")
    ap.option("--rows", type=int, default=600, help="first N trace rows")
    ap.option("--time-scale", type=float, default=10.0, help="trace seconds per wall second")
    ap.option("--replicas", type=int, default=6, help="simulated replicas")
    ap.option("--capacity-blocks", type=int, default=4000, help="KV blocks (16 tokens) per replica")
    ap.option("--prefill-tokens-per-s", type=float, default=10000.0, help="real tokens per trace second")
    ap.option("--tenants", type=int, default=3, help="number of tenants (conversations assigned by seed)")
    ap.option("--policies", default=",".join(POLICIES), help="comma-separated routing policies")
    ap.option("--max-tokens-cap", type=int, default=None, help="cap on max_tokens (default: trace value)")
    ap.option("--seed", type=int, default=0, help="seed of the tenant assignment")
    ap.option("--out", type=click.Path(path_type=Path), default=RESULTS_DIR, help="directory for demo.md / demo.json")
    ap.option("--name", default="demo", help="result file stem")
    ap.option("--keep-workdir", is_flag=True, help="keep configs, logs and audit files")
    ap.option("--skew-rows", type=int, default=160,
              help="requests of the hot-prefix phase with the load guard off (0: skip)")
    return ap.parse(argv)


async def run_demo(args: SimpleNamespace, log: Callable[[str], None] = print) -> list[RouterSummary]:
    """Run the demo described by ``args`` (see :func:`_parse`); return one summary per policy."""
    policies = [p.strip() for p in args.policies.split(",") if p.strip()]
    unknown = set(policies) - set(POLICIES)
    if unknown:
        raise SystemExit(f"unknown policies: {sorted(unknown)}")
    spec = ClusterSpec(replicas=args.replicas, capacity_blocks=args.capacity_blocks,
                       prefill_tokens_per_s=args.prefill_tokens_per_s, time_scale=args.time_scale)
    reqs = load_mooncake(args.trace, args.rows)
    names = tenant_names(args.tenants)
    tenants = assign_tenants(reqs, names, args.seed)
    bounds = compute_bounds(reqs, replicas=spec.replicas, capacity_blocks=spec.capacity_blocks,
                            block_size=spec.block_size, tenants=names, seed=args.seed)
    log(f"{len(reqs)} trace rows ({reqs[-1].timestamp - reqs[0].timestamp:.0f} trace s), {len(names)} tenants, "
        f"time scale {spec.time_scale:g}; bounds: pooled {bounds.pooled:.3f}, oracle {bounds.oracle:.3f}")
    work = Path(tempfile.mkdtemp(prefix="prefixgate-demo-"))
    paths = DemoPaths.under(work)
    issuer = prepare_identity(paths)
    headers_for = bearer_headers(issuer, names)
    cluster, replicas = await start_cluster_proc(spec, paths)
    urls = [r["url"] for r in replicas]
    summaries: list[RouterSummary] = []
    rcfg = ReplayConfig(base_url="", time_scale=spec.time_scale, max_tokens_cap=args.max_tokens_cap,
                        seed=args.seed, total_timeout_s=max(120.0, 3 * (reqs[-1].timestamp / spec.time_scale) + 60))
    try:
        for policy in policies:
            cfg = gateway_config(policy, replicas, names, paths, listen_port=free_port(), admin_port=free_port(),
                                 block_size=spec.block_size, index_capacity_blocks=spec.capacity_blocks)
            gw, base = await start_gateway(f"gateway-{policy}", cfg, paths)
            try:
                t = time.monotonic()
                summary, _ = await run_target(policy, base, urls, reqs, tenants, rcfg, bounds,
                                              headers_for=headers_for)
            finally:
                stop_process(gw)
            summaries.append(summary)
            log(f"  {policy:16s} hit {summary.hit_rate or 0:.3f}  TTFT p50 {summary.ttft_p50 or 0:.3f} "
                f"p99 {summary.ttft_p99 or 0:.3f} trace s (wall s x {spec.time_scale:g})  errors {sum(summary.errors.values())}  "
                f"({time.monotonic() - t:.0f} s wall)")
        if args.skew_rows > 0:
            await _skew_phase(args.skew_rows, replicas, names, paths, spec, rcfg, headers_for, log)
    finally:
        stop_process(cluster)
        try:
            audit_summary(paths, log)
        except Exception as exc:  # the summary must never hide the demo's own result
            log(f"audit summary failed: {type(exc).__name__}: {exc}")
        if not args.keep_workdir:
            shutil.rmtree(work, ignore_errors=True)
        else:
            log(f"work directory kept: {work}")
    meta = {"rows": len(reqs), "replicas": spec.replicas, "capacity_blocks": spec.capacity_blocks,
            "prefill_tokens_per_s": spec.prefill_tokens_per_s, "time_scale": spec.time_scale,
            "tenants": len(names), "seed": args.seed, "max_tokens_cap": args.max_tokens_cap}
    jp, mp = write_report(summaries, args.out, args.name, title="PrefixGate routing policies on the Mooncake trace",
                          meta=meta)
    log(mp.read_text(encoding="utf-8"))
    log(f"written: {mp} and {jp}")
    return summaries


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``prefixgate-sim demo`` / ``python -m sim.demo``; returns the exit code.

    Exit code 0 when every policy ran; 1 when any run had errors (the table
    is still written); 2 when a component failed to start.
    """
    from sim.procs import ProcessStartError

    args = _parse(argv)
    try:
        summaries = asyncio.run(run_demo(args))
    except ProcessStartError as exc:
        print(f"demo failed to start a component: {exc}", file=sys.stderr)
        return 2
    return 1 if any(s.errors for s in summaries) else 0


if __name__ == "__main__":
    raise SystemExit(main())
