"""Key and salt rotation through the admin listener, and who may use it (issue 3).

* Tenant key rotation keeps routing locality during the grace period (the
  index still finds prefixes under the previous key version) and the
  replicas keep reporting ``cached_tokens`` (the cache salt is unchanged).
* Salt rotation makes the tenant's replica cache cold (the index still
  predicts a hit: it is stale by design until the blocks are re-inserted).
* Every admin route refuses non-operators: 401 without a valid admin-audience
  credential, 403 for a valid one from a non-operator workload; nothing changes.
"""

from __future__ import annotations

import secrets
from typing import Any

import pytest

TD = "demo.prefixgate.test"
N_PROMPTS = 8
WORDS = 320


@pytest.fixture
def config_overrides() -> dict[str, Any]:
    # the replicas' cached_tokens reach the client (its default drops them: review R12-1)
    return {"identity": {"unauthenticated_burst": 1000}, "tenancy": {"usage_cached_tokens": "pass"}}


def op_headers(stack: Any, audience: str = "prefixgate-admin", who: str = "ops/admin") -> dict[str, str]:
    return {"Authorization": f"Bearer {stack.issuer.mint(f'spiffe://{TD}/{who}', audience)}"}


async def complete(stack: Any, workload: str, text: str) -> dict[str, Any]:
    before = stack.components.router.counters()
    served_before = [s.counters.requests for s in stack.cluster.states]
    r = await stack.client.post("/v1/completions", headers=stack.auth(workload),
                                json={"model": "sim-model", "prompt": text, "max_tokens": 2})
    assert r.status_code == 200, r.text
    after = stack.components.router.counters()
    served = [i for i, (a, b) in enumerate(zip(served_before, (s.counters.requests for s in stack.cluster.states)))
              if b != a]
    assert len(served) == 1
    return {
        "cached": r.json()["usage"]["prompt_tokens_details"]["cached_tokens"],
        "available": after.available_prefix_tokens - before.available_prefix_tokens,
        "predicted": after.predicted_prefix_tokens - before.predicted_prefix_tokens,
        "replica": served[0],
    }


def prompts(n: int = N_PROMPTS) -> list[str]:
    out = []
    for _ in range(n):
        tag = "rot" + secrets.token_hex(4)
        out.append(" ".join([tag] + [f"{tag}w{i}" for i in range(WORDS - 1)]))
    return out


async def test_tenant_key_rotation_keeps_locality_and_cache(stack: Any) -> None:
    texts = prompts()
    first = [await complete(stack, "tenant-a/app", t) for t in texts]
    assert len({f["replica"] for f in first}) >= 2  # spread over the pool, so locality is observable
    old_kid = stack.components.keyring.current("tenant-a").kid

    r = await stack.client.post(f"{stack.admin_url}/admin/tenants/tenant-a/rotate-key", headers=op_headers(stack))
    assert r.status_code == 200, r.text
    rec = r.json()
    assert rec["key_version"] == 2 and rec["previous_kid"] == old_kid and rec["kid"] != old_kid
    assert rec["actor"] == f"spiffe://{TD}/ops/admin"  # the audit record names the operator
    assert stack.components.keyring.key_version("tenant-a") == 2

    after = [await complete(stack, "tenant-a/app", t) for t in texts]
    same = sum(a["replica"] == f["replica"] for a, f in zip(after, first))
    assert same >= N_PROMPTS - 1, "rotation threw away routing locality"
    assert all(a["predicted"] > 0 for a in after), "index did not recognise the previous key version"
    hits = [a["cached"] for a in after]
    assert sum(h >= WORDS - 16 for h in hits) >= N_PROMPTS - 1, f"replica cache went cold: {hits}"
    # the repeats were indexed under the new version: a third round hits without the grace chain
    third = [await complete(stack, "tenant-a/app", t) for t in texts]
    assert all(t["cached"] >= WORDS - 16 and t["predicted"] > 0 for t in third)
    # the other tenant is untouched
    assert stack.components.keyring.key_version("tenant-b") == 1


