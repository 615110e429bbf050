"""Pipeline step 1: who is calling (the PEP side of authentication).

Order of checks, cheapest first: a source address whose failed
authentications exhausted its bucket is refused (429) *before* any token is
verified, so a flood of bad tokens costs one dict lookup each; only failed
attempts consume the bucket, authenticated traffic never does;
then the ``Authorization: Bearer`` JWT-SVID is verified against the trust
bundle of its trust domain (:class:`gateway.identity.JwtSvidVerifier`).
The JWT-SVID is required on every listener. An X.509-SVID forwarded in
``x-forwarded-client-cert`` is never an identity: it is read only when the
socket peer is a configured trusted proxy (from any other peer the header is
ignored), must be in a configured trust domain, and must name the same
SPIFFE ID as the JWT-SVID, else 401 (:func:`gateway.identity.check_binding`,
see docs/identity.md).
"""

from __future__ import annotations

import ipaddress
import time

from starlette.requests import Request

from gateway.errors import GatewayError
from gateway.identity import (
    AuthenticationError,
    InvalidXfcc,
    JwtSvidVerifier,
    Reason,
    SpiffeId,
    WorkloadIdentity,
    check_binding,
    error_body,
    extract_bearer,
    forwarded_spiffe_id,
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
    ``trusted_proxies``: CIDRs of proxies whose forwarded client
    certificate is checked against the JWT-SVID (a binding check, never a
    credential). Raises :class:`GatewayError` (401/400/429/503).
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
        # 1. A JWT-SVID is always required, on every listener; a forwarded
        #    certificate never stands in for it (issue 10, finding 1).
        auths = request.headers.getlist("authorization")
        if len(auths) > 1:
            raise GatewayError(400, "malformed_authorization_header", "more than one Authorization header",
                               headers={"WWW-Authenticate": www_authenticate()}, outcome="unauthenticated")
        try:
            token = extract_bearer(auths[0] if auths else None)
        except AuthenticationError as err:
            raise auth_error(err) from None
        # 2. A certificate forwarded by a trusted proxy (cheap to parse, read
        #    before the signature is verified): its SPIFFE ID, to bind to.
        forwarded = self._forwarded(request, peer)
        # 3. The JWT-SVID, then the binding.
        try:
            identity = await self.verifier.verify(token)
            return check_binding(identity, forwarded)
        except AuthenticationError as err:
            raise auth_error(err) from None

    def _forwarded(self, request: Request, peer: str) -> SpiffeId | None:
        """The SPIFFE ID of a certificate forwarded by a trusted proxy, or ``None``.

        Ignored (``None``) from any other peer. Raises :class:`GatewayError`
        401 ``invalid_forwarded_certificate`` when a trusted proxy's header is
        unusable or names a trust domain this gateway does not accept.
        """
        if not self.trusted_proxies:
            return None
        xfcc_values = request.headers.getlist("x-forwarded-client-cert")
        if not xfcc_values:
            return None
        try:
            return forwarded_spiffe_id(xfcc_values, peer, self.trusted_proxies,
                                       trust_domains=self.verifier.trust_domains)
        except InvalidXfcc as exc:
            raise auth_error(AuthenticationError(Reason.INVALID_FORWARDED_CERT, str(exc))) from None
