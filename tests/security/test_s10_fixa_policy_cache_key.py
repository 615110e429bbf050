"""Session 10 review, R10-2: the decision cache's key follows the policy.

Before, the PEP's decision cache keyed on the shipped policy's input fields only, so a custom rule on
another documented field (here ``input.request.prompt_tokens > 50`` denied for tier ``standard``) was
bypassed for ``policy.cache_ttl_s`` after one allowed request: the large requests after a small one
were served (200) from the small one's cached *allow*. Now the gateway reads the policy's ``input``
references (policy/input_refs.py) and keys on them too; a use it cannot bound disables the cache.
Through ``policy.dir`` (the rule as its own module next to the shipped one) and through an operator
upload (``PUT /admin/policies/extra.rego``). Unit checks of the scan and of the remote-mode opt-in.
"""

from __future__ import annotations

import logging
import shutil
from pathlib import Path
from typing import Any

import pytest

from gateway.config_policy import PolicyConfig
from gateway.pep import build_decision_point
from policy.cache import DEFAULT_KEY_FIELDS, CachedDecisionPoint
from policy.input_refs import module_input_paths, policy_key_fields
from policy.loader import load_policy_dir

REPO = Path(__file__).resolve().parents[2]
EXTRA = """package prefixgate.authz

import rego.v1

denials contains {"rank": 9, "code": "prompt_too_long_for_tier", "reason": "standard tier: long prompt"} if {
	tenant.tier == "standard"
	input.request.prompt_tokens > 50
}
"""
SMALL = {"model": "sim-model", "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]}
BIG = {"model": "sim-model", "max_tokens": 2, "messages": [{"role": "user", "content": "word " * 400}]}


@pytest.fixture
def config_overrides(tmp_path: Path, request: Any) -> dict[str, Any]:
    active = tmp_path / "rego-active"
    shutil.copytree(REPO / "rego", active)
    if request.param == "dir":
        (active / "extra.rego").write_text(EXTRA)
        return {"policy": {"mode": "embedded", "dir": str(active), "cache_ttl_s": 60}}
    return {"policy": {"mode": "embedded", "dir": str(active), "versions_dir": str(tmp_path / "versions"),
                       "cache_ttl_s": 60}}


async def _chat(stack: Any, body: dict[str, Any]) -> tuple[int, str | None]:
    r = await stack.client.post("/v1/chat/completions", headers=stack.auth("tenant-a/app"), json=body)
    return r.status_code, (r.json().get("error", {}).get("code") if r.status_code != 200 else None)


@pytest.mark.parametrize("config_overrides", ["dir", "upload"], indirect=True)
async def test_a_custom_rule_on_prompt_tokens_is_not_bypassed_by_the_cache(stack: Any,
                                                                           config_overrides: Any) -> None:
    if "versions_dir" in config_overrides["policy"]:
        assert await _chat(stack, BIG) == (200, None)  # the shipped policy alone: allowed (and cached)
        r = await stack.client.put(f"{stack.admin_url}/admin/policies/extra.rego",
                                   headers={**stack.operator_auth(), "Content-Type": "text/plain"},
                                   content=EXTRA.encode())
        assert r.status_code == 200, r.text
    assert await _chat(stack, BIG) == (403, "prompt_too_long_for_tier")
    assert await _chat(stack, SMALL) == (200, None)  # allowed, cached under its own prompt_tokens
    for _ in range(5):  # within the TTL (60 s): before the fix, served from the small one's allow
        assert await _chat(stack, BIG) == (403, "prompt_too_long_for_tier")
    dp = stack.components.pdp.dp
    assert isinstance(dp, CachedDecisionPoint)
    assert dp.cache.key_fields == (*DEFAULT_KEY_FIELDS, "request.prompt_tokens")
    assert dp.cache.hits >= 1  # the cache still serves: repeated big requests hit their own deny


def test_the_shipped_policy_keeps_the_fast_key() -> None:
    mods = load_policy_dir(REPO / "rego").policies()
    assert policy_key_fields(mods) is DEFAULT_KEY_FIELDS
    assert policy_key_fields({**mods, "extra.rego": EXTRA}) == (*DEFAULT_KEY_FIELDS, "request.prompt_tokens")
    # the shipped module edited (not byte-identical): scanned, its object.get(input, ...) is unbounded
    assert policy_key_fields({"authz.rego": next(iter(mods.values())) + "\n"}) is None


@pytest.mark.parametrize(("body", "expected"), [
    ("x if input.request.stream == true", {"request.stream"}),
    ("x if input.candidates[_].load > 3", {"candidates[].load"}),
    ("x if { some c in input.candidates; c.load > 3 }", {"candidates"}),
    ("x if { r := input.request; r.max_tokens > 3 }", {"request"}),
    ("x if data.prefixgate.authz.tenant.labels.team == \"a\"", {"tenant.labels.team"}),
    ("x if input.identity.claims.team == \"a\"", {"identity.claims.team"}),
    ("x if walk(input, _)", {"*"}),
    ("x if { some k; input[k] == 1 }", {"*"}),
    ("x if object.get(input, [\"request\", \"stream\"], false)", {"*"}),
    ("x if data.other with input as {}", {"*"}),
    ("x if { y := data.prefixgate.authz; y.tenant.labels.a }", {"*"}),
    ("x if input.time > 3", {"time"}),
])
def test_the_scan_is_conservative(body: str, expected: set[str]) -> None:
    assert set(module_input_paths(f"m{hash(body)}.rego", f"package p\nimport rego.v1\n{body}\n")) == expected


def test_unbounded_or_time_reading_policies_are_not_cached() -> None:
    for body in ("x if walk(input, _)", "x if input.time > 3"):
        assert policy_key_fields({"m.rego": f"package p\nimport rego.v1\n{body}\n"}) is None
    # in the shipped package: its alias rule `tenant` and a redefined function taking input elements
    local = "package prefixgate.authz\nimport rego.v1\n"
    assert module_input_paths("l1.rego", local + "x if tenant.labels.a == \"b\"\n") == {"tenant.labels.a"}
    assert module_input_paths("l2.rego", local + "alert_applies(a) if a.severity == 1\n") == {"*"}
    assert policy_key_fields({"bad.rego": "package p\nthis is not rego"}) is None  # fail closed


async def test_a_policy_change_rekeys_the_cache(tmp_path: Path) -> None:
    active = tmp_path / "rego"
    shutil.copytree(REPO / "rego", active)
    pdp = build_decision_point(PolicyConfig(dir=str(active)), audit=None)  # type: ignore[arg-type]
    assert isinstance(pdp.dp, CachedDecisionPoint) and pdp.dp.default_keys
    engine = pdp.inner
    engine.load(engine.policy_set.with_module("extra.rego", EXTRA))
    assert pdp.dp.cache.key_fields == (*DEFAULT_KEY_FIELDS, "request.prompt_tokens") and not pdp.dp.default_keys
    engine.load(engine.policy_set.with_module("more.rego", "package q\nimport rego.v1\nx if walk(input, _)\n"))
    assert pdp.dp.cache.key_fields is None
    engine.load(engine.policy_set.with_module("more.rego", None).with_module("extra.rego", None))
    assert pdp.dp.default_keys
    engine.close()


def test_remote_mode_caches_only_when_the_operator_opts_in(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="prefixgate.policy"):
        pdp = build_decision_point(PolicyConfig(mode="remote", url="http://127.0.0.1:9"), audit=None)  # type: ignore[arg-type]
    assert not isinstance(pdp.dp, CachedDecisionPoint)
    assert any("cache_key_fields" in r.getMessage() for r in caplog.records)
    pdp = build_decision_point(PolicyConfig(mode="remote", url="http://127.0.0.1:9", cache_key_fields=[]),
                               audit=None)  # type: ignore[arg-type]
    assert isinstance(pdp.dp, CachedDecisionPoint) and pdp.dp.default_keys
    pdp = build_decision_point(PolicyConfig(mode="remote", url="http://127.0.0.1:9",
                                            cache_key_fields=["request.stream", "tenant.models"]),
                               audit=None)  # type: ignore[arg-type]
    assert pdp.dp.cache.key_fields == (*DEFAULT_KEY_FIELDS, "request.stream")
    with pytest.raises(ValueError):
        PolicyConfig(cache_key_fields=["prompt.text"])
