"""Issue 12, finding 1: behind a trusted proxy the source is the client the proxy attests.

The gateway trusts ``127.0.0.1/32`` as a proxy (the test client connects from
it) and has a tiny budget of failed signature checks (40). Before, every
client behind the proxy shared the proxy's bucket: one client's bad tokens
blocked all. Now the source is the right-most ``X-Forwarded-For`` entry that
is not a trusted proxy, so:

* client A's bad-signature flood blocks A only; client B behind the same
  proxy still verifies a fresh token;
* entries left of the one the proxy wrote are the client's own words and
  never change its source; from a peer that is not a trusted proxy
  (127.0.0.2) the header is ignored altogether;
* audit events carry the attested client address.
Plus the pure function's rules (``attested_client``).
"""

from __future__ import annotations

import ipaddress
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from gateway.auditing import AuditHub
from sim.spiffe_issuer import DemoIssuer
from tests.support.audit_log import ListLog as CaptureLog

TD = "demo.prefixgate.test"
TENANT = f"spiffe://{TD}/tenant-a/app"
BODY = {"model": "sim-model", "prompt": "behind the shared proxy", "max_tokens": 2}
A, B = "198.51.100.7", "198.51.100.8"


@pytest.fixture
def n_replicas() -> int:
    return 1


@pytest.fixture
def capture() -> CaptureLog:
    return CaptureLog()


@pytest.fixture
def audit_hub(capture: CaptureLog) -> AuditHub:
    return AuditHub(capture)


@pytest.fixture
def config_overrides() -> dict[str, Any]:
    return {"identity": {"trusted_proxies": ["127.0.0.1/32", "10.0.0.0/8"],
                         "unauthenticated_rps": 0.01, "unauthenticated_burst": 40}}


@pytest.fixture
async def untrusted(stack: Any) -> AsyncIterator[httpx.AsyncClient]:
    """A client whose socket peer is 127.0.0.2: not a trusted proxy."""
    transport = httpx.AsyncHTTPTransport(local_address="127.0.0.2")
    async with httpx.AsyncClient(base_url=stack.url, transport=transport, timeout=20) as client:
        yield client


def headers(token: str, xff: str | None = None) -> dict[str, str]:
    h = {"Authorization": f"Bearer {token}"}
    if xff is not None:
        h["X-Forwarded-For"] = xff
    return h


async def flood(client: httpx.AsyncClient, stack: Any, xff: str | None, n: int = 60) -> list[int]:
    forger = DemoIssuer(TD)
    out = []
    for i in range(n):
        tok = forger.mint(TENANT, "prefixgate", headers={"kid": stack.issuer.kid}, jti=f"{xff}-{i}")
        out.append((await client.get("/v1/models", headers=headers(tok, xff))).status_code)
    return out


async def test_one_client_behind_the_proxy_does_not_block_another(stack: Any, capture: CaptureLog) -> None:
    statuses = await flood(stack.client, stack, A)
    assert statuses[0] == 401 and statuses[-1] == 429
    # A is blocked for fresh tokens ...
    r = await stack.client.get("/v1/models", headers=headers(stack.token(jti="a-fresh"), A))
    assert r.status_code == 429
    # ... even when it prepends another address of its own choosing (the proxy appends the real one)
    r = await stack.client.get("/v1/models", headers=headers(stack.token(jti="a-spoof"), f"203.0.113.99, {A}"))
    assert r.status_code == 429
    # ... and through a second trusted hop (10.1.2.3 is a trusted proxy: skipped)
    r = await stack.client.get("/v1/models", headers=headers(stack.token(jti="a-2hop"), f"{A}, 10.1.2.3"))
    assert r.status_code == 429
    # B, behind the same proxy, is not
    r = await stack.client.post("/v1/completions", headers=headers(stack.token(jti="b-fresh"), B), json=BODY)
    assert r.status_code == 200, r.text
    # nor the proxy's own requests (no X-Forwarded-For)
    r = await stack.client.get("/v1/models", headers=headers(stack.token(jti="proxy-own")))
    assert r.status_code == 200, r.text
    # audit events name the attested client, never the proxy
    blocked = [e for e in capture.events if e.policy.reason_code == "too_many_unauthenticated"]
    assert blocked and {e.client_address for e in blocked} == {A}
    ok = [e for e in capture.events if e.status_code == 200 and e.endpoint == "/v1/completions"]
    assert ok and ok[-1].client_address == B


