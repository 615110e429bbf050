"""Session 9 (issue 14): the OTLP log sink writes its request body directly
(audit/otlp_log_request.py); the bytes stay those of the generated messages (session 6's
reference construction and ``build_request``), for every kind, outcome, tenant, trace id and for
events outside the direct path."""
from __future__ import annotations

import dataclasses

import pytest
from opentelemetry.proto.common.v1 import common_pb2

from audit import otlp
from audit.event import AuditEvent, Kind, Outcome
from audit.otlp_log_request import encode_logs_request
from tests.audit.test_s6_worker_batch import _events, _reference_otlp


def _varied() -> list[AuditEvent]:
    evs = _events()
    out = []
    for i, ev in enumerate(evs):
        out.append(dataclasses.replace(
            ev, outcome=list(Outcome)[i % len(Outcome)], tenant=[None, "", "t-a", "ü" * 50][i % 4],
            trace_id=[None, f"{i + 1:032x}", "0" * 32, "zz" * 16, "ab"][i % 5]))
    out.append(AuditEvent(kind=Kind.OPERATOR, outcome=Outcome.SUCCEEDED, operator={"action": "reload"}))
    return out


@pytest.mark.parametrize("observed_ns", [0, 7, 1_764_000_000_000_000_000])
def test_direct_body_equals_the_generated_messages(observed_ns: int) -> None:
    evs = _varied()
    scope = common_pb2.InstrumentationScope(name=otlp.SCOPE_NAME, version="t")
    resource = otlp.build_resource("prefixgate", {"host.name": "h"})
    expected = _reference_otlp(evs, resource, scope, observed_ns).SerializeToString()
    assert otlp.build_request(evs, resource, scope, observed_ns).SerializeToString() == expected
    assert encode_logs_request(evs, resource, scope, observed_ns) == expected
    assert encode_logs_request(evs, resource, scope, observed_ns) == expected  # from the caches
    assert encode_logs_request(evs[:1], resource, scope, observed_ns) == _reference_otlp(
        evs[:1], resource, scope, observed_ns).SerializeToString()


def test_events_outside_the_direct_path_get_the_generated_record() -> None:
    evs = _varied()[:20]
    evs[3] = dataclasses.replace(evs[3], time_ms=0)
    evs[7] = dataclasses.replace(evs[7], time_ms=True)  # type: ignore[arg-type]
    scope = common_pb2.InstrumentationScope(name=otlp.SCOPE_NAME, version="t")
    resource = otlp.build_resource("prefixgate")
    expected = otlp.build_request(evs, resource, scope, 5).SerializeToString()
    assert encode_logs_request(evs, resource, scope, 5) == expected
