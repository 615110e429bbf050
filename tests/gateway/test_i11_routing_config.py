"""Issue 11 (items 3 and 4, routing half): ``routing.policy`` is one pydantic
schema, a discriminated union on ``name``, whose errors name the key."""

from __future__ import annotations

from pathlib import Path

import pytest

from gateway.config import ConfigError, load_config
from routing.config import policy_from_config
from routing.policies import CacheAwareConfig, CacheAwarePolicy, ConsistentHashConfig, RoundRobinConfig


def _routing(section: dict) -> object:
    return load_config(None, {"routing": section}).routing


def _error(section: dict) -> str:
    with pytest.raises(ConfigError) as exc:
        load_config(None, {"routing": section})
    return str(exc.value)


def test_default_and_bare_name_and_mapping() -> None:
    assert load_config(None).routing.policy == CacheAwareConfig()
    assert _routing({"policy": "round_robin"}).policy == RoundRobinConfig()  # type: ignore[attr-defined]
    pol = _routing({"policy": {"name": "consistent_hash", "epsilon": 0.5}}).policy  # type: ignore[attr-defined]
    assert pol == ConsistentHashConfig(epsilon=0.5)


def test_parameters_reach_the_policy() -> None:
    cfg = _routing({"policy": {"name": "cache_aware", "max_load_factor": 1.5, "prefix_weight": 4}})
    policy = policy_from_config(cfg.policy)  # type: ignore[attr-defined]
    assert isinstance(policy, CacheAwarePolicy)
    assert policy.load_factor == 1.5 and policy.config.prefix_weight == 4.0


@pytest.mark.parametrize(
    ("section", "expected"),
    [
        ({"policy": {"name": "cache_aware", "prefix_weight": -1}},
         "invalid configuration: routing.policy.prefix_weight: Input should be greater than or equal to 0"),
        ({"policy": {"name": "cache_aware", "prefix_wieght": 1}},
         "invalid configuration: routing.policy.prefix_wieght: unknown field"),
        ({"policy": {"name": "round_robin", "epsilon": 0.5}},
         "invalid configuration: routing.policy.epsilon: unknown field"),
        ({"policy": {"name": "consistent_hash", "virtual_nodes": 0}},
         "invalid configuration: routing.policy.virtual_nodes: Input should be greater than or equal to 1"),
        ({"policy": {"name": "cache_aware", "prefill_tokens_per_s": float("inf")}},
         "invalid configuration: routing.policy.prefill_tokens_per_s: Input should be a finite number"),
        ({"policy": "nope"},
         "invalid configuration: routing.policy: name must be one of round_robin, least_load, consistent_hash, "
         "cache_aware"),
        ({"policy": {"epsilon": 0.5}},
         "invalid configuration: routing.policy: name must be one of round_robin, least_load, consistent_hash, "
         "cache_aware"),
    ],
)
def test_errors_name_the_key(section: dict, expected: str) -> None:
    assert _error(section) == expected


def test_old_params_key_points_to_policy() -> None:
    msg = _error({"policy": "cache_aware", "params": {"prefix_weight": 3}})
    assert msg.startswith("invalid configuration: routing.params: ") and "routing.policy" in msg


def test_environment_overrides_policy_and_its_parameters(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    f = tmp_path / "gw.yaml"
    f.write_text("routing:\n  policy:\n    name: cache_aware\n    decode_weight: 1\n", encoding="utf-8")
    monkeypatch.setenv("PREFIXGATE__ROUTING__POLICY__PREFIX_WEIGHT", "3")
    pol = load_config(f).routing.policy
    assert isinstance(pol, CacheAwareConfig) and pol.prefix_weight == 3.0 and pol.decode_weight == 1.0
    monkeypatch.delenv("PREFIXGATE__ROUTING__POLICY__PREFIX_WEIGHT")
    monkeypatch.setenv("PREFIXGATE__ROUTING__POLICY", "round_robin")
    assert load_config(f).routing.policy == RoundRobinConfig()


def test_environment_value_errors_keep_their_path(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PREFIXGATE__LIMITS__MAX_BODY_BYTES", "1")
    with pytest.raises(ConfigError, match=r"limits\.max_body_bytes: "):
        load_config(None)
