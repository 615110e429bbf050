from __future__ import annotations

import shutil
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import uvicorn

from tests.support.opa_server import OpaServerState, create_app, state_from_dir

REPO = Path(__file__).resolve().parents[2]
REGO_DIR = REPO / "rego"

APP_ID = "spiffe://prefixgate.test/ns/apps/sa/chat"
DENIED_ID = "spiffe://prefixgate.test/ns/quarantine/sa/crawler"

CANDIDATES: list[dict[str, Any]] = [
    {"id": "r-d1", "pool": "default", "labels": {}, "healthy": True, "load": 1},
    {"id": "r-d2", "pool": "default", "labels": {}, "healthy": True, "load": 2},
    {"id": "r-e1", "pool": "eu", "labels": {"data_residency": "eu"}, "healthy": True, "load": 0},
    {"id": "r-e2", "pool": "eu", "labels": {"data_residency": "eu"}, "healthy": True, "load": 3},
]


#: What the tenant registry puts in ``input.tenant`` for each test tenant (the
#: registry is the one source of tenant facts; the shipped data holds none).
TENANTS: dict[str, dict[str, Any]] = {
    "tenant-a": {"tier": "standard", "models": ["sim-model"], "pools": ["default"], "regulated": False},
    "tenant-b": {"tier": "standard", "models": ["sim-model"], "pools": ["default", "eu"], "regulated": False},
    "tenant-reg": {"tier": "premium", "models": ["sim-model"], "pools": ["default", "eu"], "regulated": True,
                   "data_residency": "eu"},
}


class ServerThread:
    """A uvicorn server for an ASGI app on 127.0.0.1:<free port>, in a thread."""

    def __init__(self, app: Any) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        config = uvicorn.Config(app, log_level="warning", access_log=False, lifespan="off")
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]}, daemon=True)

    def __enter__(self) -> ServerThread:
        self.thread.start()
        deadline = time.monotonic() + 10
        while not self.server.started:
            if time.monotonic() > deadline or not self.thread.is_alive():
                raise RuntimeError("server did not start")
            time.sleep(0.01)
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)
        self.sock.close()


@pytest.fixture(scope="module")
def opa_server() -> Iterator[ServerThread]:
    """opa_server on loopback serving the shipped rego/ (decision logs on)."""
    with ServerThread(create_app(state_from_dir(REGO_DIR))) as srv:
        yield srv


@pytest.fixture
def fresh_opa_server() -> Iterator[tuple[ServerThread, OpaServerState]]:
    """A per-test opa_server (for tests that change its policies)."""
    state = state_from_dir(REGO_DIR)
    with ServerThread(create_app(state)) as srv:
        yield srv, state


def make_input(
    tenant: str = "tenant-a",
    *,
    model: str = "sim-model",
    max_tokens: int | None = None,
    spiffe_id: str = APP_ID,
    candidates: list[dict[str, Any]] | None = None,
    alerts: list[dict[str, Any]] | None = None,
    tenant_max_tokens: int | None = None,
    prompt_tokens: int = 100,
    entitlements: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """A policy input built through build_policy_input; the tenant's entitlements
    are ``entitlements`` or its row of :data:`TENANTS` (none for an unknown id)."""
    from policy.input import build_policy_input

    facts = dict(TENANTS.get(tenant, {}) if entitlements is None else entitlements)
    return build_policy_input(
        identity={"spiffe_id": spiffe_id, "trust_domain": "prefixgate.test", "claims": {"aud": ["prefixgate"]}},
        tenant={"id": tenant, **facts, "max_tokens": tenant_max_tokens},
        request={
            "endpoint": "/v1/chat/completions",
            "model": model,
            "prompt_tokens": prompt_tokens,
            "max_tokens": max_tokens,
            "stream": True,
            "messages": [{"role": "user", "content": "secret prompt text"}],
        },
        candidates=CANDIDATES if candidates is None else candidates,
        alerts=alerts or [],
        now=1_700_000_000.0,
    )


@pytest.fixture
def mk() -> Any:
    """The make_input helper."""
    return make_input


@pytest.fixture
def ids() -> dict[str, str]:
    """SPIFFE IDs used by the tests."""
    return {"app": APP_ID, "denied": DENIED_ID}


@pytest.fixture
def rego_dir() -> Path:
    """The shipped policy directory."""
    return REGO_DIR


@pytest.fixture
def active(tmp_path: Path, rego_dir: Path) -> Path:
    """A writable copy of the shipped policy directory (a store's active directory)."""
    dst = tmp_path / "active"
    shutil.copytree(rego_dir, dst)
    return dst


@pytest.fixture
def server_cls() -> type[ServerThread]:
    """The ServerThread helper class."""
    return ServerThread
