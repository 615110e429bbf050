"""Session 19 (issue 14, helper trim4), the answer's ``post`` window: a routed request's audit event id is made
while the replica works (``AuditHub.prepare_request``, with the event's span part) instead of between the
replica's answer and the answer's last part; ``AuditHub.emit_request`` makes one when none was made (a request
refused before that step). The event carries the id made ahead; ids stay distinct version-4 UUIDs; the id made
ahead is taken out of the record's ``extra`` when the event is emitted."""

from __future__ import annotations

import uuid
from typing import Any

from tests.support import audit_log as audit_fixtures
from tests.support.audit_log import ListLog

audit_log, audit_hub = audit_fixtures.audit_log, audit_fixtures.audit_hub  # the stack on a ListLog


async def test_the_event_id_made_in_the_replica_wait_is_the_events(stack: Any, audit_log: ListLog,
                                                                  monkeypatch: Any) -> None:
    gw = stack.components
    prepared: list[str] = []
    prepare = gw.audit.prepare_request

    def spy_prepare(rec: Any) -> None:
        prepare(rec)
        prepared.append(rec.extra["event_id"])

    monkeypatch.setattr(gw.audit, "prepare_request", spy_prepare)
    extras: list[dict[str, Any]] = []
    emit = gw.audit.emit_request

    def spy_emit(rec: Any) -> None:
        emit(rec)
        extras.append(dict(rec.extra))

    monkeypatch.setattr(gw.audit, "emit_request", spy_emit)
    ok = {"model": "sim-model", "prompt": "a b c", "max_tokens": 2}
    for body, status in ((ok, 200), ({"model": "nope", "prompt": "a"}, 404), (ok, 200)):
        r = await stack.client.post("/v1/completions", json=body, headers=stack.auth())
        assert r.status_code == status, r.text
    events = [e for e in audit_log.events if getattr(e, "request_id", None)]
    assert [e.status_code for e in events] == [200, 404, 200]
    ids = [e.event_id for e in events]
    assert len(prepared) == 2 and [ids[0], ids[2]] == prepared and len(set(ids)) == 3
    assert all(uuid.UUID(i).version == 4 for i in ids)
    assert len(extras) == 3 and all("event_id" not in e for e in extras)
