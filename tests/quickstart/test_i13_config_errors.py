"""Issue 13: configuration errors read as docs/configuration.md says,
``invalid configuration: <dotted.location>: <problem>``, tenants included.

Before the fix a tenant's error read ``tenants[acme].max_output_token:
unknown field`` and surfaced only when the gateway was built, not at load.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner

from gateway.cli import main as prefixgate
from gateway.config import ConfigError, load_config

TD = "prod.example"


def _tenant(**kw: Any) -> dict[str, Any]:
    return {"id": "acme", "spiffe_ids": [f"spiffe://{TD}/ns/acme/"], "models": ["sim-model"], "pools": ["default"], **kw}


@pytest.mark.parametrize("tenants,operators,message", [
    ([_tenant(max_output_token=5)], [], "tenancy.tenants.0.max_output_token: unknown field"),
    ([_tenant(), _tenant(id="beta", rate_rps=-1)], [], "tenancy.tenants.1.rate_rps: must be a positive finite number"),
    ([_tenant(spiffe_ids=["spiffe://x/../y"])], [], "tenancy.tenants.0.spiffe_ids.0: invalid SPIFFE ID"),
    ([_tenant(pools=[""])], [], "tenancy.tenants.0.pools.0: must be a name"),
    ([_tenant(), _tenant(id="beta", spiffe_ids=[f"spiffe://{TD}/ns/acme/x"])], [],
     "tenancy.tenants.1.spiffe_ids: rule 'spiffe://prod.example/ns/acme/x' overlaps"),
    ([_tenant()], ["not-spiffe"], "tenancy.operators.0: invalid SPIFFE ID"),
])
def test_tenant_errors_use_dotted_locations(tmp_path: Path, tenants: list[Any], operators: list[str],
                                            message: str) -> None:
    cfg = tmp_path / "gateway.yaml"
    cfg.write_text(yaml.safe_dump({"tenancy": {"tenants": tenants, "operators": operators}}))
    with pytest.raises(ConfigError) as exc:
        load_config(cfg)
    assert str(exc.value).startswith(f"invalid configuration: {message}"), str(exc.value)


def test_pydantic_errors_keep_the_same_form(tmp_path: Path) -> None:
    cfg = tmp_path / "gateway.yaml"
    cfg.write_text(yaml.safe_dump({"replicas": [{"id": "r0", "url": "ftp://x"}]}))
    with pytest.raises(ConfigError, match=r"^invalid configuration: replicas\.0\.url: replica url"):
        load_config(cfg)


def test_serve_prints_the_documented_message(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GOGC", os.environ.get("GOGC", "800"))  # no re-exec inside the test process
    cfg = tmp_path / "gateway.yaml"
    cfg.write_text(yaml.safe_dump({"tenancy": {"tenants": [_tenant(max_output_token=5)]}}))
    res = CliRunner().invoke(prefixgate, ["serve", "--config", str(cfg)])
    assert res.exit_code != 0
    assert "Error: invalid configuration: tenancy.tenants.0.max_output_token: unknown field" in res.output, res.output


def test_review_config_errors_read_as_documented(tmp_path: Path) -> None:
    """Review finding: whole-file rules and build-time checks also read
    ``invalid configuration: <dotted key>: <message>`` (no empty path, no pydantic prefix)."""
    from gateway.build import build

    cfg_file = tmp_path / "dup.yaml"
    cfg_file.write_text("replicas:\n  - {id: r, url: 'http://127.0.0.1:1'}\n  - {id: r, url: 'http://127.0.0.1:2'}\n")
    with pytest.raises(ConfigError) as exc:
        load_config(cfg_file)
    assert str(exc.value) == "invalid configuration: replicas: replica ids must be unique"
    empty = tmp_path / "empty.yaml"
    empty.write_text("listen: {port: 0}\n")
    with pytest.raises(ConfigError) as exc:
        build(load_config(empty))
    assert str(exc.value).startswith("invalid configuration: replicas: ")
