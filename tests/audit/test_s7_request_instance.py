"""Session 7 (issue 14): under ``audit.instance`` the worker builds a request's event with the instance
already set, instead of ``dataclasses.replace`` per event in ``AuditLog.emit``; the event is the same."""
from __future__ import annotations

import dataclasses

from audit.request_event import REQUEST_ROW_FIELDS, request_event


def _row() -> list:
    row: list = [None] * len(REQUEST_ROW_FIELDS)
    row[0], row[1], row[2] = "2f0b7a8e-1c1d-4c3e-9a43-1b2c3d4e5f60", 1_735_787_045_678, "allowed"
    row[REQUEST_ROW_FIELDS.index("t0")] = 10.0
    row[REQUEST_ROW_FIELDS.index("t_end")] = 10.25
    row[REQUEST_ROW_FIELDS.index("tenant")] = "tenant-a"
    return row


def test_request_event_with_instance_equals_the_replaced_event() -> None:
    plain = request_event(_row())
    assert plain.instance is None
    stamped = request_event(_row(), instance="gw-1")
    assert stamped == dataclasses.replace(plain, instance="gw-1")
    assert stamped.to_json() == dataclasses.replace(plain, instance="gw-1").to_json()


def test_the_audit_log_keeps_an_instance_already_set() -> None:
    from prometheus_client import CollectorRegistry

    from audit.log import AuditLog

    seen = []

    class _Sink:
        name = "capture"

        async def open(self) -> None: ...

        async def send(self, batch) -> None:
            seen.extend(batch)

        async def close(self) -> None: ...

    import asyncio
    import tempfile

    async def go() -> None:
        with tempfile.TemporaryDirectory() as d:
            log = AuditLog([_Sink()], spill_dir=d, registry=CollectorRegistry(), instance="gw-1")
            await log.start()
            log.emit(request_event(_row(), instance="gw-1"))
            log.emit(request_event(_row()))
            assert await log.drain(10)
            await log.close()

    asyncio.run(go())
    assert [e.instance for e in seen[:2]] == ["gw-1", "gw-1"]
    assert seen[0].to_json() == seen[1].to_json()
