"""Workload authentication: SPIFFE IDs, trust bundles, JWT-SVIDs; a forwarded X.509-SVID only as a binding check.

The gateway builds a :class:`TrustBundleStore` (file or HTTPS source per trust
domain), a :class:`JwtSvidVerifier`, and calls ``await verifier.verify(token)``
for every request (a token verified before is answered from the verifier's
:class:`VerifiedTokenCache`); see docs/identity.md.
"""

from __future__ import annotations

from .bundle import TrustBundleStore
from .bundle_parse import (
    ALLOWED_ALGORITHMS,
    BundleError,
    BundleKey,
    BundleUnavailable,
    TrustBundle,
    UnknownTrustDomain,
    parse_bundle,
)
from .bundle_sources import FileBundleSource, HttpsBundleSource, StaticBundleSource, TrustBundleSource
from .bearer import AuthenticationError, Reason, error_body, extract_bearer, www_authenticate
from .jws_compact import canonical_token_sha256
from .jwtsvid import JwtSvidVerifier
from .forwarded import attested_client
from .spiffe_id import InvalidSpiffeId, SpiffeId, WorkloadIdentity, parse_spiffe_id, parse_trust_domain
from .token_cache import VerifiedTokenCache
from .xfcc import InvalidXfcc, check_binding, forwarded_spiffe_id, parse_xfcc

__all__ = [
    "ALLOWED_ALGORITHMS",
    "AuthenticationError",
    "BundleError",
    "BundleKey",
    "BundleUnavailable",
    "FileBundleSource",
    "HttpsBundleSource",
    "InvalidSpiffeId",
    "InvalidXfcc",
    "JwtSvidVerifier",
    "Reason",
    "SpiffeId",
    "StaticBundleSource",
    "TrustBundle",
    "TrustBundleSource",
    "TrustBundleStore",
    "UnknownTrustDomain",
    "VerifiedTokenCache",
    "WorkloadIdentity",
    "attested_client",
    "canonical_token_sha256",
    "check_binding",
    "error_body",
    "extract_bearer",
    "forwarded_spiffe_id",
    "parse_bundle",
    "parse_spiffe_id",
    "parse_xfcc",
    "parse_trust_domain",
    "www_authenticate",
]
