"""The authentication section of the configuration: JWT-SVID audiences, trust domains and their bundles, proxies."""

from __future__ import annotations

import ipaddress

from pydantic import Field, field_validator, model_validator

from gateway.config_base import ConfigSection


def trusted_proxy_network(p: str) -> ipaddress.IPv4Network | ipaddress.IPv6Network:
    """One ``identity.trusted_proxies`` entry as a network, parsed strictly (session 17, S17-3).

    An address (``10.1.2.3``) is its /32 or /128; a network must be written with its host bits
    clear (``ip_network(strict=True)``: ``10.1.2.3/8`` is a mistake, never silently widened to
    ``10.0.0.0/8``), and a prefix length 0 (``0.0.0.0/0``, ``::/0``) is refused: every peer would be
    a trusted proxy, so every client would choose its own source address by writing
    ``X-Forwarded-For`` (per-source budgets, audit ``client_address``) and its XFCC would be read.
    Used by the config validator and :class:`gateway.authn.Authenticator` alike.

    Raises:
        ValueError: not an IP network, host bits set, or prefix length 0; the message names the field.
    """
    try:
        net = ipaddress.ip_network(p, strict=True)
    except ValueError as exc:
        if "has host bits set" in str(exc):
            raise ValueError(f"identity.trusted_proxies: {p!r} has host bits set (write the network, e.g. "
                             f"{ipaddress.ip_network(p, strict=False)}, or the address alone)") from None
        raise ValueError(f"identity.trusted_proxies: {p!r} is not an IP network (CIDR)") from None
    if net.prefixlen == 0:
        raise ValueError(f"identity.trusted_proxies: {p!r} trusts every peer as a proxy (prefix length 0); "
                         f"list the proxies' own addresses or networks")
    return net


class TrustDomainConfig(ConfigSection):
    """Where a trust domain's bundle (JWKS) comes from: a file or an HTTPS URL."""

    bundle_file: str | None = None
    bundle_url: str | None = None
    refresh_s: float = Field(300.0, gt=0)
    max_stale_s: float = Field(3600.0, gt=0)

    @model_validator(mode="after")
    def _one_source(self) -> "TrustDomainConfig":
        if bool(self.bundle_file) == bool(self.bundle_url):
            raise ValueError("give exactly one of bundle_file or bundle_url")
        return self


class IdentityConfig(ConfigSection):
    """JWT-SVID authentication (SPIFFE JWT-SVID spec).

    Every request on both listeners needs a JWT-SVID whose ``aud`` holds the
    listener's audience. ``audience`` and ``admin_audience`` must be
    non-empty, without surrounding whitespace, and different from each other
    (else a public token would open the admin listener). ``trusted_proxies``
    (CIDRs) enables two things only: the binding check of a forwarded client
    certificate against the JWT-SVID, and reading the client address the
    proxy attests in ``X-Forwarded-For`` as the request's source; there is
    deliberately no setting under which a forwarded certificate alone
    authenticates, and any unknown key (e.g. an "xfcc only" mode) is refused
    (``extra="forbid"``). ``unauthenticated_rps``/``unauthenticated_burst``:
    per-source bucket of failed signature checks (a source that spent it gets
    429 instead of a signature check; cheap refusals and cached tokens never
    touch it). ``unmapped_rps``/``unmapped_burst``: per-source bucket of requests whose valid
    identity the listener does not serve (no tenant on the public listener, not an operator on the
    admin one); a source that spent it gets 429 ``too_many_unmapped`` instead of the 403 (R6-4).
    ``verified_token_cache_size``/``verified_token_cache_max_ttl_s``:
    bounds of each listener's verified-token cache (docs/identity.md).
    """

    audience: str = "prefixgate"
    admin_audience: str = "prefixgate-admin"
    trust_domains: dict[str, TrustDomainConfig] = Field(default_factory=dict)
    leeway_s: float = Field(30.0, ge=0, le=300)
    max_lifetime_s: float = Field(3600.0, gt=0)
    trusted_proxies: list[str] = Field(default_factory=list)
    #: per-source budget of FAILED SIGNATURE CHECKS (per listener): rate /s, burst
    unauthenticated_rps: float = Field(1000.0, gt=0)
    unauthenticated_burst: int = Field(2000, ge=1)
    #: per-source budget of requests by valid identities not served (per listener): rate /s, burst
    unmapped_rps: float = Field(10.0, gt=0)
    unmapped_burst: int = Field(50, ge=1)
    #: verified-token cache per listener and audience: entries (0: off), lifetime cap (s)
    verified_token_cache_size: int = Field(10_000, ge=0)
    verified_token_cache_max_ttl_s: float = Field(300.0, gt=0)

    @field_validator("audience", "admin_audience")
    @classmethod
    def _audience(cls, v: str) -> str:
        if not v.strip():
            raise ValueError("must be a non-empty audience (an empty or blank one would match no token)")
        if v != v.strip() or any(ord(c) < 0x20 or ord(c) == 0x7F for c in v):
            raise ValueError("must not start or end with whitespace nor hold control characters")
        return v

    @field_validator("trusted_proxies")
    @classmethod
    def _proxies(cls, v: list[str]) -> list[str]:
        for p in v:
            trusted_proxy_network(p)
        return v

    @model_validator(mode="after")
    def _distinct_audiences(self) -> "IdentityConfig":
        if self.audience == self.admin_audience:
            raise ValueError("audience and admin_audience must differ "
                             "(a public token must not open the admin listener)")
        return self
