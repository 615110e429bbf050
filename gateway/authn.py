"""Pipeline step 1: who is calling (the PEP side of authentication).

Order of checks, cheapest first: a source address whose failed
authentications exhausted its bucket is refused (429) *before* any token is
verified, so a flood of bad tokens costs one dict lookup each; only failed
attempts consume the bucket, authenticated traffic never does;
then the ``Authorization: Bearer`` JWT-SVID is verified against the trust
bundle of its trust domain (:class:`gateway.identity.JwtSvidVerifier`).
Optionally an X.509-SVID forwarded by a trusted proxy in
``x-forwarded-client-cert`` is read (only when the socket peer is a
configured proxy); when both are present they must name the same SPIFFE ID
(:func:`gateway.identity.reconcile`, see docs/identity.md).
"""

from __future__ import annotations

import ipaddress
import time

from starlette.requests import Request

from gateway.errors import GatewayError
from gateway.identity import (
    AuthenticationError,
    JwtSvidVerifier,
    WorkloadIdentity,
    error_body,
    extract_bearer,
    www_authenticate,
)

__all__ = ["Authenticator", "auth_error"]


def auth_error(err: AuthenticationError) -> GatewayError:
    """Map a refused credential to a 401 (or 400/503) answer with ``WWW-Authenticate``."""
    body = error_body(err)["error"]
    return GatewayError(
        err.status,
        body["code"],
        body["message"],
        err_type=body["type"],
        headers={"WWW-Authenticate": www_authenticate(err)},
        outcome="unauthenticated" if err.status != 503 else "failed",
    )


class Authenticator:
    """Authenticates one request to a :class:`WorkloadIdentity`.

    ``verifier``: the JWT-SVID verifier of this listener's audience;
    ``source_limiter``: a :class:`tenancy.limits.SourceLimiter` (or ``None``);
    ``trusted_proxies``: CIDRs whose forwarded client certificates are
    believed. Raises :class:`GatewayError` (401/400/429/503).
    """

    def __init__(
        self,
        verifier: JwtSvidVerifier,
        source_limiter: object | None = None,
        trusted_proxies: list[str] | None = None,
    ) -> None:
        self.verifier = verifier
        self.source_limiter = source_limiter
        self.trusted_proxies = [ipaddress.ip_network(p, strict=False) for p in (trusted_proxies or [])]

    async def authenticate(self, request: Request) -> WorkloadIdentity:
        """Return the caller's identity or raise :class:`GatewayError`."""
        peer = request.client.host if request.client else "unknown"
        if self.source_limiter is not None:
            wait = self.source_limiter.blocked(peer, time.monotonic())  # type: ignore[attr-defined]
            if wait > 0:
                raise GatewayError(
                    429, "too_many_unauthenticated", "too many failed authentications from this source",
                    headers={"Retry-After": str(max(1, int(wait + 0.999)))},
                    outcome="rate_limited",
                )
        try:
            return await self._authenticate(request, peer)
        except GatewayError:
            if self.source_limiter is not None:
                self.source_limiter.charge_failure(peer, time.monotonic())  # type: ignore[attr-defined]
            raise

    async def _authenticate(self, request: Request, peer: str) -> WorkloadIdentity:
        xfcc_values = request.headers.getlist("x-forwarded-client-cert")
        forwarded: WorkloadIdentity | None = None
        if xfcc_values and self.trusted_proxies:
            from gateway.identity import identity_from_xfcc

            try:
                forwarded = identity_from_xfcc(xfcc_values, peer, self.trusted_proxies)
            except Exception:
                raise GatewayError(401, "invalid_client_certificate", "forwarded client certificate is invalid",
                                   headers={"WWW-Authenticate": www_authenticate()}, outcome="unauthenticated") from None
        auths = request.headers.getlist("authorization")
        if len(auths) > 1:
            raise GatewayError(400, "malformed_authorization_header", "more than one Authorization header",
                               headers={"WWW-Authenticate": www_authenticate()}, outcome="unauthenticated")
        if not auths and forwarded is not None:
            return forwarded
        try:
            token = extract_bearer(auths[0] if auths else None)
            identity = await self.verifier.verify(token)
        except AuthenticationError as err:
            raise auth_error(err) from None
        if forwarded is not None:
            from gateway.identity import reconcile

            try:
                identity = reconcile(identity, forwarded)
            except AuthenticationError as err:
                raise auth_error(err) from None
        return identity
