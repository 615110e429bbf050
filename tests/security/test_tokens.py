"""JWT-SVID attack cases against the running gateway (issue 3 done-criteria, issue 6 item 5).

Every refusal answers 401 with the failed check's reason code in the JSON
body (``error.code``) and in ``WWW-Authenticate`` (RFC 6750
``error="invalid_token"`` plus a description), never echoing the token; a
valid token of a workload that maps to no tenant answers 403.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import hmac
import json
import time
from typing import Any

import pytest
from cryptography.hazmat.primitives import serialization

from sim.spiffe_issuer import DemoIssuer
from tests.support.waiting import wait_for

TD = "demo.prefixgate.test"
SID_A = f"spiffe://{TD}/tenant-a/app"
BODY = {"model": "sim-model", "prompt": "hello there general kenobi", "max_tokens": 2}


@pytest.fixture
def config_overrides() -> dict[str, Any]:
    # leeway 0 so that "replay after expiry" needs only a couple of seconds;
    # a large failure budget so the per-source limiter never answers 429 here.
    return {"identity": {"leeway_s": 0, "max_lifetime_s": 3600, "unauthenticated_burst": 1000}}


def b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def b64json(obj: Any) -> str:
    return b64(json.dumps(obj, separators=(",", ":")).encode())


def claims(**over: Any) -> dict[str, Any]:
    now = int(time.time())
    c: dict[str, Any] = {"sub": SID_A, "aud": "prefixgate", "iat": now, "exp": now + 300}
    c.update(over)
    return {k: v for k, v in c.items() if v is not None}


async def post(stack: Any, token: str | None, *, url: str = "/v1/completions") -> Any:
    headers = {} if token is None else {"Authorization": f"Bearer {token}"}
    return await stack.client.post(url, headers=headers, json=BODY)


def assert_refused(resp: Any, reason: str, token: str | None = None) -> None:
    """401, ``error.code == reason``, an RFC 6750 challenge naming invalid_token, no token echo."""
    assert resp.status_code == 401, resp.text
    body = resp.json()
    assert body["error"]["code"] == reason, body
    assert body["error"]["type"] == "authentication_error"
    challenge = resp.headers["www-authenticate"]
    assert challenge.startswith('Bearer realm="prefixgate"')
    assert 'error="invalid_token"' in challenge
    if token:
        for part in token.split("."):
            if len(part) > 8:
                assert part not in resp.text and part not in challenge


async def test_valid_token_passes(stack: Any) -> None:
    r = await post(stack, stack.token())
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["prompt_tokens"] == 4


def _attacks(issuer: DemoIssuer) -> list[tuple[str, str, str]]:
    """(case, token, expected reason) for every forged or invalid JWT-SVID."""
    mint = issuer.mint
    pem = issuer.private_key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    # HS256 "key confusion": the public key (PEM, and the JWK JSON) used as HMAC secret
    hs_header = b64json({"alg": "HS256", "kid": issuer.kid, "typ": "JWT"})
    signing_input = f"{hs_header}.{b64json(claims())}"
    hs_pem = f"{signing_input}.{b64(hmac.new(pem, signing_input.encode(), hashlib.sha256).digest())}"
    jwk_secret = json.dumps(issuer.public_jwk()).encode()
    hs_jwk = f"{signing_input}.{b64(hmac.new(jwk_secret, signing_input.encode(), hashlib.sha256).digest())}"
    # alg none, with and without a signature segment
    none_header = b64json({"alg": "none", "kid": issuer.kid, "typ": "JWT"})
    alg_none = f"{none_header}.{b64json(claims())}."
    alg_none_sig = f"{none_header}.{b64json(claims())}.{b64(b'x' * 64)}"
    # an attacker's own key, advertised through jku/x5u/jwk headers
    rogue = DemoIssuer(TD)
    jku = rogue.mint(SID_A, "prefixgate", headers={"jku": "https://attacker.example/jwks.json"})
    jku_same_kid = rogue.mint(SID_A, "prefixgate",
                              headers={"kid": issuer.kid, "jku": "https://attacker.example/jwks.json",
                                       "x5u": "https://attacker.example/cert.pem", "jwk": rogue.public_jwk()})
    now = time.time()
    return [
        ("alg none", alg_none, "alg_not_allowed"),
        ("alg none with signature", alg_none_sig, "alg_not_allowed"),
        ("HS256 with public key PEM", hs_pem, "alg_not_allowed"),
        ("HS256 with public JWK", hs_jwk, "alg_not_allowed"),
        ("unknown kid", mint(SID_A, "prefixgate", headers={"kid": "no-such-kid"}), "unknown_kid"),
        ("expired", mint(SID_A, "prefixgate", now=now - 600, ttl_s=300), "expired"),
        ("not yet valid (nbf)", mint(SID_A, "prefixgate", nbf=int(now) + 120), "not_yet_valid"),
        ("issued in the future (iat)", mint(SID_A, "prefixgate", now=now + 120, ttl_s=60), "not_yet_valid"),
        ("wrong audience", mint(SID_A, "someone-else"), "audience"),
        ("audience list without ours", mint(SID_A, ["a", "b"]), "audience"),
        ("missing aud", mint(SID_A, "prefixgate", aud=None), "missing_claim"),
        ("missing exp", mint(SID_A, "prefixgate", exp=None), "missing_claim"),
        ("sub in another trust domain", mint("spiffe://evil.example/tenant-a/app", "prefixgate"),
         "foreign_trust_domain"),
        ("malformed SPIFFE ID (scheme)", mint(f"https://{TD}/tenant-a/app", "prefixgate"), "bad_spiffe_id"),
        ("malformed SPIFFE ID (dot segment)", mint(f"spiffe://{TD}/tenant-a/../admin", "prefixgate"),
         "bad_spiffe_id"),
        ("malformed SPIFFE ID (upper-case domain)", mint("spiffe://Demo.PrefixGate.test/x", "prefixgate"),
         "bad_spiffe_id"),
        ("lifetime over maximum", mint(SID_A, "prefixgate", ttl_s=7200), "lifetime_too_long"),
        ("lifetime over maximum without iat", mint(SID_A, "prefixgate", ttl_s=7200, iat=None),
         "lifetime_too_long"),
        ("jku pointing elsewhere", jku, "unknown_kid"),
        ("jku/x5u/jwk with our kid", jku_same_kid, "bad_signature"),
        ("crit header", mint(SID_A, "prefixgate", headers={"crit": ["exp"]}), "crit_header"),
        ("typ other than JWT/JOSE", mint(SID_A, "prefixgate", headers={"typ": "at+jwt"}), "bad_typ"),
        ("valid token with its signature stripped", mint(SID_A, "prefixgate").rsplit(".", 1)[0] + ".",
         "bad_signature"),
        ("signature of another token", mint(SID_A, "prefixgate", sub=f"spiffe://{TD}/tenant-b/app").rsplit(".", 1)[0]
         + "." + mint(SID_A, "prefixgate").rsplit(".", 1)[1], "bad_signature"),
        ("garbage", "this-is-not-a-jwt", "malformed"),
        ("garbage segments", "aaaa.bbbb.cccc", "malformed"),
    ]


async def test_every_attack_is_refused_with_its_reason(stack: Any) -> None:
    before = stack.cluster.states[0].counters.requests + sum(s.counters.requests for s in stack.cluster.states[1:])
    failures = []
    for case, token, reason in _attacks(stack.issuer):
        r = await post(stack, token)
        try:
            assert_refused(r, reason, token)
        except AssertionError as exc:
            failures.append(f"{case}: {exc}")
    assert not failures, "\n".join(failures)
    after = sum(s.counters.requests for s in stack.cluster.states)
    assert after == before  # no refused request reached a replica


async def raw_post(url: str, auth_line: bytes) -> tuple[int, dict[str, str], dict[str, Any]]:
    """POST /v1/completions over a raw socket (httpx refuses a header value with trailing space)."""
    host, port = url.removeprefix("http://").split(":")
    body = json.dumps(BODY).encode()
    reader, writer = await asyncio.open_connection(host, int(port))
    try:
        writer.write(b"POST /v1/completions HTTP/1.1\r\nHost: gw\r\nContent-Type: application/json\r\n"
                     + auth_line + b"Content-Length: " + str(len(body)).encode() + b"\r\nConnection: close\r\n\r\n"
                     + body)
        await writer.drain()
        raw = await asyncio.wait_for(reader.read(), 10)
    finally:
        writer.close()
    head, _, payload = raw.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = {k.strip().lower(): v.strip() for k, _, v in (ln.partition(":") for ln in lines[1:])}
    return int(lines[0].split()[1]), headers, json.loads(payload)


async def test_empty_and_missing_bearer(stack: Any) -> None:
    # An empty bearer credential is a request without credentials (RFC 6750 3.1): 401, bare challenge.
    for line in (b"Authorization: Bearer \r\n", b"Authorization: Bearer\r\n", b"Authorization: \r\n", b""):
        status, headers, body = await raw_post(stack.url, line)
        assert status == 401, (line, body)
        assert body["error"]["code"] == "missing_token"
        assert headers["www-authenticate"] == 'Bearer realm="prefixgate"'
    # another scheme is a malformed header: 400 invalid_request
    r = await stack.client.post("/v1/completions", headers={"Authorization": "Basic dXNlcjpwdw=="}, json=BODY)
    assert r.status_code == 400 and r.json()["error"]["code"] == "malformed_authorization_header"
    assert 'error="invalid_request"' in r.headers["www-authenticate"]


async def test_unmapped_workload_is_forbidden(stack: Any) -> None:
    r = await post(stack, stack.token("stranger/app"))
    assert r.status_code == 403
    assert r.json()["error"]["code"] == "unknown_workload"
    # a prefix rule matches whole segments only: tenant-ab is nobody's
    r = await post(stack, stack.token("tenant-ab/app"))
    assert r.status_code == 403
    # the tenant's own rule does not match the bare prefix itself
    r = await post(stack, stack.token("tenant-a"))
    assert r.status_code == 403


async def test_replay_after_expiry(stack: Any) -> None:
    token = stack.issuer.mint(SID_A, "prefixgate", ttl_s=2)
    exp = json.loads(base64.urlsafe_b64decode(token.split(".")[1] + "=="))["exp"]
    first = await post(stack, token)
    assert first.status_code == 200, first.text
    await asyncio.sleep(max(0.0, exp - time.time()) + 0.2)
    replay = await post(stack, token)
    assert_refused(replay, "expired", token)


async def test_audience_binds_the_listener(stack: Any) -> None:
    op = stack.issuer.mint(f"spiffe://{TD}/ops/admin", "prefixgate-admin")
    # an admin-audience token (even an operator's) is no good on the public listener
    assert_refused(await post(stack, op), "audience", op)
    # a public-audience token (even an operator's) is no good on the admin listener
    for token in (stack.token(), stack.issuer.mint(f"spiffe://{TD}/ops/admin", "prefixgate")):
        r = await stack.client.get(f"{stack.admin_url}/admin/routing", headers={"Authorization": f"Bearer {token}"})
        assert r.status_code == 401, r.text
        assert r.json()["error"]["code"] == "audience"  # the public listener's code for it (R3-9)
        assert 'error="invalid_token"' in r.headers["www-authenticate"]
    # sanity: the operator's admin token works there
    r = await stack.client.get(f"{stack.admin_url}/admin/routing", headers={"Authorization": f"Bearer {op}"})
    assert r.status_code == 200


_until = wait_for  # the conditions return a response, or None while not yet there


async def test_bundle_rotation_without_restart_and_removed_key(stack: Any) -> None:
    issuer, bundle = stack.issuer, stack.tmp / "bundle.json"
    old_token = stack.token()
    assert (await post(stack, old_token)).status_code == 200
    # rotate: the new key is published next to the old one; both verify, no restart
    issuer.rotate()
    issuer.write_bundle(bundle)
    new_token = stack.token()
    assert json.loads(base64.urlsafe_b64decode(new_token.split(".")[0] + "=="))["kid"] == issuer.kid

    async def new_ok() -> Any:
        r = await post(stack, new_token)
        return r if r.status_code == 200 else None

    await _until(new_ok)
    assert (await post(stack, old_token)).status_code == 200
    # drop the old key: a token with a valid signature from it stops working (file re-checked ~1 s)
    issuer.drop_old()
    issuer.write_bundle(bundle)

    async def old_refused() -> Any:
        r = await post(stack, old_token)
        return r if r.status_code == 401 else None

    assert_refused(await _until(old_refused), "unknown_kid", old_token)
    assert (await post(stack, new_token)).status_code == 200
