"""Public endpoints (/healthz, /readyz, /metrics) reveal no tenant names, SPIFFE IDs,
key ids, keys, salts or prompts (issue 6 item 5), after traffic of every tenant,
refusals and operator actions; /v1/models needs authentication."""

from __future__ import annotations

import secrets
from typing import Any

from tests.support.waiting import wait_for

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

    async def not_ready() -> Any:
        r = await stack.client.get("/readyz")
        return r if r.status_code == 503 else None

    # two failed probes 0.2 s apart mark each replica down: waited for by condition (it was 50 polls 0.05 s
    # apart, ~2.5 s, a short bound on a loaded machine; session 30, flake30)
    r = await wait_for(not_ready, 30.0, what="/readyz 503 with every replica answering 503")
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
