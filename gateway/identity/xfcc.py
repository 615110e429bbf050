"""The client certificate of an mTLS connection terminated by a trusted proxy.

A forwarded certificate is never an identity on its own: the gateway always
requires a JWT-SVID, and uses the forwarded certificate's SPIFFE ID only to
bind that bearer token to the connection (:func:`check_binding`). Trusting
the header alone would make any process that can reach the listener from a
"trusted proxy" address an operator (issue 10, finding 1).

Envoy forwards the verified client certificate in ``x-forwarded-client-cert``
(XFCC; Envoy docs, "HTTP header manipulation"): elements separated by ``,``,
each a list of ``Key=Value`` pairs separated by ``;``; a value holding ``,``,
``;`` or ``=`` is double-quoted and a ``"`` inside is escaped as ``\\"``.
Keys: ``By``, ``Hash``, ``Cert``, ``Chain``, ``Subject``, ``URI`` (may repeat),
``DNS`` (may repeat). Each proxy hop appends one element, so only the LAST
element, added by the proxy that is our direct socket peer, is trusted.

An X509-SVID carries exactly one URI SAN, the SPIFFE ID (X509-SVID spec 2).
"""

from __future__ import annotations

import ipaddress
import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from .bearer import AuthenticationError, Reason
from .spiffe_id import InvalidSpiffeId, SpiffeId, WorkloadIdentity, parse_spiffe_id

log = logging.getLogger(__name__)

IpNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network
#: Largest XFCC header (all lines joined) accepted, in bytes.
MAX_XFCC_BYTES = 64 * 1024


class InvalidXfcc(ValueError):
    """A trusted proxy sent an XFCC header that cannot be used (bad syntax,
    several SPIFFE URI SANs, invalid SPIFFE ID, foreign trust domain). The
    request must be refused (fail closed), not treated as anonymous."""


@dataclass(frozen=True, slots=True)
class XfccElement:
    """One XFCC element: ordered ``(key, value)`` pairs, values unquoted."""

    pairs: tuple[tuple[str, str], ...]

    def get_all(self, key: str) -> list[str]:
        """Every value of ``key`` (case-insensitive), in order."""
        k = key.lower()
        return [v for kk, v in self.pairs if kk.lower() == k]


def _split_top(s: str, sep: str) -> list[str]:
    """Split on ``sep`` outside double quotes; raises InvalidXfcc on an open quote."""
    out: list[str] = []
    buf: list[str] = []
    quoted = False
    i = 0
    while i < len(s):
        c = s[i]
        if quoted and c == "\\" and i + 1 < len(s):
            buf.append(s[i : i + 2])
            i += 2
            continue
        if c == '"':
            quoted = not quoted
        elif c == sep and not quoted:
            out.append("".join(buf))
            buf = []
            i += 1
            continue
        buf.append(c)
        i += 1
    if quoted:
        raise InvalidXfcc("unterminated quoted value in x-forwarded-client-cert")
    out.append("".join(buf))
    return out


def _unquote(v: str) -> str:
    v = v.strip()
    if len(v) >= 2 and v[0] == '"' and v[-1] == '"':
        inner = v[1:-1]
        out: list[str] = []
        i = 0
        while i < len(inner):
            if inner[i] == "\\" and i + 1 < len(inner):
                out.append(inner[i + 1])
                i += 2
            else:
                out.append(inner[i])
                i += 1
        return "".join(out)
    if '"' in v:
        raise InvalidXfcc("stray double quote in x-forwarded-client-cert value")
    return v


def parse_xfcc(header: str) -> list[XfccElement]:
    """Parse an XFCC header value into its elements (first hop first).

    Raises :class:`InvalidXfcc` on unterminated quotes, a pair without ``=``,
    an empty key, or a header over 64 KiB. Empty elements are skipped.
    """
    if len(header.encode("utf-8", "surrogatepass")) > MAX_XFCC_BYTES:
        raise InvalidXfcc("x-forwarded-client-cert larger than 64 KiB")
    elements: list[XfccElement] = []
    for raw_el in _split_top(header, ","):
        if not raw_el.strip():
            continue
        pairs: list[tuple[str, str]] = []
        for raw_pair in _split_top(raw_el, ";"):
            if not raw_pair.strip():
                continue
            key, eq, value = raw_pair.partition("=")
            key = key.strip()
            if not eq or not key or '"' in key:
                raise InvalidXfcc("x-forwarded-client-cert pair is not Key=Value")
            pairs.append((key, _unquote(value)))
        if pairs:
            elements.append(XfccElement(tuple(pairs)))
    return elements


