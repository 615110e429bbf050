from __future__ import annotations

import json
import stat
from pathlib import Path

import jwt
import pytest
import yaml

from sim.bounds import compute_bounds
from sim.demo import (
    TRUST_DOMAIN,
    ClusterSpec,
    DemoPaths,
    bearer_headers,
    gateway_config,
    prepare_identity,
    run_target,
    start_cluster_proc,
    tenant_spiffe_id,
)
from sim.procs import stop_process
from sim.replay import ReplayConfig
from sim.trace import DEFAULT_TRACE_PATH, assign_tenants, load_mooncake

REPLICAS = [{"replica_id": f"replica-{i}", "url": f"http://127.0.0.1:{9000 + i}"} for i in range(3)]


def test_gateway_config_passes_gateway_validation(tmp_path: Path) -> None:
    config_mod = pytest.importorskip("gateway.config")
    paths = DemoPaths.under(tmp_path)
    cfg = gateway_config("cache_aware", REPLICAS, ["tenant-a", "tenant-b"], paths, listen_port=18080,
                         admin_port=18081, index_capacity_blocks=4000)
    f = tmp_path / "gw.yaml"
    f.write_text(yaml.safe_dump(cfg), encoding="utf-8")
    loaded = config_mod.load_config(f)
    assert loaded.routing.policy.name == "cache_aware" and loaded.routing.block_size == 16
    assert [r.id for r in loaded.replicas] == ["replica-0", "replica-1", "replica-2"]
    assert loaded.listen.port == 18080
    assert [t["id"] for t in loaded.tenancy.tenants] == ["tenant-a", "tenant-b"]
    assert loaded.identity.trust_domains[TRUST_DOMAIN].bundle_file == str(paths.bundle)


def test_identity_material_and_tokens(tmp_path: Path) -> None:
    paths = DemoPaths.under(tmp_path)
    issuer = prepare_identity(paths)
    assert len(paths.master_secret.read_bytes()) == 64  # 32 random bytes as hex text
    assert stat.S_IMODE(paths.master_secret.stat().st_mode) == 0o600
    bundle = json.loads(paths.bundle.read_text())
    assert bundle["keys"] and bundle["keys"][0]["use"] == "jwt-svid"
    headers_for = bearer_headers(issuer, ["tenant-a", "tenant-b"])
    h = headers_for("tenant-b")
    assert headers_for("tenant-b") is h  # cached, not re-minted per request
    token = h["Authorization"].removeprefix("Bearer ")
    key = jwt.PyJWK(bundle["keys"][0], algorithm="ES256").key
    claims = jwt.decode(token, key, algorithms=["ES256"], audience="prefixgate")
    assert claims["sub"] == tenant_spiffe_id("tenant-b") == "spiffe://demo.prefixgate.test/tenant-b/replay"


async def test_cluster_process_and_direct_run(tmp_path: Path) -> None:
    """Spawn the real sim.cluster process and replay a slice straight at one replica."""
    paths = DemoPaths.under(tmp_path)
    spec = ClusterSpec(replicas=2, time_scale=100.0)
    proc, replicas = await start_cluster_proc(spec, paths)
    try:
        assert [r["replica_id"] for r in replicas] == ["replica-0", "replica-1"]
        urls = [r["url"] for r in replicas]
        reqs = load_mooncake(DEFAULT_TRACE_PATH, 60)
        names = ["tenant-a", "tenant-b"]
        tenants = assign_tenants(reqs, names, 1)
        bounds = compute_bounds(reqs, replicas=1, capacity_blocks=4000, tenants=names, seed=1)
        cfg = ReplayConfig(base_url="", time_scale=spec.time_scale, max_tokens_cap=8)
        summary, result = await run_target("direct", urls[0], urls, reqs, tenants, cfg, bounds,
                                           salt_for=lambda t: t)
        assert summary.ok == 60 and summary.errors == {}
        assert summary.requests_max == 60 and summary.requests_mean == 30  # all on replica-0
        assert summary.hit_rate == pytest.approx(result.client_hit_rate())
        # one replica with one unbounded-enough cache: at most the oracle (arrival races only lose hits)
        assert 0 < summary.hit_rate <= bounds.oracle + 1e-9
        assert summary.ttft_p50 is not None and summary.ttft_p50 > 0
    finally:
        stop_process(proc)
    assert not proc.alive()
