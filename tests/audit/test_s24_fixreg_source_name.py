"""Session 24, S23-fixreg-2: a source that is not an IP address is not written as one.

The gateway attributes a request without a socket peer to ``unknown`` and a forwarded request from an
untrusted hop to ``unattested@<proxy>``; OCSF's ``src_endpoint.ip`` and CEF's ``src`` are IP address fields,
so such a source now goes to ``src_endpoint.name`` / CEF ``shost`` (an address still to ``ip`` / ``src``).
Before: ``src_endpoint.ip: "unknown"`` in every OCSF class and ``src=unknown`` in CEF.
"""
from __future__ import annotations

import orjson
import pytest

from audit.cef import cef_line, format_cef, parse_cef
from audit.event import AuditEvent, Identity, Kind, Outcome, is_ip_text
from audit.ocsf import ocsf_line, to_ocsf, validate_ocsf

EVENTS = [
    lambda a: AuditEvent(kind=Kind.INFERENCE, outcome=Outcome.ALLOWED, client_address=a, tenant="t",
                         identity=Identity("spiffe://d/w", "d"), endpoint="/v1/completions"),
    lambda a: AuditEvent(kind=Kind.AUTH, outcome=Outcome.UNAUTHENTICATED, client_address=a),
    lambda a: AuditEvent(kind=Kind.OPERATOR, outcome=Outcome.FAILED, client_address=a,
                         identity=Identity("spiffe://d/ops", "d"), operator={"action": "policy_change"}),
]


@pytest.mark.parametrize("make", EVENTS)
@pytest.mark.parametrize("source,field", [("unknown", "name"), ("unattested@10.0.0.7", "name"),
                                          ("10.1.2.3", "ip"), ("::1", "ip"), ("2001:db8::5", "ip")])
def test_only_an_address_is_an_ip(make, source: str, field: str) -> None:
    event = make(source)
    ocsf = to_ocsf(event)
    assert ocsf["src_endpoint"] == {field: source}
    validate_ocsf(ocsf)
    if event.kind is not Kind.OPERATOR:  # the request fast path
        assert orjson.loads(ocsf_line(event))["src_endpoint"] == {field: source}
    for line in (format_cef(event), cef_line(event)):
        ext = parse_cef(line)[1]
        assert ext.get("src" if field == "ip" else "shost") == source
        assert ("shost" if field == "ip" else "src") not in ext


def test_the_address_test() -> None:
    assert all(map(is_ip_text, ["127.0.0.1", "::", "fe80::1", "::ffff:10.0.0.1"]))
    assert not any(map(is_ip_text, ["unknown", "", "beef", "unattested@1.2.3.4", "/run/gw.sock", None, 5]))
