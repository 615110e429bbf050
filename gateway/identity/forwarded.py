"""The client address a request is attributed to (per-source limits, audit).

Without a trusted proxy in front, the source of a request is its socket peer.
Behind one (``identity.trusted_proxies``), the peer is the proxy, and every
client behind it would share one source; the source is then the client
address the proxy chain attests in ``X-Forwarded-For`` (RFC 7239 section 5.2
is the standardised ``Forwarded`` form; proxies such as Envoy write the de
facto ``X-Forwarded-For``, and only that header is read):

* the peer is not a trusted proxy: the peer, and ``X-Forwarded-For`` is
  ignored (anyone can write it);
* the peer is a trusted proxy: the header's entries are walked from the
  right (each proxy appends the address it received the request from), and
  every entry that is itself a trusted proxy is skipped; the first one that
  is not is the client. This is Envoy's ``xff_num_trusted_hops`` with the
  number of trusted hops given as address ranges (Envoy's ``xff_trusted_cidrs``
  original-IP detection, nginx ``real_ip_recursive``): entries left of the
  client were written by the client and are never read, so a client cannot
  choose its own source;
* every entry is a trusted proxy: the left-most entry (the chain attests it);
* a trusted proxy sent no ``X-Forwarded-For``: the proxy itself (it attested
  nobody, e.g. its own health checks; configure the proxy to append the
  header, as Envoy does with ``use_remote_address: true``);
* the entry where the walk stops is not an IP address (``unknown``, an
  obfuscated RFC 7239 node, garbage): ``"unattested@<proxy>"``, one source
  per proxy for everything it could not attest, never the proxy's own key.

Entries may carry a port (``203.0.113.7:4711``, ``[2001:db8::1]:4711``); an
IPv4-mapped IPv6 address becomes the IPv4 address. At most
:data:`MAX_HOPS` entries are read from the right.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable, Sequence

__all__ = ["attested_client", "MAX_HOPS"]

IpNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network
IpAddress = ipaddress.IPv4Address | ipaddress.IPv6Address

#: Entries of X-Forwarded-For examined, from the right.
MAX_HOPS = 32


def _parse_ip(text: str) -> IpAddress | None:
    s = text.strip()
    if not s:
        return None
    if s.startswith("["):  # [v6] or [v6]:port
        end = s.find("]")
        if end < 0:
            return None
        s = s[1:end]
    elif s.count(":") == 1:  # v4:port
        s = s.split(":", 1)[0]
    s = s.split("%", 1)[0]  # an IPv6 zone index never names another host
    try:
        ip = ipaddress.ip_address(s)
    except ValueError:
        return None
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        return ip.ipv4_mapped
    return ip


def _trusted(ip: IpAddress, trusted_proxies: Sequence[IpNetwork]) -> bool:
    return any(ip.version == net.version and ip in net for net in trusted_proxies)


def attested_client(peer: str | None, xff_values: Iterable[str], trusted_proxies: Sequence[IpNetwork]) -> str:
    """The source address of a request (see the module doc for the rules).

    ``peer``: the socket peer address (``None``/unparsable: ``"unknown"`` or
    the text as is); ``xff_values``: every ``X-Forwarded-For`` header line in
    order; ``trusted_proxies``: networks of trusted proxies. Returns an
    address string (or ``"unattested@<proxy>"``); never raises.
    """
    if peer is None:
        return "unknown"
    peer_ip = _parse_ip(peer)
    if peer_ip is None or not trusted_proxies or not _trusted(peer_ip, trusted_proxies):
        return peer if peer_ip is None else str(peer_ip)
    joined = ",".join(v for v in xff_values if v is not None)
    if not joined.strip():
        return str(peer_ip)
    hops = joined.rsplit(",", MAX_HOPS)
    if len(hops) > MAX_HOPS:  # the left-most element holds whatever is beyond the bound
        hops = hops[1:]
    last: IpAddress | None = None
    for raw in reversed(hops):
        ip = _parse_ip(raw)
        if ip is None:
            if not raw.strip():  # an empty list element (", ,") names nobody
                continue
            return f"unattested@{peer_ip}"
        if not _trusted(ip, trusted_proxies):
            return str(ip)
        last = ip
    return str(last) if last is not None else str(peer_ip)
