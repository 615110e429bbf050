"""S24-review-4 (session 25 fixops): with ``server.max_connections_per_source`` off (the default), ``serve``
logs one WARNING at start per listener that binds a non-loopback address (one unauthenticated source can
then hold every connection slot, R3-6), naming the setting and the L4-balancer case; none on loopback
(benches, the demo) and none once a cap is set.

Before: nothing at start; only docs/configuration.md said so.
"""
from __future__ import annotations

import logging
from pathlib import Path

import pytest
import yaml

from gateway.auditing import AuditHub
from gateway.build import build
from gateway.config import load_config
from gateway.server import log_start_warnings
from gateway.source_cap import is_loopback_host, uncapped_listener_warnings
from sim.quickstart import init_gateway_dir


@pytest.mark.parametrize("host, loopback", [
    ("127.0.0.1", True), ("127.8.9.10", True), ("::1", True), ("[::1]", True), ("localhost", True),
    ("LOCALHOST", True), ("0.0.0.0", False), ("::", False), ("", False), ("10.0.0.5", False),
    ("gateway.internal", False), ("127.0.0.1.example", False),
    # S26-review26-10 (session 27): an IPv4-mapped loopback address is loopback; a mapped other one is not
    ("::ffff:127.0.0.1", True), ("[::ffff:127.9.0.1]", True), ("::ffff:10.0.0.5", False), ("::ffff:0.0.0.0", False)])
def test_loopback_hosts(host: str, loopback: bool) -> None:
    assert is_loopback_host(host) is loopback


def test_one_line_per_reachable_listener_and_none_with_a_cap() -> None:
    listeners = [("public", "0.0.0.0"), ("admin", "127.0.0.1")]
    [line] = uncapped_listener_warnings(listeners, None, 2048, 10.0, trusted_proxies=False)
    assert line.startswith("server.max_connections_per_source is off and the public listener binds 0.0.0.0")
    assert "(2048)" in line and "(10 s)" in line and "L4 load balancer" in line and "trusted_proxies" not in line
    assert uncapped_listener_warnings(listeners, 128, 2048, 10.0, trusted_proxies=False) == []
    assert uncapped_listener_warnings([("public", "::1")], None, 2048, 10.0, trusted_proxies=False) == []
    both = uncapped_listener_warnings([("public", "::"), ("admin", "10.1.2.3")], None, 64, 2.5, trusted_proxies=True)
    assert [w.split(" listener")[0][-6:] for w in both] == ["public", " admin"]
    assert all("never a forwarded client address" in w and "(2.5 s)" in w for w in both)


def _config(tmp_path: Path, host: str, cap: int | None) -> Path:
    res = init_gateway_dir(tmp_path / "gw", port=0, admin_port=0, replicas=1, replica_base_port=9)
    doc = yaml.safe_load(res.config.read_text(encoding="utf-8"))
    doc["listen"]["host"] = host
    doc.setdefault("server", {})["max_connections_per_source"] = cap
    out = tmp_path / "edited.yaml"
    out.write_text(yaml.safe_dump(doc))
    return out


@pytest.mark.parametrize("host, cap, warned", [("0.0.0.0", None, True), ("127.0.0.1", None, False),
                                               ("0.0.0.0", 128, False)])
def test_serve_warns_at_start(tmp_path: Path, caplog: pytest.LogCaptureFixture, host: str, cap: int | None,
                              warned: bool) -> None:
    c = build(load_config(_config(tmp_path, host, cap)), audit=AuditHub(None))
    with caplog.at_level(logging.WARNING, logger="prefixgate"):
        log_start_warnings(c)
    lines = [r for r in caplog.records if r.getMessage().startswith("server: ")]
    assert len(lines) == (1 if warned else 0), [r.getMessage() for r in lines]
    assert all(r.levelno == logging.WARNING and "public listener" in r.getMessage() for r in lines)
