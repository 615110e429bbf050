"""SPIFFE IDs and the authenticated workload identity.

The SPIFFE ID parser itself lives in :mod:`tenancy.spiffe_id` (one parser for
the gateway and the tenant registry, SPIFFE-ID spec sections 2.1-2.3); it is
re-exported here. This module adds :class:`WorkloadIdentity`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Literal

from tenancy.spiffe_id import (
    MAX_SPIFFE_ID_BYTES,
    MAX_TRUST_DOMAIN_CHARS,
    SCHEME_PREFIX,
    InvalidSpiffeId,
    SpiffeId,
    parse_spiffe_id,
    parse_trust_domain,
)

__all__ = [
    "MAX_SPIFFE_ID_BYTES",
    "MAX_TRUST_DOMAIN_CHARS",
    "SCHEME_PREFIX",
    "IdentitySource",
    "InvalidSpiffeId",
    "SpiffeId",
    "WorkloadIdentity",
    "parse_spiffe_id",
    "parse_trust_domain",
]


#: How a workload was authenticated. Only a verified JWT-SVID authenticates;
#: a forwarded client certificate is a binding check, never a source.
IdentitySource = Literal["jwt-svid"]


@dataclass(frozen=True, slots=True)
class WorkloadIdentity:
    """An authenticated workload.

    ``spiffe_id``: the verified SPIFFE ID; ``trust_domain``: its trust domain
    name; ``claims``: read-only verified JWT claims; ``source``: how it was
    authenticated (always ``"jwt-svid"``); ``kid``: the bundle key id that
    verified the JWT-SVID;
    ``expires_at``: the credential expiry in Unix seconds when known.
    """

    spiffe_id: SpiffeId
    trust_domain: str
    claims: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}))
    source: IdentitySource = "jwt-svid"
    kid: str | None = None
    expires_at: float | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.claims, MappingProxyType):
            object.__setattr__(self, "claims", MappingProxyType(dict(self.claims)))
