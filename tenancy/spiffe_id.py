"""SPIFFE IDs: the one parser the gateway and the tenant registry share.

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

This module lives in ``tenancy`` (a leaf package: it imports nothing of the
project) so that the tenant registry can use it without importing
``gateway``; ``gateway.identity`` re-exports it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

__all__ = [
    "MAX_SPIFFE_ID_BYTES",
    "MAX_TRUST_DOMAIN_CHARS",
    "SCHEME_PREFIX",
    "InvalidSpiffeId",
    "SpiffeId",
    "is_valid_spiffe_id",
    "parse_spiffe_id",
    "parse_spiffe_id_rule",
    "parse_trust_domain",
]

SCHEME_PREFIX = "spiffe://"
#: Maximum length of a SPIFFE ID in bytes (SPIFFE-ID spec 2.3).
MAX_SPIFFE_ID_BYTES = 2048
#: Maximum length of a trust domain name in characters (SPIFFE-ID spec 2.1).
MAX_TRUST_DOMAIN_CHARS = 255

# fullmatch only: ``re.match`` with ``$`` would accept a trailing newline.
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
    #: the canonical ``spiffe://`` URI string, built once (session 13, issue 14: one string object keeps its
    #: hash for the registry, the decision-cache key and the audit record; session 16: an attribute, read
    #: on the request path without the ``__str__`` call)
    uri: str = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "uri", f"{SCHEME_PREFIX}{self.trust_domain}{self.path}")

    def __str__(self) -> str:
        return self.uri

    @property
    def segments(self) -> tuple[str, ...]:
        """The path segments (``("ns", "prod")``); ``()`` for an empty path."""
        return tuple(self.path[1:].split("/")) if self.path else ()


def parse_spiffe_id(s: str) -> SpiffeId:
    """Parse and validate a SPIFFE ID string.

    Returns ``SpiffeId(trust_domain, path)``. Raises :class:`InvalidSpiffeId`
    (with a ``reason`` tag) for any violation of the SPIFFE-ID spec rules
    listed in the module docstring, and for a value that is not a ``str``.
    Never normalises: an ID that would need normalisation (uppercase domain,
    dot segments, trailing slash, percent escapes) is refused, so one identity
    has exactly one spelling.
    """
    if not isinstance(s, str):
        raise InvalidSpiffeId("type", "SPIFFE ID must be a string")
    if not s:
        raise InvalidSpiffeId("empty", "SPIFFE ID is empty")
    if len(s.encode("utf-8", "surrogatepass")) > MAX_SPIFFE_ID_BYTES:
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
        for seg in path[1:].split("/"):
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


def parse_spiffe_id_rule(s: str) -> tuple[SpiffeId, bool]:
    """Parse a configuration rule: an exact SPIFFE ID or a prefix ending in ``/``.

    Returns ``(id, is_prefix)``. A prefix rule is a valid SPIFFE ID followed
    by exactly one ``/`` (``spiffe://td/ns/a/`` -> ``(SpiffeId("td",
    "/ns/a"), True)``; ``spiffe://td/`` covers the whole trust domain). The
    whole rule, slash included, is at most 2048 bytes. Raises
    :class:`InvalidSpiffeId` exactly as :func:`parse_spiffe_id` does.
    """
    if isinstance(s, str) and s.endswith("/"):
        if len(s.encode("utf-8", "surrogatepass")) > MAX_SPIFFE_ID_BYTES:
            raise InvalidSpiffeId("too_long", "SPIFFE ID longer than 2048 bytes")
        return parse_spiffe_id(s[:-1]), True
    return parse_spiffe_id(s), False


def is_valid_spiffe_id(value: object) -> bool:
    """True when ``value`` is a valid SPIFFE ID string (exact form, no prefix rule)."""
    try:
        parse_spiffe_id(value)  # type: ignore[arg-type]
    except InvalidSpiffeId:
        return False
    return True
