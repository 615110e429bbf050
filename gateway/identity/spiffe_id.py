"""SPIFFE IDs and the authenticated workload identity.

Rules follow the SPIFFE-ID specification (spiffe/spiffe, standards/SPIFFE-ID.md,
sections 2.1-2.3): ``spiffe://<trust domain><path>``, where

* the scheme is exactly ``spiffe`` (lowercase);
* the trust domain is 1..255 characters of ``[a-z0-9.-_]`` (lowercase only);
  no userinfo, no port (a ``:`` or ``@`` is not a trust-domain character);
* the path is empty or ``/seg(/seg)*`` where each segment is non-empty, is
  not ``.`` or ``..`` and holds only ``[A-Za-z0-9.-_]`` (so no
  percent-encoding); no trailing slash;
* no query and no fragment;
* the whole ID is at most 2048 bytes.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Literal

SCHEME_PREFIX = "spiffe://"
#: Maximum length of a SPIFFE ID in bytes (SPIFFE-ID spec 2.3).
MAX_SPIFFE_ID_BYTES = 2048
#: Maximum length of a trust domain name in characters (SPIFFE-ID spec 2.1).
MAX_TRUST_DOMAIN_CHARS = 255

_TRUST_DOMAIN_RE = re.compile(r"[a-z0-9._-]+")
_SEGMENT_RE = re.compile(r"[A-Za-z0-9._-]+")


class InvalidSpiffeId(ValueError):
    """A string is not a valid SPIFFE ID or trust domain name.

    ``reason`` is a short machine-readable tag (e.g. ``"scheme"``,
    ``"trust_domain_char"``, ``"dot_segment"``) naming the rule that failed.
    """

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


def parse_trust_domain(name: str) -> str:
    """Validate a bare trust domain name (``example.org``) and return it.

    Raises :class:`InvalidSpiffeId` when empty, longer than 255 characters or
    holding any character outside ``[a-z0-9.-_]`` (uppercase included).
    """
    if not isinstance(name, str) or not name:
        raise InvalidSpiffeId("trust_domain_empty", "trust domain is empty")
    if len(name) > MAX_TRUST_DOMAIN_CHARS:
        raise InvalidSpiffeId("trust_domain_too_long", "trust domain longer than 255 characters")
    if not _TRUST_DOMAIN_RE.fullmatch(name):
        raise InvalidSpiffeId(
            "trust_domain_char",
            "trust domain may only hold lowercase letters, digits, '.', '-' and '_'",
        )
    return name


@dataclass(frozen=True, slots=True)
class SpiffeId:
    """A parsed SPIFFE ID.

    ``trust_domain`` is the bare name (``example.org``); ``path`` is ``""`` or
    starts with ``/`` (``/ns/prod/sa/billing``).
    """

    trust_domain: str
    path: str

    def __str__(self) -> str:
        return f"{SCHEME_PREFIX}{self.trust_domain}{self.path}"

    @property
    def uri(self) -> str:
        """The canonical ``spiffe://`` URI string."""
        return str(self)

    def member_of(self, trust_domain: str) -> bool:
        """True when this ID belongs to ``trust_domain``."""
        return self.trust_domain == trust_domain


def parse_spiffe_id(s: str) -> SpiffeId:
    """Parse and validate a SPIFFE ID string.

    Returns ``SpiffeId(trust_domain, path)``. Raises :class:`InvalidSpiffeId`
    (with a ``reason`` tag) for any violation of the SPIFFE-ID spec rules
    listed in the module docstring. Never normalises: an ID that would need
    normalisation (uppercase domain, dot segments, trailing slash, percent
    escapes) is refused, so one identity has exactly one spelling.
    """
    if not isinstance(s, str) or not s:
        raise InvalidSpiffeId("empty", "SPIFFE ID is empty")
    if len(s.encode("utf-8")) > MAX_SPIFFE_ID_BYTES:
        raise InvalidSpiffeId("too_long", "SPIFFE ID longer than 2048 bytes")
    if not s.startswith(SCHEME_PREFIX):
        raise InvalidSpiffeId("scheme", "SPIFFE ID must start with 'spiffe://'")
    rest = s[len(SCHEME_PREFIX):]
    if "?" in rest:
        raise InvalidSpiffeId("query", "SPIFFE ID must not have a query")
    if "#" in rest:
        raise InvalidSpiffeId("fragment", "SPIFFE ID must not have a fragment")
    slash = rest.find("/")
    authority, path = (rest, "") if slash < 0 else (rest[:slash], rest[slash:])
    if "@" in authority:
        raise InvalidSpiffeId("userinfo", "SPIFFE ID must not have userinfo")
    if ":" in authority:
        raise InvalidSpiffeId("port", "SPIFFE ID must not have a port")
    parse_trust_domain(authority)
    if path:
        segments = path[1:].split("/")
        for seg in segments:
            if seg == "":
                raise InvalidSpiffeId(
                    "empty_segment", "SPIFFE ID path has an empty segment or a trailing slash"
                )
            if seg in (".", ".."):
                raise InvalidSpiffeId("dot_segment", "SPIFFE ID path has a '.' or '..' segment")
            if not _SEGMENT_RE.fullmatch(seg):
                raise InvalidSpiffeId(
                    "path_char",
                    "SPIFFE ID path segments may only hold letters, digits, '.', '-' and '_'",
                )
    return SpiffeId(trust_domain=authority, path=path)


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
