"""Issue 10, case: syslog with octet counting (RFC 6587) and a 2048-byte cap.

An event with a 10 KB field holding newlines and a multi-byte UTF-8
character exactly at the cut, then 3 ordinary events, over TCP and over TLS
to a raw loopback receiver that parses octet-counted frames strictly: every
length prefix equals the bytes that follow, no UTF-8 sequence is split, no
escape is left dangling, the next 3 events arrive byte for byte intact.
"""
from __future__ import annotations

import os
import ssl
import sys
from pathlib import Path

import pytest

sys.path.insert(0, os.path.dirname(__file__))
from octet_receiver import OctetReceiver  # noqa: E402

from audit.cef import format_cef, parse_cef  # noqa: E402
from audit.config import AuditConfigError, build_audit  # noqa: E402
from audit.event import AuditEvent, Kind, Outcome  # noqa: E402
from audit.syslog import SyslogSink, format_rfc5424, truncate_message  # noqa: E402
from tests.support.tls import self_signed
from tests.support.waiting import wait_for

CAP = 2048
HOST = "testhost"
CHAR = "€"  # 3 bytes in UTF-8


def _full(ev: AuditEvent) -> bytes:
    return format_rfc5424(ev, format_cef(ev), HOST)


def _big_event() -> AuditEvent:
    """An event whose 10 KB ``endpoint`` holds newlines and a € that straddles byte CAP."""
    for pad in range(8):
        ev = AuditEvent(kind=Kind.INFERENCE, outcome=Outcome.DENIED, request_id="big", tenant="tenant-a",
                        endpoint="/v1/" + "x" * pad + (CHAR + "\n") * 2000)
        msg = _full(ev)
        assert len(msg) > 10_000
        if msg[CAP] & 0xC0 == 0x80:  # a continuation byte at the cut: the € straddles it
            return ev
    raise AssertionError("no padding puts a multi-byte character at the cut")


_until = wait_for


@pytest.mark.parametrize("protocol", ["tcp", "tls"])
async def test_capped_octet_counted_frames_stay_whole_and_valid(tmp_path: Path, protocol: str) -> None:
    server_ctx = client_ctx = None
    if protocol == "tls":
        cert, key = self_signed(tmp_path)
        server_ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        server_ctx.load_cert_chain(cert, key)
        client_ctx = ssl.create_default_context(cafile=str(cert))
    receiver = OctetReceiver(ssl_context=server_ctx)
    await receiver.start()
    sink = SyslogSink("127.0.0.1", receiver.port, protocol, ssl_context=client_ctx, hostname=HOST,
                      max_message_bytes=CAP)
    big = _big_event()
    after = [AuditEvent(kind=Kind.INFERENCE, outcome=Outcome.ALLOWED, request_id=f"r{i}", tenant="tenant-a")
             for i in range(3)]
    try:
        await sink.send([big])
        await sink.send(after)
        await _until(lambda: len(receiver.frames) >= 4 or bool(receiver.errors))
    finally:
        await sink.close()
        await receiver.stop()
    assert receiver.errors == []  # every length prefix equalled the bytes that followed
    assert len(receiver.frames) == 4
    first = receiver.frames[0]
    full = _full(big)
    assert len(first) <= CAP and full.startswith(first) and len(first) >= CAP - 4
    first.decode("utf-8")  # strict: no split sequence
    assert b"\n" not in first
    assert (len(first) - len(first.rstrip(b"\\"))) % 2 == 0  # no dangling escape
    header, ext = parse_cef(first.decode())
    assert ext["externalId"] == big.event_id and header[4] == "inference:denied"
    assert receiver.frames[1:] == [_full(ev) for ev in after]  # the next 3 events intact
    assert sink.truncated == 1


def test_truncate_message_never_splits_a_sequence_or_an_escape() -> None:
    for text in ("a" * 500 + "é" * 300, "a" * 500 + "😀" * 300, "a" * 600 + "\\\\" * 300, "a" * 601 + "\\n" * 300):
        data = text.encode()
        for limit in range(480, 520):
            out = truncate_message(data, limit)
            assert len(out) <= limit and data.startswith(out) and len(out) >= limit - 4
            out.decode("utf-8")
            assert (len(out) - len(out.rstrip(b"\\"))) % 2 == 0
    assert truncate_message(b"short", 480) == b"short"


def test_cap_is_configurable_and_checked(tmp_path: Path) -> None:
    base = {"spill": {"dir": str(tmp_path / "spill")}}
    build_audit({**base, "syslog": {"host": "127.0.0.1", "port": 1, "max_message_bytes": 2048}}, validate_only=True)
    with pytest.raises(AuditConfigError):
        build_audit({**base, "syslog": {"host": "127.0.0.1", "port": 1, "max_message_bytes": 100}},
                    validate_only=True)
