from __future__ import annotations

import datetime as dt
import ipaddress
import json
import ssl
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import NameOID
from jwt.algorithms import RSAAlgorithm

from gateway.identity import (
    AuthenticationError,
    BundleError,
    BundleUnavailable,
    FileBundleSource,
    HttpsBundleSource,
    JwtSvidVerifier,
    Reason,
    StaticBundleSource,
    TrustBundleStore,
    UnknownTrustDomain,
    parse_bundle,
)
from sim.spiffe_issuer import DemoIssuer

TD = "a.example"
SID = f"spiffe://{TD}/w"
AUD = "prefixgate"


class FakeClock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


# ---------------------------------------------------------------- parsing


def test_spiffe_bundle_keys_kept_other_uses_dropped() -> None:
    iss = DemoIssuer(TD)
    doc = iss.bundle()
    x509_key = dict(iss.public_jwk(), use="x509-svid", kid="x509")
    sig_key = dict(iss.public_jwk(), use="sig", kid="sig")
    no_use = {k: v for k, v in iss.public_jwk().items() if k != "use"} | {"kid": "nouse"}
    doc["keys"] += [x509_key, sig_key, no_use]
    b = parse_bundle(TD, json.dumps(doc))
    assert set(b.keys) == {iss.kid}
    assert b.skipped == 3 and b.sequence == 1 and b.refresh_hint_s == 60.0
    relaxed = parse_bundle(TD, doc, allow_missing_use=True)
    assert set(relaxed.keys) == {iss.kid, "nouse"}


def test_pyjwk_client_trap_is_avoided() -> None:
    # The reason this module parses bundles itself: PyJWKSet/PyJWKClient
    # filtering would leave a SPIFFE bundle with no usable key.
    iss = DemoIssuer(TD)
    b = parse_bundle(TD, iss.bundle())
    assert b.get(iss.kid) is not None
    assert b.get(iss.kid).pyjwk_for("ES256").key_id == iss.kid


def _rsa_jwk(bits: int) -> dict[str, Any]:
    k = rsa.generate_private_key(public_exponent=65537, key_size=bits)
    return json.loads(RSAAlgorithm.to_jwk(k.public_key()))


@pytest.mark.parametrize(
    "mutate",
    [
        lambda j: j.pop("kid"),
        lambda j: j.update(kid=""),
        lambda j: j.update(kid=7),
        lambda j: j.update(kty="oct", k="c2VjcmV0"),
        lambda j: j.update(alg="HS256"),
        lambda j: j.update(alg="ES384"),  # P-256 key claiming ES384
        lambda j: j.update(crv="secp256k1"),
        lambda j: j.update(d="AAAA"),  # private key material
        lambda j: j.update(x="not-a-point"),
    ],
)
def test_bad_keys_are_ignored(mutate: Callable[[dict[str, Any]], Any]) -> None:
    iss = DemoIssuer(TD)
    jwk = iss.public_jwk()
    mutate(jwk)
    b = parse_bundle(TD, {"keys": [jwk]})
    assert len(b.keys) == 0 and b.skipped == 1


def test_small_rsa_key_ignored() -> None:
    small = dict(_rsa_jwk(1024), use="jwt-svid", kid="small")
    big = dict(_rsa_jwk(2048), use="jwt-svid", kid="big")
    assert set(parse_bundle(TD, {"keys": [small, big]}).keys) == {"big"}


@pytest.mark.parametrize(
    "doc",
    [
        b"not json",
        b"[]",
        b'{"keys": {}}',
        b'{"keys": [], "keys": []}',
        b'{"keys": [], "spiffe_sequence": -1}',
        b'{"keys": [], "spiffe_sequence": "3"}',
        b'{"keys": [], "spiffe_refresh_hint": "soon"}',
        b" " * (1 << 20) + b"{}",
    ],
)
def test_bad_documents(doc: bytes) -> None:
    with pytest.raises(BundleError):
        parse_bundle(TD, doc)


def test_duplicate_kid_rejected() -> None:
    iss = DemoIssuer(TD)
    with pytest.raises(BundleError):
        parse_bundle(TD, {"keys": [iss.public_jwk(), iss.public_jwk()]})


def test_sequence_regression_ignored() -> None:
    old, new = DemoIssuer(TD), DemoIssuer(TD)
    new.sequence = 5
    old.sequence = 3
    src = StaticBundleSource(parse_bundle(TD, new.bundle()))
    src.replace(parse_bundle(TD, old.bundle()))
    assert set(src.current().keys) == {new.kid}
    new.sequence = 6
    new.rotate()
    src.replace(parse_bundle(TD, new.bundle()))
    assert src.current().sequence == 7 and len(src.current().keys) == 2


async def test_store_unknown_domain() -> None:
    store = TrustBundleStore()
    with pytest.raises(UnknownTrustDomain):
        await store.get(TD)