def _peer_trusted(peer_ip: str | None, trusted_proxies: Iterable[IpNetwork]) -> bool:
    if not peer_ip:
        return False
    try:
        addr = ipaddress.ip_address(peer_ip.split("%", 1)[0])
    except ValueError:
        return False
    if isinstance(addr, ipaddress.IPv6Address) and addr.ipv4_mapped is not None:
        addr = addr.ipv4_mapped
    return any(addr.version == net.version and addr in net for net in trusted_proxies)


def forwarded_spiffe_id(
    header_values: Sequence[str],
    peer_ip: str | None,
    trusted_proxies: Iterable[IpNetwork],
    *,
    trust_domains: Iterable[str],
) -> SpiffeId | None:
    """The SPIFFE ID of a client certificate forwarded by a trusted proxy.

    This is NOT an identity: a forwarded certificate never authenticates a
    request on its own (docs/identity.md). The caller uses the result only
    as a binding check on an already verified JWT-SVID
    (:func:`check_binding`).

    ``header_values``: every ``x-forwarded-client-cert`` header line, in
    order; ``peer_ip``: the socket peer address (never X-Forwarded-For);
    ``trusted_proxies``: networks of proxies allowed to assert XFCC;
    ``trust_domains``: the SPIFFE ID must belong to one of them (required).

    Returns ``None`` when there is no header, the peer is not a trusted proxy
    (the header is then ignored entirely: it can neither grant nor change an
    identity), or the last element has no ``spiffe://`` URI SAN. Raises
    :class:`InvalidXfcc` when a trusted proxy's header is malformed, its last
    element holds several SPIFFE URIs, the URI is not a valid SPIFFE ID, or
    its trust domain is not one of ``trust_domains``.
    """
    if not header_values or not any(v.strip() for v in header_values):
        return None
    if not _peer_trusted(peer_ip, trusted_proxies):
        log.debug("ignoring x-forwarded-client-cert from untrusted peer")
        return None
    elements = parse_xfcc(",".join(header_values))
    if not elements:
        return None
    last = elements[-1]
    uris = [u for u in last.get_all("URI") if u.lower().startswith("spiffe://")]
    if not uris:
        return None
    if len(uris) > 1:
        raise InvalidXfcc("forwarded certificate has more than one SPIFFE URI SAN")
    try:
        sid = parse_spiffe_id(uris[0])
    except InvalidSpiffeId as e:
        raise InvalidXfcc(f"forwarded certificate URI SAN is not a valid SPIFFE ID ({e.reason})") from None
    if sid.trust_domain not in frozenset(trust_domains):
        raise InvalidXfcc("forwarded certificate is from a trust domain this gateway does not accept")
    return sid


def check_binding(identity: WorkloadIdentity, forwarded: SpiffeId | None) -> WorkloadIdentity:
    """Bind a verified JWT-SVID identity to the forwarded client certificate.

    ``identity``: the workload authenticated by its JWT-SVID (required: there
    is no identity without one); ``forwarded``: the SPIFFE ID from
    :func:`forwarded_spiffe_id`, or ``None`` when no trusted proxy forwarded
    a certificate. Returns ``identity`` unchanged when ``forwarded`` is
    ``None`` or names the same SPIFFE ID; raises
    :class:`AuthenticationError` ``identity_mismatch`` (401) otherwise.
    """
    if forwarded is not None and forwarded != identity.spiffe_id:
        raise AuthenticationError(
            Reason.IDENTITY_MISMATCH,
            "JWT-SVID subject and forwarded client certificate name different workloads",
        )
    return identity
