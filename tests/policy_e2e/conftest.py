"""Fixtures for the app-level policy tests (issue 4 done-criteria).

``pdp_mode`` parametrizes the shared ``stack`` fixture over the two decision
points: ``embedded`` (the OPA Go engine in the gateway process) and
``remote`` (``tests.support.opa_server`` on loopback, in a thread, reached through
``policy.remote.RemoteOpa``). Both load the shipped ``rego/`` directory.

``ListLog`` (:mod:`tests.support.audit_log`) stands in for :class:`audit.log.AuditLog` behind the gateway's
:class:`gateway.auditing.AuditHub`, so tests read every audit event the
gateway emitted (request and operator events) without sinks on disk.
"""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import uvicorn

from tests.support.audit_log import audit_hub, audit_log  # noqa: F401 - fixtures
from tests.support.opa_server import create_app, state_from_dir

REPO = Path(__file__).resolve().parents[2]
REGO_DIR = REPO / "rego"
TD = "demo.prefixgate.test"
OPERATOR = f"spiffe://{TD}/ops/admin"
ADMIN_AUDIENCE = "prefixgate-admin"

#: Remote-mode decision deadline in tests (s): generous for a loaded 2-CPU CI box, where the
#: OPA thread shares the GIL with the gateway, replicas and client (0.5 s gave 503s in a CI replay);
#: the slow-OPA test makes the server far slower than this (3 s).
REMOTE_TIMEOUT_S = 1.5


class SlowApp:
    """ASGI wrapper that delays every request by ``delay_s`` (0: pass through)."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self.delay_s = 0.0

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "http" and self.delay_s > 0:
            await asyncio.sleep(self.delay_s)
        await self.app(scope, receive, send)


class OpaThread:
    """``tests.support.opa_server`` on 127.0.0.1:<free port> in a thread (own event loop).

    ``slow.delay_s`` makes it slow; :meth:`stop` takes it down (connections
    are refused afterwards: the port is closed).
    """

    def __init__(self, policy_dir: Path) -> None:
        self.slow = SlowApp(create_app(state_from_dir(policy_dir)))
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        cfg = uvicorn.Config(self.slow, log_level="warning", access_log=False, lifespan="off",
                             timeout_graceful_shutdown=1)
        self.server = uvicorn.Server(cfg)
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]}, daemon=True)
        self.stopped = False

    def start(self) -> None:
        self.thread.start()
        deadline = time.monotonic() + 10
        while not self.server.started:
            if time.monotonic() > deadline or not self.thread.is_alive():
                raise RuntimeError("opa_server did not start")
            time.sleep(0.01)

    def stop(self) -> None:
        if self.stopped:
            return
        self.stopped = True
        self.slow.delay_s = 0.0
        self.server.should_exit = True
        self.server.force_exit = True
        self.thread.join(timeout=10)
        self.sock.close()


@pytest.fixture(params=["embedded", "remote"])
def pdp_mode(request: pytest.FixtureRequest) -> str:
    """Which decision point the gateway uses."""
    return request.param


@pytest.fixture
def opa(pdp_mode: str) -> Iterator[OpaThread | None]:
    """The remote OPA (None in embedded mode)."""
    if pdp_mode != "remote":
        yield None
        return
    srv = OpaThread(REGO_DIR)
    srv.start()
    try:
        yield srv
    finally:
        srv.stop()


@pytest.fixture
def policy_cache_ttl_s() -> float | None:
    """``policy.cache_ttl_s`` of the stack (None: the gateway's default, 1 s). A test that counts
    decision-cache hits across several requests sets a long one by parametrizing this name: the
    hard TTL runs on the wall clock, and a loaded CI box took over 1 s for three requests
    (session 11: the third request missed an expired entry; no cache clear was involved)."""
    return None


@pytest.fixture
def policy_section(pdp_mode: str, opa: OpaThread | None, policy_cache_ttl_s: float | None) -> dict[str, Any]:
    """The gateway's ``policy`` config section for ``pdp_mode`` (and ``policy_cache_ttl_s``)."""
    ttl = {} if policy_cache_ttl_s is None else {"cache_ttl_s": policy_cache_ttl_s}
    if opa is None:
        # its own deadline: test_pdp_slow_gives_503_within_the_deadline holds a decision 3 s (the stack's is 5 s)
        return {"mode": "embedded", "dir": str(REGO_DIR), "timeout_s": 1.0, **ttl}
    # the remote OPA runs the shipped rego: the operator opts into the decision cache (R10-2)
    return {"mode": "remote", "url": opa.url, "timeout_s": REMOTE_TIMEOUT_S, "cache_key_fields": [], **ttl}


@pytest.fixture
def config_overrides(policy_section: dict[str, Any]) -> dict[str, Any]:
    """Shipped policies, the chosen PDP, and a second served model nobody is entitled to."""
    return {"policy": policy_section, "models": ["sim-model", "other-model"]}

