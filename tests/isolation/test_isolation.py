"""Cross-tenant isolation of the prefix cache and the routing index (issue 3 done-criteria).

Tenant A sends a long prompt; tenant B sends the identical prompt (or one
sharing only a long prefix). B must get no prefix-cache hit on any replica
(``usage.prompt_tokens_details.cached_tokens == 0``, also when A's prefix is
warm on *every* replica of the pool) and the router's index must treat it as
new (available and predicted prefix tokens 0), while a repeat from A hits.
"""

from __future__ import annotations

import secrets
from typing import Any

import httpx
import pytest

WORDS = 400  # 25 blocks of 16 tokens


@pytest.fixture
def config_overrides() -> dict[str, Any]:
    """The replicas' ``cached_tokens`` reach the client (the default drops them: review R12-1)."""
    return {"tenancy": {"usage_cached_tokens": "pass"}}


def prompt(tag: str, n: int = WORDS) -> str:
    return " ".join([tag] + [f"{tag}w{i}" for i in range(n - 1)])


async def complete(stack: Any, workload: str, text: str) -> dict[str, Any]:
    """One completion through the gateway; returns usage plus the router's view of it."""
    before = stack.components.router.counters()
    served_before = [s.counters.requests for s in stack.cluster.states]
    r = await stack.client.post("/v1/completions", headers=stack.auth(workload),
                                json={"model": "sim-model", "prompt": text, "max_tokens": 2})
    assert r.status_code == 200, r.text
    after = stack.components.router.counters()
    served = [i for i, (a, b) in enumerate(zip(served_before, (s.counters.requests for s in stack.cluster.states)))
              if b != a]
    assert len(served) == 1
    usage = r.json()["usage"]
    return {
        "cached": usage["prompt_tokens_details"]["cached_tokens"],
        "prompt": usage["prompt_tokens"],
        "available": after.available_prefix_tokens - before.available_prefix_tokens,
        "predicted": after.predicted_prefix_tokens - before.predicted_prefix_tokens,
        "replica": served[0],
    }


async def warm_everywhere(stack: Any, tenant_id: str, text: str) -> None:
    """Put ``text`` into every replica's cache under the tenant's own salt (as if A had
    been routed to each of them), bypassing the gateway."""
    salt = stack.components.keys.cache_salt(stack.components.registry.get(tenant_id))
    async with httpx.AsyncClient(timeout=10) as raw:
        for url in stack.cluster.urls:
            r = await raw.post(f"{url}/v1/completions",
                               json={"model": "sim-model", "prompt": text, "max_tokens": 1, "cache_salt": salt})
            assert r.status_code == 200


async def test_identical_prompt_is_not_shared(stack: Any) -> None:
    text = prompt("iso" + secrets.token_hex(4))
    a1 = await complete(stack, "tenant-a/app", text)
    assert a1["cached"] == 0 and a1["available"] == 0
    await warm_everywhere(stack, "tenant-a", text)
    b1 = await complete(stack, "tenant-b/app", text)
    assert b1["cached"] == 0, "tenant B hit tenant A's cached prefix"
    assert b1["available"] == 0 and b1["predicted"] == 0, "the router index matched A's prefix for B"
    a2 = await complete(stack, "tenant-a/app", text)
    assert a2["replica"] == a1["replica"]
    assert a2["predicted"] == a2["available"] >= (WORDS // 16 - 1) * 16
    assert a2["cached"] >= (WORDS // 16 - 1) * 16
    # B's own repeat does hit (B's namespace works; the zero above is isolation, not a cold cache)
    b2 = await complete(stack, "tenant-b/app", text)
    assert b2["cached"] > 0 and b2["predicted"] > 0
    # a third tenant sees neither A's nor B's copy (router index; the eu pool has its own replica)
    c1 = await complete(stack, "tenant-reg/app", text)
    assert c1["cached"] == 0 and c1["available"] == 0


async def test_shared_long_prefix_is_not_shared(stack: Any) -> None:
    tag = "pfx" + secrets.token_hex(4)
    shared = prompt(tag, 320)  # 20 full blocks in common
    a1 = await complete(stack, "tenant-a/app", shared + " alpha tail one two three")
    await warm_everywhere(stack, "tenant-a", shared + " alpha tail one two three")
    b1 = await complete(stack, "tenant-b/app", shared + " beta other ending words here")
    assert b1["cached"] == 0 and b1["available"] == 0 and b1["predicted"] == 0
    a2 = await complete(stack, "tenant-a/app", shared + " gamma a different suffix")
    assert a2["replica"] == a1["replica"]
    assert a2["cached"] >= 320 - 16 and a2["predicted"] >= 320 - 16


async def test_client_cache_salt_is_overwritten(stack: Any) -> None:
    """B copying A's salt into its request must not bring the cache hit back."""
    text = prompt("salt" + secrets.token_hex(4))
    await complete(stack, "tenant-a/app", text)
    await warm_everywhere(stack, "tenant-a", text)
    a_salt = stack.components.keys.cache_salt(stack.components.registry.get("tenant-a"))
    r = await stack.client.post("/v1/completions", headers=stack.auth("tenant-b/app"),
                                json={"model": "sim-model", "prompt": text, "max_tokens": 2, "cache_salt": a_salt})
    assert r.status_code == 200
    assert r.json()["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
