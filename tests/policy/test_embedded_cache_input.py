"""Embedded engine edge cases, the decision cache, and the input builder."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from policy.cache import CachedDecisionPoint, DecisionCache
from policy.decision import PolicyCompileError, PolicyOutputError
from policy.embedded import EmbeddedOpa
from policy.input import PolicyInputError
from policy.loader import PolicySet, load_policy_dir
from policy.rego_test_runner import run_dir

REPO = Path(__file__).resolve().parents[2]


def _set(src: str) -> PolicySet:
    return PolicySet({"p.rego": src}, {})


async def test_undefined_decision_is_deny(mk: Any) -> None:
    opa = EmbeddedOpa(policy_set=_set("package prefixgate.authz\ndecision := {} if false\n"))
    d = await opa.decide(mk())
    assert (d.allow, d.reason_code) == (False, "undefined")


@pytest.mark.parametrize(
    "doc",
    [
        '{"allow": "true", "reason_code": "x", "reason": ""}',
        '{"allow": true, "reason_code": "x", "reason": "", "max_tokens": "10"}',
        '{"allow": true, "reason_code": "x", "reason": "", "allowed_replicas": [1]}',
        '{"allow": true, "reason_code": "x", "reason": "", "surprise": 1}',
        '{"allow": true, "reason": ""}',
        '["allow"]',
    ],
)
async def test_wrongly_typed_decision_raises(doc: str, mk: Any) -> None:
    opa = EmbeddedOpa(policy_set=_set(f"package prefixgate.authz\ndecision := {doc}\n"))
    with pytest.raises(PolicyOutputError):
        await opa.decide(mk())


def test_broken_policy_refused_at_build() -> None:
    with pytest.raises(PolicyCompileError):
        EmbeddedOpa(policy_set=_set("package prefixgate.authz\ndecision := x if undefined_fn(1)\n"))


async def test_failed_load_keeps_active_engine(rego_dir: Path, mk: Any) -> None:
    opa = EmbeddedOpa(rego_dir, timeout_s=5.0)  # not a deadline test: a loaded host took > 0.05 s (s13)
    before = await opa.decide(mk("tenant-a"))
    broken = opa.policy_set.with_module("authz.rego", "package prefixgate.authz\ndecision := {")
    with pytest.raises(PolicyCompileError):
        opa.load(broken)
    after = await opa.decide(mk("tenant-a"))
    assert (after.allow, after.allowed_replicas) == (before.allow, before.allowed_replicas)
    assert opa.revision == 0


async def test_data_change_swaps_engine(rego_dir: Path, mk: Any) -> None:
    opa = EmbeddedOpa(rego_dir, timeout_s=5.0)  # not a deadline test: a loaded host took > 0.05 s (s13)
    ps = opa.policy_set
    tiers = dict(ps.data_docs["prefixgate/config/tiers"])
    tiers["standard"] = {"max_tokens": 77}
    opa.load(ps.with_data("prefixgate/config/tiers", tiers))
    d = await opa.decide(mk("tenant-a"))
    assert (d.allow, d.max_tokens) == (True, 77)
    assert opa.revision == 1


class FakeClock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


async def test_cache_hit_miss_ttl_and_invalidation(rego_dir: Path, mk: Any) -> None:
    clock = FakeClock()
    opa = EmbeddedOpa(rego_dir, timeout_s=5.0)  # not a deadline test: a loaded host took > 0.05 s (s13)
    cache = DecisionCache(ttl_s=1.0, clock=clock)
    pdp = CachedDecisionPoint(opa, cache)

    first = await pdp.decide(mk("tenant-a"))
    assert not first.cached and (cache.hits, cache.misses) == (0, 1)
    second = await pdp.decide(mk("tenant-a", prompt_tokens=999))  # prompt_tokens not in key
    assert second.cached and second.decision_id == first.decision_id
    assert (cache.hits, cache.misses) == (1, 1)

    # a key field differs -> miss with its own answer
    other = await pdp.decide(mk("tenant-a", model="other-model"))
    assert not other.cached and other.reason_code == "model_not_entitled"
    alert = {"id": "al-9", "kind": "concentration", "replica_id": "r-d1", "tenant_id": None}
    alerted = await pdp.decide(mk("tenant-a", alerts=[alert]))
    assert not alerted.cached and alerted.allowed_replicas == {"r-d2"}
    assert cache.misses == 3

    clock.t = 1.5  # past the hard TTL
    expired = await pdp.decide(mk("tenant-a"))
    assert not expired.cached and expired.decision_id != first.decision_id

    assert (await pdp.decide(mk("tenant-a"))).cached
    opa.load(opa.policy_set)  # any policy/data change clears the cache
    assert len(cache) == 0 and cache.clears == 1
    assert not (await pdp.decide(mk("tenant-a"))).cached


async def test_cache_does_not_store_errors(mk: Any) -> None:
    opa = EmbeddedOpa(policy_set=_set('package prefixgate.authz\ndecision := {"allow": 1}\n'))
    pdp = CachedDecisionPoint(opa, DecisionCache())
    for _ in range(2):
        with pytest.raises(PolicyOutputError):
            await pdp.decide(mk())
    assert len(pdp.cache) == 0


def test_input_never_carries_prompt_text(mk: Any) -> None:
    doc = mk()
    assert "secret prompt text" not in json.dumps(doc)
    assert set(doc) == {"version", "identity", "tenant", "request", "candidates", "alerts", "time"}
    assert set(doc["request"]) == {"endpoint", "model", "prompt_tokens", "max_tokens", "stream", "sequences",
                                  "queued_requests"}
    assert doc["version"] == "1"
    assert [c["id"] for c in doc["candidates"]] == sorted(c["id"] for c in doc["candidates"])


def test_input_rejects_missing_identity(mk: Any) -> None:
    from policy.input import build_policy_input

    with pytest.raises(PolicyInputError):
        build_policy_input({"trust_domain": "x"}, {"id": "t"}, {"endpoint": "e", "model": "m"}, [], [], 0.0)
    with pytest.raises(PolicyInputError):
        build_policy_input(
            {"spiffe_id": "spiffe://x/y", "trust_domain": "x"},
            {"id": "t"},
            {"endpoint": "e", "model": "m", "max_tokens": -1},
            [],
            [],
            0.0,
        )


def test_rego_runner_passes_on_shipped_policies(rego_dir: Path) -> None:
    report = run_dir(rego_dir)
    assert report.ok, report.render()
    assert report.passed >= 15 and report.failed == 0


def test_rego_runner_cli_fails_on_broken_test(tmp_path: Path, rego_dir: Path) -> None:
    ps = load_policy_dir(rego_dir)
    for name, src in ps.modules.items():
        (tmp_path / name).write_text(src)
    (tmp_path / "data").symlink_to(rego_dir / "data")
    (tmp_path / "broken_test.rego").write_text(
        "package prefixgate.broken_test\n\nimport data.prefixgate.authz\n\n"
        "test_wrong_cap if {\n\tauthz.tier_cap == 1 with input.tenant.id as \"tenant-a\"\n}\n"
    )
    ok = subprocess.run([sys.executable, "-m", "policy.rego_test_runner", str(rego_dir)], cwd=REPO,
                        capture_output=True, text=True, timeout=60)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert "0 failed" in ok.stdout
    bad = subprocess.run([sys.executable, "-m", "policy.rego_test_runner", str(tmp_path)], cwd=REPO,
                         capture_output=True, text=True, timeout=60)
    assert bad.returncode == 1
    assert "data.prefixgate.broken_test.test_wrong_cap: FAIL" in bad.stdout
    assert "1 failed" in bad.stdout
