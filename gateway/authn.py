"""Pipeline step 1: who is calling (the PEP side of authentication).

Order of checks, cheapest first (issue 12, finding 1):

1. the source: the socket peer, or behind a trusted proxy the client address
   the proxy attests in ``X-Forwarded-For`` (:func:`gateway.identity.attested_client`);
2. the ``Authorization: Bearer`` JWT-SVID, verified by
   :meth:`gateway.identity.JwtSvidVerifier.verify`: malformed tokens, unknown
   ``kid``s, tokens expired (or not yet valid, too long-lived, for another
   audience) by their claims are refused without any signature work and
   never count against anyone; a token already verified for this listener's
   audience is accepted from the verified-token cache, also at a blocked
   source; only a token that needs a signature check meets the per-source
   budget (:class:`tenancy.source_limits.SourceLimiter`): a source whose failed
   signature checks exhausted its bucket gets 429 ``too_many_unauthenticated``
   instead of a signature check, and only a failed signature check takes from
   the bucket;
3. the binding to a certificate forwarded by a trusted proxy;
4. (session 7, R6-4) when the listener says who counts (``mapped``: a tenant's workload on the
   public listener, an operator on the admin one), a valid identity it does not map costs one unit
   of a second per-source bucket (``identity.unmapped_rps`` / ``unmapped_burst``, its own
   :class:`tenancy.source_limits.SourceLimiter`); a source that spent it gets 429
   ``too_many_unmapped`` with ``Retry-After`` instead of the 403 its caller would answer.
   Before, such requests (0.11 ms each) had no budget at all, while every tenant has a rate.
   Mapped identities never touch the bucket (one memoised registry lookup).

The JWT-SVID is required on every listener. An X.509-SVID forwarded in
``x-forwarded-client-cert`` is never an identity: it is read only when the
socket peer is a configured trusted proxy (from any other peer the header is
ignored), must be in a configured trust domain, and must name the same
SPIFFE ID as the JWT-SVID, else 401 (:func:`gateway.identity.check_binding`,
see docs/identity.md).
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable

from starlette.requests import Request

from gateway.config_identity import trusted_proxy_network
from gateway.errors import GatewayError
from tenancy.limits import RateLimited
from gateway.identity import (
    AuthenticationError,
    InvalidXfcc,
    JwtSvidVerifier,
    Reason,
    SpiffeId,
    WorkloadIdentity,
    attested_client,
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

    ``verifier``: the JWT-SVID verifier of this listener's audience (it holds
    this listener's verified-token cache); ``source_limiter``: a
    :class:`tenancy.source_limits.SourceLimiter` budget of failed signature checks
    per source (or ``None``); ``trusted_proxies``: CIDRs of proxies whose
    ``X-Forwarded-For`` names the source and whose forwarded client
    certificate is checked against the JWT-SVID (a binding check, never a
    credential); ``unmapped_limiter`` and ``mapped`` (SPIFFE ID string -> a true value when the listener
    serves it, e.g. the public listener's tenant, else a false one; may be set later, e.g. once the registry
    exists): the budget of valid identities the listener does not serve, per source (step 4 above; either
    ``None``: no budget). :meth:`authenticate_now` hands the true value on (session 19).
    Raises :class:`GatewayError` (401/400/429/503).
    """

    def __init__(
        self,
        verifier: JwtSvidVerifier,
        source_limiter: object | None = None,
        trusted_proxies: list[str] | None = None,
        unmapped_limiter: object | None = None,
        mapped: Callable[[str], object] | None = None,
    ) -> None:
        self.verifier = verifier
        self.source_limiter = source_limiter
        self.trusted_proxies = [trusted_proxy_network(p) for p in (trusted_proxies or [])]  # S17-3: strict
        self.unmapped_limiter = unmapped_limiter
        self.mapped = mapped

    def source(self, request: Request) -> str:
        """The address ``request`` is attributed to (limits, audit): the socket
        peer, or the client a trusted proxy attests (:func:`attested_client`)."""
        if not self.trusted_proxies:  # = _source's first case, without its call (session 15) nor _peer's (17)
            client = request.scope.get("client")
            return (client[0] if client else None) or "unknown"
        return self._source(request, _peer(request))

    def _source(self, request: Request, peer: str | None) -> str:
        if not self.trusted_proxies:
            return peer or "unknown"
        return attested_client(peer, request.headers.getlist("x-forwarded-for"), self.trusted_proxies)

    def authenticate_now(self, request: Request, source: str) -> tuple[WorkloadIdentity, object] | Awaitable[
            WorkloadIdentity]:
        """``(identity, found)`` at once on a verified-token cache hit, else the awaitable of
        :meth:`authenticate` (the full check; await it: the identity). ``source``: :meth:`source` of ``request``.
        ``found``: what ``mapped`` answered for the identity (the public listener's: its tenant, or None), None
        without the unmapped-identity budget (session 19: the caller need not resolve the SPIFFE ID again).

        Issue 14, session 16: the common request (one ``Authorization`` header, no trusted proxy, a token
        verified before) builds no coroutine and reads the header from the ASGI scope in one pass. Every
        check of :meth:`authenticate` still runs on the hit: the bearer shape
        (:func:`extract_bearer`), :meth:`JwtSvidVerifier.verify_cached` (time claims against now, the
        trust domain's current bundle holding the ``kid``, the entry under the current keys version)
        and the unmapped-identity budget (step 4). The forwarded-certificate binding has nothing to
        bind without a trusted proxy (:meth:`_forwarded` answers ``None``), so with trusted proxies, or
        for anything else (no or several headers, a refusal, a miss), :meth:`authenticate` decides and
        answers exactly as before. Raises :class:`GatewayError` only from step 4 (429 ``too_many_unmapped``).
        """
        if self.trusted_proxies:
            return self.authenticate(request, source)
        value = None
        for k, v in request.scope["headers"]:  # = headers.getlist("authorization"), one pass, no Headers object
            if k == b"authorization":
                if value is not None:  # several: authenticate answers 400
                    return self.authenticate(request, source)
                value = v
        try:
            identity = self.verifier.verify_cached(extract_bearer(None if value is None else value.decode("latin-1")))
        except AuthenticationError:  # the same refusal, from the full check (its reason, its charge)
            return self.authenticate(request, source)
        if identity is None:
            return self.authenticate(request, source)
        mapped = self.mapped
        if mapped is None or self.unmapped_limiter is None:
            return identity, None
        if not (found := mapped(identity.spiffe_id.uri)):
            self._charge_unmapped(source)
        return identity, found

    async def authenticate(self, request: Request, source: str | None = None) -> WorkloadIdentity:
        """Return the caller's identity or raise :class:`GatewayError`. ``source``: :meth:`source` of
        ``request`` when the caller has it already (the pipeline's record: not worked out twice)."""
        if source is None:
            source = self.source(request)
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
        forwarded = self._forwarded(request)
        # 3. The JWT-SVID (cheap refusals, then the cache, then the per-source
        #    budget and the signature), then the binding.
        try:  # a verified-token cache hit without a coroutine or closure (session 13), else the full check
            identity = self.verifier.verify_cached(token)
            if identity is None:
                identity = await self.verifier.verify(token, before_signature=lambda: self._admit_signature(source))
        except AuthenticationError as err:
            if err.signature_checked and self.source_limiter is not None:
                self.source_limiter.charge_failure(source, time.monotonic())  # type: ignore[attr-defined]
            raise auth_error(err) from None
        try:
            identity = check_binding(identity, forwarded)
        except AuthenticationError as err:
            raise auth_error(err) from None
        mapped = self.mapped
        if mapped is not None and self.unmapped_limiter is not None and not mapped(identity.spiffe_id.uri):
            self._charge_unmapped(source)
        return identity

    def _charge_unmapped(self, source: str) -> None:
        """Take one unit of ``source``'s budget of unmapped identities; raise 429
        ``too_many_unmapped`` (``Retry-After``) when it is spent."""
        try:
            self.unmapped_limiter.check(source, time.monotonic())  # type: ignore[union-attr]
        except RateLimited as exc:
            raise GatewayError(
                429, "too_many_unmapped", "too many requests from this source by identities not served here",
                headers={"Retry-After": exc.retry_after_header},
                outcome="rate_limited",
            ) from None

    def _admit_signature(self, source: str) -> None:
        """Raise 429 ``too_many_unauthenticated`` when ``source`` spent its budget
        of failed signature checks (called only before a signature check)."""
        if self.source_limiter is None:
            return
        wait = self.source_limiter.blocked(source, time.monotonic())  # type: ignore[attr-defined]
        if wait > 0:
            raise GatewayError(
                429, "too_many_unauthenticated", "too many failed authentications from this source",
                headers={"Retry-After": str(max(1, int(wait + 0.999)))},
                outcome="rate_limited",
            )

    def _forwarded(self, request: Request) -> SpiffeId | None:
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
            return forwarded_spiffe_id(xfcc_values, _peer(request) or "unknown", self.trusted_proxies,
                                       trust_domains=self.verifier.trust_domains)
        except InvalidXfcc as exc:
            raise auth_error(AuthenticationError(Reason.INVALID_FORWARDED_CERT, str(exc))) from None


def _peer(request: Request) -> str | None:
    """The socket peer's address (ASGI ``client``), or ``None`` when the server gives none."""
    client = request.scope.get("client")
    return client[0] if client else None
