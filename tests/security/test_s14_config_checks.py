"""Session 14, reviews RV2-4 and RV2-7.

RV2-4: a tenant with empty ``pools`` is routed to every pool (``TenantPoolFilter``); the salt-pool rule
(R10-1) and the ``pass`` warning (R12b-6) read it as in no pool: a salt-less replica "shared" with a
pool-less tenant passed, and a ``pass`` tenant beside a pool-less one gave no warning. Now both count
it in every pool.

RV2-7: ``prefixgate config check`` said "valid" for files ``serve`` refuses at build time without a
secret or network: a salt-less replica shared by two tenants, a missing ``policy.dir``. Now it runs
those checks (gateway/config_check.py) and exits 1.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner

from gateway.cli import main
from gateway.config_tenancy import shared_pass_warnings
from gateway.salt_pools import salt_pool_error
from tenancy.registry import TenantRegistry


def _tenant(tid: str, pools: list[str], setting: str | None = None) -> dict[str, Any]:
    t: dict[str, Any] = {"id": tid, "spiffe_ids": [f"spiffe://demo.prefixgate.test/{tid}/"], "models": ["sim-model"],
                         "pools": pools}
    if setting is not None:
        t["usage_cached_tokens"] = setting
    return t


def _replica(rid: str, pool: str, salt: bool = True) -> dict[str, Any]:
    return {"id": rid, "url": f"http://127.0.0.1:9/{rid}", "pool": pool, "cache_salt": salt}


class _R:
    def __init__(self, rid: str, pool: str, salt: bool) -> None:
        self.id, self.pool, self.cache_salt = rid, pool, salt


def _tenants(*entries: dict[str, Any]) -> list[Any]:
    return TenantRegistry.from_config(list(entries)).tenants()


def test_a_salt_less_replica_shared_with_a_pool_less_tenant_breaks_the_rule() -> None:
    replicas = [_R("r0", "own", True), _R("trt", "batch", False)]
    error = salt_pool_error(replicas, _tenants(_tenant("a", ["batch"]), _tenant("b", [])))
    assert error is not None and "trt" in error and "a, b" in error  # before: None
    assert salt_pool_error(replicas, _tenants(_tenant("a", ["batch"]), _tenant("b", ["own"]))) is None
    assert salt_pool_error(replicas, _tenants(_tenant("b", []))) is None  # one tenant alone may use it


def test_a_pass_tenant_beside_a_pool_less_tenant_is_warned_about() -> None:
    got = shared_pass_warnings(_tenants(_tenant("a", ["p1"], "pass"), _tenant("b", [])), "drop")
    assert len(got) == 1 and got[0].startswith("tenant a:") and "p1" in got[0] and "b" in got[0]  # before: []
    got = shared_pass_warnings(_tenants(_tenant("a", [], "pass"), _tenant("b", ["p2"])), "drop")
    assert len(got) == 1 and got[0].startswith("tenant a:") and "every pool" in got[0]  # before: []
    assert shared_pass_warnings(_tenants(_tenant("a", [], "pass")), "drop") == []  # alone: nothing shared
    assert shared_pass_warnings(_tenants(_tenant("a", [], "drop"), _tenant("b", ["p"])), "drop") == []


def _check(tmp_path: Path, cfg: dict[str, Any]) -> Any:
    path = tmp_path / "gateway.yaml"
    path.write_text(yaml.safe_dump(cfg), encoding="utf-8")
    return CliRunner().invoke(main, ["config", "check", "--config", str(path)])


@pytest.mark.parametrize("cfg, words", [
    ({"replicas": [_replica("trt", "batch", salt=False)],
      "tenancy": {"tenants": [_tenant("a", ["batch"]), _tenant("b", ["batch"])]}}, "trt"),
    ({"replicas": [_replica("trt", "batch", salt=False)],
      "tenancy": {"tenants": [_tenant("a", ["batch"]), _tenant("b", [])]}}, "trt"),
    ({"policy": {"dir": "/nonexistent/prefixgate-policy"}, "tenancy": {"tenants": [_tenant("a", ["p"])]}},
     "/nonexistent/prefixgate-policy"),
    ({"policy": {"mode": "remote"}, "tenancy": {"tenants": [_tenant("a", ["p"])]}}, "policy.url"),
])
def test_config_check_refuses_what_serve_refuses_at_build(tmp_path: Path, cfg: dict[str, Any], words: str) -> None:
    res = _check(tmp_path, cfg)
    assert res.exit_code == 1, res.output  # before: "valid, 0 warning(s)", exit 0
    assert words in res.output


def test_config_check_refuses_a_policy_that_does_not_compile(tmp_path: Path) -> None:
    pol = tmp_path / "policy"
    pol.mkdir()
    (pol / "bad.rego").write_text("package prefixgate.authz\n\nallow if {\n", encoding="utf-8")
    res = _check(tmp_path, {"policy": {"dir": str(pol)}, "tenancy": {"tenants": [_tenant("a", ["p"])]}})
    assert res.exit_code == 1 and "policy:" in res.output, res.output


def test_config_check_passes_a_valid_file_with_its_policy(tmp_path: Path) -> None:
    res = _check(tmp_path, {"replicas": [_replica("trt", "batch", salt=False), _replica("r0", "general")],
                            "tenancy": {"tenants": [_tenant("a", ["batch"]), _tenant("b", ["general"])]}})
    assert res.exit_code == 0, res.output
    assert ": valid, " in res.output.splitlines()[-1]
    example = Path(__file__).resolve().parents[2] / "examples" / "gateway.yaml"
    # its state_file is /var/lib/prefixgate/keystate.json: that directory must exist (S21-newcomer-2)
    env = {"PREFIXGATE__TENANCY__STATE_FILE": str(tmp_path / "keystate.json")}
    res = CliRunner().invoke(main, ["config", "check", "--config", str(example)], env=env)
    assert res.exit_code == 0, res.output
