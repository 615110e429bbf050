"""Review finding: a trust bundle that cannot be loaded left ``/readyz`` at 200 while every
authenticated request got 503 ``bundle_unavailable``. Readiness now follows the trust
bundles: not ready while no configured trust domain has a usable bundle."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.conftest import TD
from tests.support.waiting import wait_for


@pytest.fixture
def config_overrides(tmp_path: Path) -> dict[str, Any]:
    missing = tmp_path / "later" / "bundle.json"
    return {"identity": {"audience": "prefixgate",
                         "trust_domains": {TD: {"bundle_file": str(missing), "max_stale_s": 3600}}}}


async def test_readyz_follows_the_trust_bundle(stack: Any, tmp_path: Path) -> None:
    r = await stack.client.get("/readyz")
    assert r.status_code == 503, r.text
    assert "trust bundle unavailable" in r.text and TD in r.text
    r = await stack.client.post("/v1/completions", headers=stack.auth(),
                                json={"model": "sim-model", "prompt": "hello", "max_tokens": 2})
    assert r.status_code == 503 and r.json()["error"]["code"] == "bundle_unavailable"

    bundle = tmp_path / "later" / "bundle.json"
    bundle.parent.mkdir()
    stack.issuer.write_bundle(bundle)

    async def ready() -> bool:
        return (await stack.client.get("/readyz")).status_code == 200

    await wait_for(ready, 15, what="/readyz 200 once the bundle exists")
    r = await stack.client.post("/v1/completions", headers=stack.auth(),
                                json={"model": "sim-model", "prompt": "hello", "max_tokens": 2})
    assert r.status_code == 200, r.text