# ---------------------------------------------------------------- file source


async def test_file_rotation_without_restart(tmp_path: Path) -> None:
    iss = DemoIssuer(TD)
    path = tmp_path / "bundle.json"
    iss.write_bundle(path)
    store = TrustBundleStore({TD: FileBundleSource(TD, path, check_interval_s=0)})
    v = JwtSvidVerifier(store, AUD, {TD})
    old_tok = iss.mint(SID, AUD)
    assert (await v.verify(old_tok)).kid == iss.kid

    old_kid = iss.kid
    new_kid = iss.rotate()
    new_tok = iss.mint(SID, AUD)
    # New kid not yet published: refused.
    with pytest.raises(AuthenticationError) as ei:
        await v.verify(new_tok)
    assert ei.value.reason == Reason.UNKNOWN_KID
    iss.write_bundle(path)
    assert (await v.verify(new_tok)).kid == new_kid
    assert (await v.verify(old_tok)).kid == old_kid  # both during overlap

    iss.drop_old()
    iss.write_bundle(path)
    with pytest.raises(AuthenticationError) as ei:
        await v.verify(old_tok)
    assert ei.value.reason == Reason.UNKNOWN_KID
    assert (await v.verify(new_tok)).kid == new_kid


async def test_file_checked_at_most_every_interval(tmp_path: Path) -> None:
    iss = DemoIssuer(TD)
    path = tmp_path / "b.json"
    iss.write_bundle(path)
    clock = FakeClock()
    src = FileBundleSource(TD, path, check_interval_s=10, clock=clock)
    first = await src.get()
    iss.rotate()
    iss.drop_old()
    iss.write_bundle(path)
    clock.t += 5
    assert await src.get() is first  # not re-checked yet
    clock.t += 6
    assert set((await src.get()).keys) == {iss.kid}


async def test_file_sequence_regression_and_stale_bound(tmp_path: Path) -> None:
    iss = DemoIssuer(TD)
    path = tmp_path / "b.json"
    iss.sequence = 10
    iss.write_bundle(path)
    clock = FakeClock()
    src = FileBundleSource(TD, path, check_interval_s=0, max_stale_s=60, clock=clock)
    assert (await src.get()).sequence == 10
    other = DemoIssuer(TD)
    other.sequence = 9
    other.write_bundle(path)
    assert set((await src.get()).keys) == {iss.kid}  # lower sequence ignored

    path.write_text("{broken")
    clock.t += 30
    assert set((await src.get()).keys) == {iss.kid}  # last good, within bound
    clock.t += 31
    with pytest.raises(BundleUnavailable):
        await src.get()
    iss.write_bundle(path)
    clock.t += 1
    assert set((await src.get()).keys) == {iss.kid}  # recovers


async def test_missing_file_fails_closed(tmp_path: Path) -> None:
    src = FileBundleSource(TD, tmp_path / "absent.json")
    store = TrustBundleStore({TD: src})
    v = JwtSvidVerifier(store, AUD, {TD})
    with pytest.raises(AuthenticationError) as ei:
        await v.verify(DemoIssuer(TD).mint(SID, AUD))
    assert ei.value.reason == Reason.BUNDLE_UNAVAILABLE and ei.value.status == 503


# ---------------------------------------------------------------- HTTPS source


class BundleServer:
    def __init__(self, issuer: DemoIssuer) -> None:
        self.issuer = issuer
        self.fail = False
        self.hits = 0

    async def handle(self, request: web.Request) -> web.Response:
        self.hits += 1
        if self.fail:
            return web.Response(status=500)
        return web.json_response(self.issuer.bundle())


async def _serve(server: BundleServer, ssl_ctx: ssl.SSLContext | None) -> tuple[web.AppRunner, int]:
    app = web.Application()
    app.router.add_get("/bundle", server.handle)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=ssl_ctx)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    return runner, port


def _self_signed(tmp_path: Path) -> tuple[ssl.SSLContext, ssl.SSLContext]:
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "bundle.test")])
    now = dt.datetime.now(dt.timezone.utc)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name).issuer_name(name).public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=1)).not_valid_after(now + dt.timedelta(hours=1))
        .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), True)
        .sign(key, hashes.SHA256())
    )
    cert_path, key_path = tmp_path / "c.pem", tmp_path / "k.pem"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    server_ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server_ctx.load_cert_chain(cert_path, key_path)
    client_ctx = ssl.create_default_context(cafile=str(cert_path))
    return server_ctx, client_ctx


@pytest.fixture
async def http_bundle() -> AsyncIterator[tuple[BundleServer, str]]:
    server = BundleServer(DemoIssuer(TD))
    runner, port = await _serve(server, None)
    try:
        yield server, f"http://127.0.0.1:{port}/bundle"
    finally:
        await runner.cleanup()


