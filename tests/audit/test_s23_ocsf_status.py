"""S23-newcomer-8: OCSF ``status`` is the caption of ``status_id``, not the gateway's outcome.

OCSF 1.x base event: ``status_id`` 0 Unknown, 1 Success, 2 Failure, 99 Other, and ``status`` is the
caption of ``status_id`` (a source-defined value only for 99 Other). Before the fix ``status`` held
``allowed`` / ``rejected`` / ``denied``..., which a SIEM normaliser mapping ``status`` reads as an
unknown value. Detection Finding's ``status_id`` is the finding status (1 New, 4 Resolved), so its
``status`` is ``New`` / ``Resolved``. The gateway's own outcome stays in ``unmapped.prefixgate.outcome``
(and ``actor.authorizations[].decision``); alerts and summaries without a finding status (99) keep it.
The fast path (:func:`audit.ocsf.ocsf_line`) writes the same value.
"""
from __future__ import annotations

import orjson
import pytest

from audit.event import AuditEvent, Kind, Outcome, PolicyInfo
from audit.ocsf import ocsf_line, to_ocsf, validate_ocsf

CAPTION = {0: "Unknown", 1: "Success", 2: "Failure"}
REQUEST_OUTCOMES = [Outcome.ALLOWED, Outcome.DENIED, Outcome.REJECTED, Outcome.RATE_LIMITED, Outcome.CANCELLED,
                    Outcome.FAILED, Outcome.UNAUTHENTICATED]


@pytest.mark.parametrize("kind", [Kind.INFERENCE, Kind.AUTH])
@pytest.mark.parametrize("outcome", REQUEST_OUTCOMES, ids=lambda o: o.value)
def test_request_status_is_the_caption_of_status_id(kind, outcome) -> None:
    event = AuditEvent(kind=kind, outcome=outcome, tenant="acme", request_id="r1",
                       policy=PolicyInfo("d1", "ok" if outcome is Outcome.ALLOWED else "pool_forbidden"))
    data = to_ocsf(event)
    validate_ocsf(data)
    assert data["status"] == CAPTION[data["status_id"]]
    assert data["status"] == ("Success" if outcome is Outcome.ALLOWED else "Failure")
    assert data["unmapped"]["prefixgate"]["outcome"] == outcome.value  # our verdict, where the schema allows it
    assert orjson.loads(ocsf_line(event))["status"] == data["status"]  # the fast path agrees


@pytest.mark.parametrize("outcome,status_id,status", [(Outcome.SUCCEEDED, 1, "Success"), (Outcome.FAILED, 2, "Failure")])
def test_operator_and_checkpoint_status(outcome, status_id, status) -> None:
    data = to_ocsf(AuditEvent(kind=Kind.OPERATOR, outcome=outcome, operator={"action": "tenant.rotate_key"}))
    validate_ocsf(data)
    assert (data["status_id"], data["status"]) == (status_id, status)
    cp = to_ocsf(AuditEvent(kind=Kind.CHECKPOINT, outcome=Outcome.SEALED, checkpoint={"head": "ab", "head_seq": 3}))
    assert (cp["status_id"], cp["status"]) == (1, "Success")


@pytest.mark.parametrize("outcome,status_id,status", [(Outcome.RAISED, 1, "New"), (Outcome.CLEARED, 4, "Resolved")])
def test_detection_finding_status_is_the_finding_caption(outcome, status_id, status) -> None:
    data = to_ocsf(AuditEvent(kind=Kind.ALERT, outcome=outcome, alert={"alert_id": "c1", "alert_kind": "x"}))
    validate_ocsf(data)
    assert (data["status_id"], data["status"]) == (status_id, status)
    assert data["unmapped"]["prefixgate"]["outcome"] == outcome.value


def test_other_keeps_the_gateway_word() -> None:
    data = to_ocsf(AuditEvent(kind=Kind.SUMMARY, outcome=Outcome.SUMMARIZED, summary={"suppressed": 3}))
    assert data["status_id"] == 99 and data["status"] == "summarized"  # 99 Other: the source defines it
