"""Session 17, helper attack: the trusted-proxy path (``identity.trusted_proxies``, gateway/authn.py
``source``, gateway/identity/forwarded.py ``attested_client``).

What held (pure rules, beside the live probes in /work/notes/s17-register-attack.md): several
``X-Forwarded-For`` fields are one list; odd spellings of the field name are not read; IPv6 with and
without brackets, zone ids and IPv4-mapped forms name one address; a client-written entry never
becomes the source; an untrusted peer's header is ignored.

S17-3 (an operator's honest mistake): ``trusted_proxies`` accepts a network that trusts every peer
(``0.0.0.0/0``, ``::/0``) and silently widens an address written with a prefix length
(``10.1.2.3/8`` -> ``10.0.0.0/8``: ``ip_network(strict=False)``): every client then chooses its own source
(per-source budgets, audit ``client_address``) by writing ``X-Forwarded-For``.
"""
from __future__ import annotations

import ipaddress

import pytest

from gateway.config import ConfigError, load_config
from gateway.identity import attested_client

NETS = [ipaddress.ip_network("127.0.0.2/32"), ipaddress.ip_network("fd00::/8")]
PROXY = "127.0.0.2"


@pytest.mark.parametrize(("peer", "values", "source"), [
    # an untrusted peer writes anything: its own address
    ("127.0.0.1", ["198.51.100.7"], "127.0.0.1"),
    ("127.0.0.1", ["198.51.100.7", "198.51.100.8"], "127.0.0.1"),
    # several fields are one comma list, read from the right
    (PROXY, ["203.0.113.5", "198.51.100.7"], "198.51.100.7"),
    (PROXY, ["203.0.113.5, 198.51.100.7", ""], "198.51.100.7"),
    # a client-written entry left of the proxy's, whatever it claims (a trusted proxy, loopback)
    (PROXY, ["127.0.0.2, 198.51.100.7"], "198.51.100.7"),
    (PROXY, ["fd00::1, 198.51.100.7"], "198.51.100.7"),
    # IPv6 spellings of one client: the same source
    (PROXY, ["2001:db8::1"], "2001:db8::1"),
    (PROXY, ["[2001:db8::1]:443"], "2001:db8::1"),
    (PROXY, ["2001:DB8:0:0::1"], "2001:db8::1"),
    (PROXY, ["[2001:db8::1%eth0]:443"], "2001:db8::1"),
    (PROXY, ["::ffff:198.51.100.7"], "198.51.100.7"),
    (PROXY, ["[::ffff:c633:6407]:1"], "198.51.100.7"),
    # an entry where the walk stops that is no address: one bucket per proxy, never the proxy itself
    (PROXY, ["198.51.100.7, 010.0.0.1"], f"unattested@{PROXY}"),
    (PROXY, ['198.51.100.7, for="[2001:db8::1]"'], f"unattested@{PROXY}"),
    (PROXY, ["198.51.100.7 203.0.113.5"], f"unattested@{PROXY}"),
    # a trusted IPv6 proxy hop behind the first proxy is skipped
    (PROXY, ["198.51.100.7, [fd00::5]:80"], "198.51.100.7"),
])
def test_attested_source_rules(peer: str, values: list[str], source: str) -> None:
    assert attested_client(peer, values, NETS) == source


@pytest.mark.parametrize("net", ["10.1.2.3/32", "192.0.2.0/24", "2001:db8::/64", "127.0.0.1"])
def test_ordinary_proxy_networks_load(net: str) -> None:
    assert load_config(None, {"identity": {"trusted_proxies": [net]}}).identity.trusted_proxies == [net]


@pytest.mark.parametrize("net", ["0.0.0.0/0", "::/0", "10.1.2.3/8"])
def test_a_proxy_network_that_trusts_everyone_or_widens_is_refused(net: str) -> None:
    with pytest.raises(ConfigError):
        load_config(None, {"identity": {"trusted_proxies": [net]}})


def test_the_authenticator_parses_proxies_as_the_config_does() -> None:
    """Session 17, helper secfix (S17-3): the same strict rule where the networks are used."""
    from gateway.authn import Authenticator

    assert [str(n) for n in Authenticator(None, trusted_proxies=["10.1.2.3", "10.0.0.0/8"]).trusted_proxies] == [
        "10.1.2.3/32", "10.0.0.0/8"]
    for bad in ("10.1.2.3/8", "0.0.0.0/0", "::/0"):
        with pytest.raises(ValueError, match="identity.trusted_proxies"):
            Authenticator(None, trusted_proxies=[bad])  # type: ignore[arg-type]