def test_plain_http_refused_without_test_flag() -> None:
    with pytest.raises(ValueError):
        HttpsBundleSource(TD, "http://127.0.0.1:1/bundle")
    with pytest.raises(ValueError):
        HttpsBundleSource(TD, "file:///etc/passwd", insecure_http_for_tests=True)


async def test_https_source_real_tls(tmp_path: Path) -> None:
    server_ctx, client_ctx = _self_signed(tmp_path)
    server = BundleServer(DemoIssuer(TD))
    runner, port = await _serve(server, server_ctx)
    url = f"https://127.0.0.1:{port}/bundle"
    good = HttpsBundleSource(TD, url, ssl_context=client_ctx)
    untrusting = HttpsBundleSource(TD, url)  # system roots do not know the test CA
    try:
        v = JwtSvidVerifier(TrustBundleStore({TD: good}), AUD, {TD})
        assert (await v.verify(server.issuer.mint(SID, AUD))).trust_domain == TD
        with pytest.raises(BundleUnavailable):
            await untrusting.get()
    finally:
        await good.aclose()
        await untrusting.aclose()
        await runner.cleanup()


async def test_https_refresh_hint_stale_while_error_then_fail_closed(
    http_bundle: tuple[BundleServer, str],
) -> None:
    server, url = http_bundle
    server.issuer.refresh_hint_s = 60
    clock = FakeClock()
    src = HttpsBundleSource(TD, url, insecure_http_for_tests=True, max_stale_s=600,
                            retry_s=5, min_refresh_s=1, clock=clock)
    try:
        b = await src.get()
        assert server.hits == 1 and set(b.keys) == {server.issuer.kid}
        clock.t += 30
        await src.get()
        assert server.hits == 1  # cached within refresh hint
        clock.t += 31
        await src.get()
        assert server.hits == 2  # refreshed after hint

        server.fail = True
        clock.t += 61
        assert (await src.get()) is not None and server.hits == 3  # stale while error
        clock.t += 2
        await src.get()
        assert server.hits == 3  # retry backoff respected
        clock.t += 400
        await src.get()  # 463 s since last success, still within 600
        clock.t += 200
        with pytest.raises(BundleUnavailable):
            await src.get()

        server.fail = False
        clock.t += 10
        assert set((await src.get()).keys) == {server.issuer.kid}  # recovers
    finally:
        await src.aclose()


async def test_https_rotation_via_unknown_kid(http_bundle: tuple[BundleServer, str]) -> None:
    server, url = http_bundle
    clock = FakeClock()
    src = HttpsBundleSource(TD, url, insecure_http_for_tests=True, min_refresh_s=5, clock=clock)
    v = JwtSvidVerifier(TrustBundleStore({TD: src}), AUD, {TD})
    try:
        old_tok = server.issuer.mint(SID, AUD)
        await v.verify(old_tok)
        server.issuer.rotate()
        server.issuer.drop_old()
        new_tok = server.issuer.mint(SID, AUD)
        clock.t += 1
        with pytest.raises(AuthenticationError):  # early refresh rate-limited
            await v.verify(new_tok)
        clock.t += 5
        assert (await v.verify(new_tok)).kid == server.issuer.kid  # picked up early
        with pytest.raises(AuthenticationError) as ei:
            await v.verify(old_tok)
        assert ei.value.reason == Reason.UNKNOWN_KID
    finally:
        await src.aclose()


async def test_https_non_200_and_oversize(http_bundle: tuple[BundleServer, str]) -> None:
    server, url = http_bundle
    server.fail = True
    src = HttpsBundleSource(TD, url, insecure_http_for_tests=True)
    try:
        with pytest.raises(BundleUnavailable):
            await src.get()
    finally:
        await src.aclose()


async def test_concurrent_requests_cause_one_fetch(http_bundle: tuple[BundleServer, str]) -> None:
    import asyncio

    server, url = http_bundle
    clock = FakeClock()
    src = HttpsBundleSource(TD, url, insecure_http_for_tests=True, min_refresh_s=5, clock=clock)
    v = JwtSvidVerifier(TrustBundleStore({TD: src}), AUD, {TD})
    try:
        await src.get()
        server.issuer.rotate()
        tok = server.issuer.mint(SID, AUD)
        clock.t += 10
        results = await asyncio.gather(*(v.verify(tok) for _ in range(20)))
        assert all(r.kid == server.issuer.kid for r in results)
        assert server.hits == 2  # initial fetch + one early refresh for the burst
        garbage_kid = server.issuer.mint(SID, AUD, headers={"kid": "random"})
        clock.t += 1
        for _ in range(10):
            with pytest.raises(AuthenticationError):
                await v.verify(garbage_kid)
        assert server.hits == 2  # unknown kids cannot hammer the bundle endpoint
    finally:
        await src.aclose()
