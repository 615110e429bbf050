"""Issue 10, findings 10 and 2 (remote mode).

Finding 10: with a remote OPA that cannot be reached, ``/readyz`` answered
200 while every request got 503. Readiness now includes the decision point:
OPA down -> ``/readyz`` 503 with a JSON reason naming the PDP; OPA back on
the same address -> 200 again. Embedded: ready while a policy is loaded.

Finding 2, remote mode: an operator upload through the admin API is checked
against the built-in allow-list before it is pushed to OPA, so a module
calling ``http.send`` never reaches the OPA server (the stand-in OPA here
runs without a capabilities restriction, as ``opa run`` does by default).
"""

from __future__ import annotations

import asyncio
import shutil
import socket
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn

from tests.support.opa_server import create_app, state_from_dir
from tests.support.waiting import wait_for

REPO = Path(__file__).resolve().parents[2]
REGO = REPO / "rego"
TD = "demo.prefixgate.test"
OPERATOR = f"spiffe://{TD}/ops/admin"
ADMIN_AUD = "prefixgate-admin"
BODY = {"model": "sim-model", "prompt": "readiness " + " ".join(f"w{i}" for i in range(20)), "max_tokens": 2}


class OpaAt:
    """``tests.support.opa_server`` on 127.0.0.1:``port`` (0: any) in a thread; can be
    stopped and started again on the same port."""

    def __init__(self, port: int = 0) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", port))
        self.port = self.sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        cfg = uvicorn.Config(create_app(state_from_dir(REGO)), log_level="warning", access_log=False,
                             lifespan="off", timeout_graceful_shutdown=1)
        self.server = uvicorn.Server(cfg)
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]}, daemon=True)

    def start(self) -> OpaAt:
        self.thread.start()
        deadline = time.monotonic() + 10
        while not self.server.started:
            if time.monotonic() > deadline or not self.thread.is_alive():
                raise RuntimeError("opa_server did not start")
            time.sleep(0.01)
        return self

    def stop(self) -> None:
        self.server.should_exit = True
        self.server.force_exit = True
        self.thread.join(timeout=10)
        self.sock.close()


@pytest.fixture
def remote_opa() -> Any:
    holder = {"srv": OpaAt().start()}
    yield holder
    holder["srv"].stop()


@pytest.fixture
def config_overrides(remote_opa: Any, tmp_path: Path) -> dict[str, Any]:
    active = tmp_path / "rego-active"
    shutil.copytree(REGO, active)
    # the decision deadline is not under test here (OPA down is a refused connection, answered at once); the
    # OPA thread shares the GIL with the gateway, replicas and client, and 0.5 s gave 503s in a CI replay
    # (tests/policy_e2e/conftest.py REMOTE_TIMEOUT_S): the stack's 5 s (session 30, flake30)
    return {"policy": {"mode": "remote", "url": remote_opa["srv"].url, "timeout_s": 5.0,
                       "dir": str(active),
                       "versions_dir": str(tmp_path / "versions")}}


async def test_readyz_follows_a_remote_opa_down_and_back(stack: Any, remote_opa: Any) -> None:
    r = await stack.client.get("/readyz")
    assert r.status_code == 200, r.text
    assert (await stack.client.post("/v1/completions", headers=stack.auth(), json=BODY)).status_code == 200

    port = remote_opa["srv"].port
    await asyncio.to_thread(remote_opa["srv"].stop)

    async def not_ready() -> Any:
        r = await stack.client.get("/readyz")
        return r if r.status_code == 503 else None

    r = await wait_for(not_ready, 15.0, what="/readyz 503 with OPA down")
    doc = r.json()
    assert doc["status"] == "not_ready"
    assert any("policy decision point" in p for p in doc["problems"]), doc
    # a decision not in the decision cache (another tenant) fails closed meanwhile
    r = await stack.client.post("/v1/completions", headers=stack.auth("tenant-b/app"), json=BODY)
    assert r.status_code == 503 and r.json()["error"]["code"] == "policy_unavailable"

    remote_opa["srv"] = await asyncio.to_thread(lambda: OpaAt(port).start())

    async def ready() -> Any:
        r = await stack.client.get("/readyz")
        return r if r.status_code == 200 else None

    r = await wait_for(ready, 15.0, what="/readyz 200 with OPA back")
    assert r.json()["status"] == "ready"
    assert (await stack.client.post("/v1/completions", headers=stack.auth(), json=BODY)).status_code == 200


async def test_remote_upload_of_http_send_is_refused_before_reaching_opa(stack: Any, remote_opa: Any) -> None:
    src = 'package evil\n\np := http.send({"method": "GET", "url": "http://127.0.0.1:9/"})\n'
    h = {"Authorization": f"Bearer {stack.issuer.mint(OPERATOR, ADMIN_AUD)}"}
    store = stack.components.pdp.store
    version = store.version
    async with httpx.AsyncClient(base_url=stack.admin_url, timeout=30) as admin:
        r = await admin.put("/admin/policies/evil.rego", headers=h, content=src.encode())
    assert r.status_code == 400, r.text
    doc = r.json()["error"]
    assert doc["code"] == "policy_rejected"
    assert any(e.get("builtin") == "http.send" for e in doc["errors"]), doc
    assert "http.send" in doc["message"] or "http.send" in doc["report"]
    assert store.version == version and "evil.rego" not in store.policy_set.modules
    async with httpx.AsyncClient(base_url=remote_opa["srv"].url, timeout=10) as opa:
        ids = [p["id"] for p in (await opa.get("/v1/policies")).json()["result"]]
    assert "evil.rego" not in ids
    # a clean module is still pushed through the same path
    async with httpx.AsyncClient(base_url=stack.admin_url, timeout=30) as admin:
        ok = await admin.put("/admin/policies/extra.rego", headers=h, content=b"package extra\n\nx := upper(\"a\")\n")
    assert ok.status_code == 200, ok.text
    async with httpx.AsyncClient(base_url=remote_opa["srv"].url, timeout=10) as opa:
        ids = [p["id"] for p in (await opa.get("/v1/policies")).json()["result"]]
    assert "extra.rego" in ids


class TestEmbedded:
    @pytest.fixture
    def config_overrides(self) -> dict[str, Any]:
        return {}

    async def test_embedded_pdp_is_ready_with_a_policy_loaded(self, stack: Any) -> None:
        r = await stack.client.get("/readyz")
        assert r.status_code == 200 and r.json() == {"status": "ready"}
