"""Session 18 (R18-3): the echo + logprobs rule (R4-12) reads a fact of the parse, not ``req.body``.

A queued request's ``body`` is emptied (gateway/flow_bytes.py ``queued_form``), and the re-decision at
its release runs ``check_request`` again (gateway/pep_recheck.py); the rule must hold there too.
"""
from __future__ import annotations

import json

import pytest

from gateway.errors import GatewayError
from gateway.request import parse_inference_request
from tenancy.registry import Tenant
from tests.gateway.test_s18_front3_steps import _admission


def _parse(endpoint: str, **fields: object):  # type: ignore[no-untyped-def]
    base = {"model": "m", "prompt": "hi"} if endpoint == "completions" else \
        {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    return parse_inference_request(json.dumps({**base, **fields}).encode(), endpoint)  # type: ignore[arg-type]


@pytest.mark.parametrize(("fields", "expected"), [
    ({}, False),
    ({"echo": True}, False),
    ({"logprobs": 1}, False),
    ({"echo": False, "logprobs": 1}, False),
    ({"echo": True, "logprobs": 0}, True),
    ({"echo": True, "logprobs": 1}, True),
])
def test_the_parse_records_prompt_logprobs(fields: dict, expected: bool) -> None:
    assert _parse("completions", **fields).prompt_logprobs is expected


def test_the_rule_holds_on_a_request_whose_body_was_emptied() -> None:
    adm = _admission()
    req = _parse("completions", echo=True, logprobs=1)
    req.body.clear()  # as queued_form leaves a queued request
    with pytest.raises(GatewayError) as ei:
        adm.check_request(req, Tenant(id="acme", models=frozenset({"m"})))
    assert (ei.value.status, ei.value.code, ei.value.param) == (400, "prompt_logprobs_not_allowed", "echo")
    adm.check_request(req, Tenant(id="acme", models=frozenset({"m"}), allow_prompt_logprobs=True))
