"""Public endpoints (/healthz, /readyz, /metrics) reveal no tenant names, SPIFFE IDs,
key ids, keys, salts or prompts (issue 6 item 5), after traffic of every tenant,
refusals and operator actions; /v1/models needs authentication."""

from __future__ import annotations

import secrets
from typing import Any

TD = "demo.prefixgate.test"
CANARY = "pubcanary" + secrets.token_hex(5)


async def test_public_endpoints_reveal_nothing(stack: Any) -> None:
    prompt = " ".join([CANARY] + [f"{CANARY}{i}" for i in range(40)])
    for who in ("tenant-a/app", "tenant-b/app", "tenant-reg/app", "stranger/x"):
        await stack.client.post("/v1/completions", headers=stack.auth(who),
                                json={"model": "sim-model", "prompt": prompt, "max_tokens": 2})
    await stack.client.post("/v1/completions", headers={"Authorization": "Bearer x.y.z"}, json={"prompt": prompt})
    op = {"Authorization": f"Bearer {stack.issuer.mint(f'spiffe://{TD}/ops/admin', 'prefixgate-admin')}"}
    assert (await stack.client.post(f"{stack.admin_url}/admin/tenants/tenant-a/rotate-key", headers=op)).status_code == 200
    c = stack.components
    needles = [CANARY, "tenant-a", "tenant-b", "tenant-reg", "stranger", "spiffe:", TD, "ops/admin", "pgs1_",
               "t:tenant", "sim-model"]
    for tid in ("tenant-a", "tenant-b", "tenant-reg"):
        needles += [k.kid for k in c.keyring.lookup_keys(tid)] + [k.key.hex() for k in c.keyring.lookup_keys(tid)]
    # the admin exposition does carry tenant labels: proves the needles are what a leak would look like
    admin_text = (await stack.client.get(f"{stack.admin_url}/admin/metrics", headers=op)).text
    assert "tenant-a" in admin_text
    for path in ("/healthz", "/readyz", "/metrics"):
        r = await stack.client.get(path)
        assert r.status_code == 200, path
        text = r.text + "\n".join(f"{k}: {v}" for k, v in r.headers.items())
        found = [n for n in needles if n in text]
        assert not found, f"{path} reveals {found}"
    # not ready: the reasons are generic, still nothing tenant-specific
    for state in stack.cluster.states:
        state.faults = type(state.faults)(status=503)
    import asyncio

    for _ in range(50):
        r = await stack.client.get("/readyz")
        if r.status_code == 503:
            break
        await asyncio.sleep(0.05)
    assert r.status_code == 503
    assert not [n for n in needles if n in r.text]
    assert "r0" not in r.text and "127.0.0.1" not in r.text


async def test_models_needs_authentication(stack: Any) -> None:
    r = await stack.client.get("/v1/models")
    assert r.status_code == 401 and "sim-model" not in r.text
    r = await stack.client.get("/v1/models", headers=stack.auth("stranger/x"))
    assert r.status_code == 403 and "sim-model" not in r.text
    r = await stack.client.get("/v1/models", headers=stack.auth())
    assert r.status_code == 200 and [m["id"] for m in r.json()["data"]] == ["sim-model"]