@pytest.mark.parametrize("config_overrides", [{"tenancy": {"key_grace_s": 0, "usage_cached_tokens": "pass"}}])
async def test_without_grace_the_index_starts_over(stack: Any) -> None:
    """Contrast: with ``key_grace_s: 0`` the previous version is forgotten at once,
    so the locality kept above is the grace period's doing, not luck."""
    texts = prompts(4)
    for t in texts:
        await complete(stack, "tenant-a/app", t)
    r = await stack.client.post(f"{stack.admin_url}/admin/tenants/tenant-a/rotate-key", headers=op_headers(stack))
    assert r.status_code == 200 and r.json()["grace_s"] == 0
    after = [await complete(stack, "tenant-a/app", t) for t in texts]
    assert all(a["available"] == 0 and a["predicted"] == 0 for a in after)


async def test_salt_rotation_makes_cache_cold(stack: Any) -> None:
    (text,) = prompts(1)
    await complete(stack, "tenant-a/app", text)
    warm = await complete(stack, "tenant-a/app", text)
    assert warm["cached"] >= WORDS - 16
    salt_before = stack.components.keys.cache_salt(stack.components.registry.get("tenant-a"))
    r = await stack.client.post(f"{stack.admin_url}/admin/tenants/tenant-a/rotate-salt", headers=op_headers(stack))
    assert r.status_code == 200, r.text
    assert r.json()["salt_epoch"] == 1 and "salt" not in {k for k in r.json() if k != "salt_epoch"}
    assert salt_before not in r.text
    cold = await complete(stack, "tenant-a/app", text)
    assert cold["cached"] == 0, "replica cache survived a salt rotation"
    assert cold["predicted"] > 0  # prefix keys unchanged: the index (now stale) still predicts
    again = await complete(stack, "tenant-a/app", text)
    assert again["cached"] >= WORDS - 16


def _admin_targets(stack: Any) -> list[tuple[str, str]]:
    """(method, path) of every admin route, path parameters filled in."""
    from gateway.app import build_admin_app

    out = []
    for route in build_admin_app(stack.components).routes:
        path = route.path.replace("{tenant_id}", "tenant-a").replace("{id}", "routing")
        path = path.replace("{path:path}", "prefixgate")
        for method in sorted(route.methods or ()):
            if method != "HEAD":
                out.append((method, path))
    return out


async def test_admin_listener_answers_only_operators(stack: Any) -> None:
    targets = _admin_targets(stack)
    assert {("POST", "/admin/tenants/tenant-a/rotate-key"), ("POST", "/admin/keys/rotate-master"),
            ("GET", "/admin/metrics"), ("POST", "/admin/tenants/reload")} <= set(targets)
    not_operator = {
        "workload token, admin audience": (op_headers(stack, who="tenant-a/app"), 403),
        "unmapped workload, admin audience": (op_headers(stack, who="stranger/x"), 403),
        "operator token, public audience": (op_headers(stack, audience="prefixgate"), 401),
        "workload token, public audience": (stack.auth("tenant-a/app"), 401),
        "operator token, both audiences": (op_headers(stack, audience=["prefixgate", "other"]), 401),
        "no credential": ({}, 401),
        "garbage": ({"Authorization": "Bearer not.a.jwt"}, 401),
    }
    failures = []
    for method, path in targets:
        for case, (headers, status) in not_operator.items():
            r = await stack.client.request(method, f"{stack.admin_url}{path}", headers=headers, json={})
            if r.status_code != status:
                failures.append(f"{method} {path} [{case}]: {r.status_code} {r.text[:120]}")
            elif status == 401 and "www-authenticate" not in r.headers:
                failures.append(f"{method} {path} [{case}]: 401 without WWW-Authenticate")
    assert not failures, "\n".join(failures)
    kr = stack.components.keyring
    assert kr.key_version("tenant-a") == 1 and kr.salt_epoch("tenant-a") == 0 and kr.master_generation == 1
    # and the operator does get through
    r = await stack.client.get(f"{stack.admin_url}/admin/replicas", headers=op_headers(stack))
    assert r.status_code == 200


async def test_admin_routes_are_not_on_the_public_listener(stack: Any) -> None:
    for method, path in _admin_targets(stack):
        r = await stack.client.request(method, path, headers=op_headers(stack), json={})
        assert r.status_code in (404, 405), (method, path, r.status_code)
    assert stack.components.keyring.key_version("tenant-a") == 1
