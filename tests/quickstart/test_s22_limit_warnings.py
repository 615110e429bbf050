"""Session 22, S21-newcomer-8: ``limits:`` start warnings name only what is really unbounded.

Before, a tenant without ``max_prompt_tokens`` got "bounded only by limits.max_prompt_tokens (if
set)" even where ``limits.max_prompt_tokens`` was set (the shipped example printed two such
warnings). Now a missing tenant bound counts only when the gateway has no default either; a
missing ``prompt_tokens_per_s`` (there is no gateway-wide token rate) is still named, with the
effective per-prompt bound.
"""
from __future__ import annotations

from pathlib import Path

from click.testing import CliRunner

from gateway.cli import main
from gateway.readiness import limit_warnings
from tenancy.registry import TenantRegistry

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "gateway.yaml"


def _registry(**fields: object) -> TenantRegistry:
    entry = {"id": "t", "spiffe_ids": ["spiffe://td.example/t"], "models": ["m"], "pools": ["p"], **fields}
    return TenantRegistry.from_config([entry])


def test_a_tenant_bounded_by_the_gateway_default_gets_no_per_prompt_warning() -> None:
    assert limit_warnings(_registry(prompt_tokens_per_s=100), 8192) == []
    assert limit_warnings(_registry(prompt_tokens_per_s=100, max_prompt_tokens=10), None) == []


def test_a_tenant_without_any_per_prompt_bound_is_named() -> None:
    (line,) = limit_warnings(_registry(prompt_tokens_per_s=100), None)
    assert line.startswith("tenant t: no max_prompt_tokens and no limits.max_prompt_tokens:"), line
    (line,) = limit_warnings(_registry(), None)
    assert line.startswith("tenant t: no max_prompt_tokens and no prompt_tokens_per_s, and no limits.max_prompt_tokens:")


def test_a_tenant_without_a_token_rate_is_named_with_its_effective_bound() -> None:
    (line,) = limit_warnings(_registry(), 8192)  # bounded per prompt by the default, no rate
    assert line.startswith("tenant t: no prompt_tokens_per_s:") and "limits.max_prompt_tokens 8192" in line, line
    assert "if set" not in line
    (line,) = limit_warnings(_registry(max_prompt_tokens=64), 8192)
    assert "each prompt by max_prompt_tokens 64" in line, line


def test_config_check_on_the_shipped_example_prints_no_warning(tmp_path: Path) -> None:
    # its state_file's directory (/var/lib/prefixgate) must exist (S21-newcomer-2): point it here
    env = {"PREFIXGATE__TENANCY__STATE_FILE": str(tmp_path / "keystate.json")}
    res = CliRunner().invoke(main, ["config", "check", "--config", str(EXAMPLE)], env=env)
    assert res.exit_code == 0, res.output
    assert res.output.splitlines() == [f"{EXAMPLE}: valid, 0 warning(s)"], res.output