async def test_untrusted_peer_cannot_choose_its_source(stack: Any, untrusted: httpx.AsyncClient) -> None:
    forger = DemoIssuer(TD)
    statuses = []
    for i in range(60):  # a different X-Forwarded-For on every request: ignored from this peer
        tok = forger.mint(TENANT, "prefixgate", headers={"kid": stack.issuer.kid}, jti=f"u-{i}")
        r = await untrusted.get("/v1/models", headers=headers(tok, f"192.0.2.{i}"))
        statuses.append(r.status_code)
    assert statuses[-1] == 429
    r = await untrusted.get("/v1/models", headers=headers(stack.token(jti="u-fresh"), "192.0.2.200"))
    assert r.status_code == 429
    # the trusted proxy's clients are unaffected
    r = await stack.client.get("/v1/models", headers=headers(stack.token(jti="b2"), B))
    assert r.status_code == 200


def test_attested_client_rules() -> None:
    from gateway.identity import attested_client

    nets = [ipaddress.ip_network("127.0.0.1/32"), ipaddress.ip_network("10.0.0.0/8"),
            ipaddress.ip_network("fd00::/8")]
    # untrusted peer: the peer, header ignored
    assert attested_client("192.0.2.1", ["198.51.100.7"], nets) == "192.0.2.1"
    # trusted peer: right-most untrusted entry, trusted hops skipped, client-written entries ignored
    assert attested_client("127.0.0.1", ["198.51.100.7"], nets) == "198.51.100.7"
    assert attested_client("127.0.0.1", ["1.2.3.4, 198.51.100.7, 10.0.0.5"], nets) == "198.51.100.7"
    assert attested_client("127.0.0.1", ["1.2.3.4", "198.51.100.7, 10.0.0.5"], nets) == "198.51.100.7"
    # all trusted: the left-most; none at all: the proxy itself
    assert attested_client("127.0.0.1", ["10.0.0.9, 10.0.0.5"], nets) == "10.0.0.9"
    assert attested_client("127.0.0.1", [], nets) == "127.0.0.1"
    assert attested_client("127.0.0.1", ["  "], nets) == "127.0.0.1"
    # ports, brackets, IPv4-mapped IPv6, zone ids
    assert attested_client("127.0.0.1", ["198.51.100.7:4711"], nets) == "198.51.100.7"
    assert attested_client("127.0.0.1", ["[2001:db8::1]:4711"], nets) == "2001:db8::1"
    assert attested_client("127.0.0.1", ["::ffff:198.51.100.7"], nets) == "198.51.100.7"
    assert attested_client("::ffff:127.0.0.1", ["2001:db8::2"], nets) == "2001:db8::2"
    # an unusable entry where the walk stops: one separate source per proxy, never the proxy's own
    assert attested_client("127.0.0.1", ["unknown"], nets) == "unattested@127.0.0.1"
    assert attested_client("127.0.0.1", ["198.51.100.7, _hidden"], nets) == "unattested@127.0.0.1"
    # a very long chain is read from the right only, bounded
    long_chain = ", ".join(["10.0.0.1"] * 500 + ["198.51.100.9"])
    assert attested_client("127.0.0.1", [long_chain], nets) == "198.51.100.9"
    assert attested_client("127.0.0.1", [", ".join(["10.0.0.1"] * 500)], nets) == "10.0.0.1"
    # no trusted proxies configured: always the peer
    assert attested_client("127.0.0.1", ["198.51.100.7"], []) == "127.0.0.1"
    assert attested_client(None, ["198.51.100.7"], nets) == "unknown"
