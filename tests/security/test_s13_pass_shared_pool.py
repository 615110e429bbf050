"""Review R12b-6 (session 13): a tenant with ``usage_cached_tokens: pass`` that shares a replica pool
with another tenant can read that tenant's uncached prompt lengths (R12-1's prime+probe); the operator
is told at start (a ``configuration:`` warning) and by ``prefixgate config check``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner

from gateway.cli import main
from gateway.config_tenancy import shared_pass_warnings
from tenancy.registry import TenantRegistry


def _tenant(tid: str, pools: list[str], setting: str | None = None) -> dict[str, Any]:
    t: dict[str, Any] = {"id": tid, "spiffe_ids": [f"spiffe://demo.prefixgate.test/{tid}/"], "models": ["sim-model"],
                         "pools": pools}
    if setting is not None:
        t["usage_cached_tokens"] = setting
    return t


def _warnings(tenants: list[dict[str, Any]], default: str = "drop") -> list[str]:
    return shared_pass_warnings(TenantRegistry.from_config(tenants).tenants(), default)


def test_a_pass_tenant_sharing_a_pool_is_named_with_the_tenants_it_can_measure() -> None:
    got = _warnings([_tenant("a", ["p1", "p2"], "pass"), _tenant("b", ["p1"]), _tenant("c", ["p2"], "drop"),
                     _tenant("alone", ["p3"])])
    assert len(got) == 1
    assert got[0].startswith("tenant a:") and "p1, p2" in got[0] and "b, c" in got[0] and "alone" not in got[0]


def test_no_warning_when_pass_pools_are_its_own_or_every_tenant_drops() -> None:
    assert _warnings([_tenant("a", ["own"], "pass"), _tenant("b", ["shared"]), _tenant("c", ["shared"])]) == []
    assert _warnings([_tenant("a", ["shared"], "drop"), _tenant("b", ["shared"], "drop")], default="pass") == []


def test_the_tenancy_default_pass_counts_for_tenants_without_their_own_setting() -> None:
    got = _warnings([_tenant("a", ["s"]), _tenant("b", ["s"]), _tenant("c", ["s"], "drop")], default="pass")
    assert [w.split(":")[0] for w in got] == ["tenant a", "tenant b"]


@pytest.mark.parametrize("config_overrides", [{"tenancy": {"tenants": [
    {**_tenant("tenant-a", ["default"], "pass"), "spiffe_ids": ["spiffe://demo.prefixgate.test/tenant-a/"]},
    {**_tenant("tenant-b", ["default"]), "spiffe_ids": ["spiffe://demo.prefixgate.test/tenant-b/"]}]}}])
async def test_the_gateway_lists_it_with_its_start_warnings(stack: Any) -> None:
    got = [w for w in stack.components.configuration_warnings() if "usage_cached_tokens" in w]
    assert len(got) == 1 and got[0].startswith("tenant tenant-a:") and "tenant-b" in got[0]


def test_config_check_prints_it(tmp_path: Path) -> None:
    cfg = {"tenancy": {"tenants": [_tenant("a", ["default"], "pass"), _tenant("b", ["default"])]}}
    path = tmp_path / "gateway.yaml"
    path.write_text(yaml.safe_dump(cfg), encoding="utf-8")
    res = CliRunner().invoke(main, ["config", "check", "--config", str(path)])
    assert res.exit_code == 0, res.output
    assert any(line.startswith("configuration: tenant a: usage_cached_tokens is pass") for line in res.output.splitlines())
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump({"tenancy": {"usage_cached_tokens": "maybe"}}), encoding="utf-8")
    assert CliRunner().invoke(main, ["config", "check", "--config", str(bad)]).exit_code == 1


async def test_a_registry_reload_logs_it_too(stack: Any, caplog: pytest.LogCaptureFixture) -> None:
    tenants = [{**_tenant("tenant-a", ["default"], "pass"), "spiffe_ids": ["spiffe://demo.prefixgate.test/tenant-a/"]},
               {**_tenant("tenant-b", ["default"]), "spiffe_ids": ["spiffe://demo.prefixgate.test/tenant-b/"]}]
    with caplog.at_level("WARNING", logger="prefixgate"):
        stack.components.admin.apply_registry(tenants, [])
    got = [r.getMessage() for r in caplog.records if "usage_cached_tokens is pass" in r.getMessage()]
    assert len(got) == 1 and got[0].startswith("configuration: tenant tenant-a:"), got
