"""The TLS client settings of every outbound TLS connection PrefixGate makes (S19-R3).

Why: ``ssl.create_default_context()`` takes the interpreter build's cipher defaults. CPython's own
build offers only forward-secret suites and sets TLS 1.2 as the floor; Debian's CPython 3.11
(``--with-ssl-default-suites=openssl``, the venv's interpreter since session 19) offers OpenSSL's
``DEFAULT`` (static-RSA key exchange, SHA-1 CBC suites) and no Python-side floor. The settings here
make the gateway's clients independent of the build: replicas (``gateway/upstream_pool.py``, the
health and metrics probes of ``gateway/upstream.py``), the trust-bundle fetcher, the remote OPA
client (``policy/remote.py``), the Redis state backend (``tenancy/shared_store.py``, ``rediss://``)
and the audit sinks (syslog over TLS, OTLP logs and spans, :func:`requests_session` for the span
senders that run on ``requests``).

It lives in ``audit`` because the audit worker process builds its own TLS clients and ``audit``
imports no other PrefixGate package; ``gateway``, ``policy`` and ``tenancy`` import it (one way,
docs/architecture.md). The gateway serves no TLS itself (TLS ends at the proxy in front of it,
docs/security.md), so there is no server context here.
"""
from __future__ import annotations

import ssl
from typing import Any

__all__ = ["FORWARD_SECRET_CIPHERS", "MINIMUM_VERSION", "client_context", "context_problems", "requests_session"]

#: CPython's own default cipher string (``PY_SSL_DEFAULT_CIPHER_STRING``, Modules/_ssl.c, 3.10-3.13):
#: ECDHE / DHE key exchange only, AEAD or SHA-2 MACs, no SHA-1, no anonymous or null suites. TLS 1.3
#: suites are not set by it (all of them are forward secret, RFC 8446 section 2).
FORWARD_SECRET_CIPHERS = ("@SECLEVEL=2:ECDH+AESGCM:ECDH+CHACHA20:ECDH+AES:DHE+AES:"
                          "!aNULL:!eNULL:!aDSS:!SHA1:!AESCCM")
#: the lowest protocol version offered (RFC 8996 deprecates TLS 1.0 and 1.1)
MINIMUM_VERSION = ssl.TLSVersion.TLSv1_2

# key exchanges with forward secrecy as ``SSLContext.get_ciphers`` names them (kx-any: TLS 1.3)
_FORWARD_SECRET_KEA = frozenset({"kx-ecdhe", "kx-dhe", "kx-any"})


def client_context(cafile: str | None = None, *, certfile: str | None = None,
                   keyfile: str | None = None) -> ssl.SSLContext:
    """A new verifying client context (``ssl.create_default_context``: system roots or ``cafile``,
    hostname check) restricted to :data:`FORWARD_SECRET_CIPHERS` with a :data:`MINIMUM_VERSION`
    floor (a higher floor set by the system's OpenSSL configuration is kept). ``certfile`` /
    ``keyfile``: the client certificate for mutual TLS (PEM paths).

    Raises:
        OSError, ssl.SSLError: a CA, certificate or key file that cannot be read or parsed.
    """
    ctx = ssl.create_default_context(cafile=cafile)
    if ctx.minimum_version < MINIMUM_VERSION:  # MINIMUM_SUPPORTED is -2
        ctx.minimum_version = MINIMUM_VERSION
    ctx.set_ciphers(FORWARD_SECRET_CIPHERS)
    if certfile:
        ctx.load_cert_chain(certfile, keyfile)
    return ctx


def requests_session() -> Any:
    """A new ``requests.Session`` whose https connections (direct or through a proxy) use a
    :func:`client_context` (for the OTLP/HTTP span senders, which run on ``requests``): the
    adapter's pool managers get it as urllib3's ``ssl_context`` (``HTTPAdapter.init_poolmanager`` /
    ``proxy_manager_for``, the documented way to choose TLS settings). ``verify`` given as a CA path
    still adds that CA; the roots otherwise are the system's (``ssl.create_default_context``)."""
    import requests
    from requests.adapters import HTTPAdapter

    class _Adapter(HTTPAdapter):
        def init_poolmanager(self, *args: Any, **kwargs: Any) -> None:
            kwargs["ssl_context"] = client_context()
            super().init_poolmanager(*args, **kwargs)

        def proxy_manager_for(self, proxy: str, **proxy_kwargs: Any) -> Any:
            proxy_kwargs.setdefault("ssl_context", client_context())
            return super().proxy_manager_for(proxy, **proxy_kwargs)

    session = requests.Session()
    session.mount("https://", _Adapter())
    return session


def context_problems(ctx: ssl.SSLContext) -> list[str]:
    """Why ``ctx`` breaks the settings above (empty when it does not): a floor below
    :data:`MINIMUM_VERSION`, and every offered suite without forward secrecy or with SHA-1 as its
    MAC (``SSLContext.get_ciphers`` fields ``kea`` and ``digest``)."""
    problems = []
    floor = ctx.minimum_version
    if floor < MINIMUM_VERSION:
        problems.append(f"minimum version {floor.name}")
    for c in ctx.get_ciphers():
        if c.get("kea") not in _FORWARD_SECRET_KEA or c.get("digest") == "sha1":
            problems.append(f"suite {c['name']}")
    return problems
