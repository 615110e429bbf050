"""R7b-3: protocol-refusal audits are rate-bound per source first, then globally, so one
noisy source cannot hide another source's refusals (e.g. a refused smuggling attempt)."""
from __future__ import annotations

import logging

from gateway.protocol_audit import ProtocolRefusals, attach, refused


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def _make(per_s: float = 50.0):
    recs: list = []
    clock = Clock()
    return ProtocolRefusals(recs.append, per_s, clock=clock), recs, clock


def test_flood_from_one_source_does_not_hide_another_source():
    pr, recs, clock = _make()
    for _ in range(400):
        pr.note(("127.0.0.2", 5000), 400, "invalid_request")
    pr.note(("127.0.0.3", 6000), 400, "upgrade_not_supported")
    hosts = [r for r in recs if r.client_addr == "127.0.0.3"]
    assert hosts, "the second source's refusal was not audited"


def test_noisy_source_is_bounded_individually():
    pr, recs, clock = _make(per_s=50.0)
    for _ in range(400):
        pr.note(("127.0.0.2", 5000), 400, "invalid_request")
    # one source gets at most a small share of the global burst (100)
    assert 0 < len(recs) < 100
    assert pr.suppressed == 400 - len(recs)


def test_guard_refusals_count_per_source():
    """The guard's refusals (gateway/upgrade_guard.py calls ``refused`` on its protocol) go through the
    ProtocolRefusals attached to the protocol's app: a flood from one source hides no other source's."""
    pr, recs, clock = _make()

    class App:
        pass

    class Protocol:
        def __init__(self, client: tuple[str, int]) -> None:
            self.app, self.client = attach(App(), pr), client

    noisy = Protocol(("10.0.0.1", 1))
    for _ in range(300):
        refused(noisy, 400, "invalid_request")
    refused(Protocol(("10.0.0.9", 1)), 400, "upgrade_not_supported")
    assert any(r.client_addr == "10.0.0.9" and r.error_code == "upgrade_not_supported" for r in recs)


def test_warning_names_top_sources():
    pr, recs, clock = _make(per_s=5.0)
    seen: list[logging.LogRecord] = []

    class H(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            seen.append(record)

    h = H(level=logging.WARNING)
    logging.getLogger("prefixgate").addHandler(h)
    try:
        for _ in range(200):
            pr.note(("127.0.0.2", 1), 400, "invalid_request")
        for _ in range(30):
            pr.note(("127.0.0.7", 1), 431, "request_header_too_large")
        clock.t += 11
        for _ in range(3):  # the refilled token is taken, then one is skipped: the report is due
            pr.note(("127.0.0.2", 1), 400, "invalid_request")
    finally:
        logging.getLogger("prefixgate").removeHandler(h)
    text = " ".join(r.getMessage() for r in seen)
    assert "127.0.0.2" in text and "127.0.0.7" in text, text
