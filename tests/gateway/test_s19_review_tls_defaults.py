"""Session 19 review, S19-R3: the gateway's TLS clients take the interpreter's default context
(``ssl.create_default_context()``: gateway/upstream_pool.py ``_connect``, audit/syslog.py, audit/config.py,
audit/span_post.py; policy/remote.py sets only ``minimum_version``). Debian's CPython 3.11.2 is built
``--with-ssl-default-suites=openssl`` (/usr/share/doc/python3.11/changelog.Debian.gz, 3.11.2-3): its
default cipher string is OpenSSL's ``DEFAULT`` (60 suites here, with static-RSA key exchange such as
``AES128-GCM-SHA256`` and SHA-1 CBC suites) and no Python-side TLS 1.2 floor, where pyenv's 3.11.7 (the
interpreter of sessions 1-18) offers CPython's own 17 forward-secret suites
(``@SECLEVEL=2:ECDH+AESGCM:ECDH+CHACHA20:ECDH+AES:DHE+AES:!aNULL:!eNULL:!aDSS:!SHA1:!AESCCM``) and sets
TLS 1.2 as the minimum. So since the venv moved interpreter (afd63e3), an https replica that picks a
suite without forward secrecy is accepted; before, the handshake was refused.

Fixed: every TLS client of the gateway takes :func:`audit.tls.client_context` (CPython's own
forward-secret cipher string and the TLS 1.2 floor, whatever the build); the test holds on every
interpreter. The other clients: tests/security/test_s19_tls_clients.py.
"""
from __future__ import annotations

import asyncio
import ssl
from pathlib import Path

import pytest

from gateway.upstream_pool import UpstreamConnectError, UpstreamPool
from tests.support.tls import self_signed

STATIC_RSA = "AES128-GCM-SHA256"  # TLS 1.2, RSA key exchange: no forward secrecy


async def test_an_https_replica_without_forward_secrecy_is_refused(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    cert, key = self_signed(tmp_path, rsa_key=True)
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(cert, key)
    ctx.maximum_version = ssl.TLSVersion.TLSv1_2
    ctx.set_ciphers(STATIC_RSA)  # a replica (or a proxy before it) that only speaks a suite without PFS

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            await reader.readuntil(b"\r\n\r\n")
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}")
            await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError, ssl.SSLError):
            pass
        finally:
            writer.close()

    srv = await asyncio.start_server(handle, "127.0.0.1", 0, ssl=ctx)
    monkeypatch.setenv("SSL_CERT_FILE", str(cert))  # the default context's roots: the test CA
    pool = UpstreamPool(2, 5.0)  # the production client: no context given
    try:
        with pytest.raises(UpstreamConnectError):
            resp = await pool.request("GET", f"https://127.0.0.1:{srv.sockets[0].getsockname()[1]}/health")
            resp.close()
    finally:
        await pool.close()
        srv.close()
