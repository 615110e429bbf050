"""Session 20, helper fixreg (S19-T4-1): a bug inside the front step keeps the record fields the steps had learnt.

``gateway.admission_front.parse_and_count`` attaches ``stream``/``sequences`` (once the body parsed), ``model``
(once the entitlement passed) and ``t_parsed`` (once the prompt step began) to a refusal; a bug (an exception
that is not a ``GatewayError``) after the parse is raised as ``gateway.errors.StepFailed`` from it with the same
fields, and the pipeline's 500 ``internal_error`` audit record keeps them (before: none of them).
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from gateway.admission_front import parse_and_count
import gateway.errors as errors  # StepFailed: session 20 (a name, so the served test also runs on main)
from tests.gateway.test_s19_trim4_front import LIMITS, TENANTS, _admission


class _Bug(Exception):
    pass


def _raise(*_: Any, **__: Any) -> Any:
    raise _Bug("tokenizer bug")


def _front(adm: Any, body: dict[str, Any], tenant: str) -> Any:
    t = TENANTS[tenant]
    return parse_and_count(adm, json.dumps(body).encode(), "completions", LIMITS, adm.request_bounds(t), t,
                           None, False)


def test_a_bug_while_counting_keeps_stream_sequences_model_and_t_parsed() -> None:
    adm = _admission()
    adm.prompt_tokens = _raise  # type: ignore[method-assign]
    with pytest.raises(errors.StepFailed) as got:
        _front(adm, {"model": "m", "prompt": "a b", "stream": True}, "plain")
    rec = got.value.record
    assert (rec["stream"], rec["sequences"], rec["model"]) == (True, 1, "m")
    assert isinstance(rec["t_parsed"], float)
    assert isinstance(got.value.__cause__, _Bug)  # logged with its cause


def test_a_bug_in_the_entitlement_keeps_what_the_parse_gave() -> None:
    adm = _admission()
    adm.check_request = _raise  # type: ignore[method-assign]
    with pytest.raises(errors.StepFailed) as got:  # a model not entitled: the check runs
        _front(adm, {"model": "served-only", "prompt": ["a", "b"], "stream": True}, "plain")
    assert got.value.record == {"stream": True, "sequences": 2}
    assert isinstance(got.value.__cause__, _Bug)


def test_a_bug_in_the_parse_itself_is_not_wrapped(monkeypatch: Any) -> None:
    import gateway.admission_front as front

    monkeypatch.setattr(front, "parse_inference_request", _raise)
    with pytest.raises(_Bug):
        _front(_admission(), {"model": "m", "prompt": "a"}, "plain")


async def test_a_served_bug_answers_500_and_its_record_keeps_the_front_fields(stack: Any, monkeypatch: Any) -> None:
    """Through the pipeline: 500 internal_error, and the audit record has stream, sequences, model and
    t_parsed as a refusal at the same point would (tests/gateway/test_s19_trim4_front.py)."""
    records: list[Any] = []
    gw = stack.components
    emit = gw.audit.emit_request
    monkeypatch.setattr(gw.audit, "emit_request", lambda rec: (records.append(rec), emit(rec)))
    monkeypatch.setattr(gw.admission, "prompt_tokens", _raise)
    body = {"model": "sim-model", "prompt": "a b c", "max_tokens": 2, "stream": True}
    r = await stack.client.post("/v1/completions", json=body, headers=stack.auth())
    assert r.status_code == 500, r.text
    assert r.json()["error"]["code"] == "internal_error"
    assert r.headers["x-request-id"]
    rec = records[-1]
    assert (rec.status, rec.outcome, rec.error_code) == (500, "failed", "internal_error")
    assert (rec.stream, rec.sequences, rec.model) == (True, 1, "sim-model")
    assert rec.t_parsed is not None and rec.t_auth <= rec.t_parsed <= rec.t_end
    assert rec.tenant_id == "tenant-a"
