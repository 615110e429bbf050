"""Session 30 (attack30, S30-attack30-3): a ``pattern`` whose first character is a quantifier quantifies the opening
``"`` outlines-core 0.2.14 puts before it (``("+a")``, ``("?a")``, ``("{1,3}a")``): it reads quotes, or none at the
start, so gateway/pattern_quote.py's verdict "quote-free" was wrong for it (found by a differential of the scan
against outlines-core's automaton: bench/s30_attack30_quote_fuzz.py; every mismatch in 3,000 random patterns began
with ``*``, ``+``, ``?`` or ``{``). Now it reads the quote (fail closed): 400 ``json_schema_too_complex``
(``limits.json_schema.quote_reading_patterns``), nothing forwarded, one audit event ``rejected`` without the
schema's text.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from gateway.pattern_quote import pattern_reads_quote
from tests.hostile.conftest import capture, n_replicas  # noqa: F401 - fixtures
from tests.support.audit_log import ListLog, audit_hub, audit_log  # noqa: F401 - fixtures
from tests.support.schema_http import PATH, config_overrides, refused  # noqa: F401 - fixture
from tests.support.schema_http import chat as _chat, request_event as _event, rf as _rf

SECRET = "QQQ_field_\u2603"  # client text (a property name): never in the audit event

#: outlines-core's automaton for ``{"type": "string", "pattern": p}`` reads a ``"`` inside the string or starts
#: without one (checked with ``Index`` over single-character tokens: /tmp/a30/fuzz_child.py in the report)
LEADING = ['+a', '*[^"]{0,200}', '?[^"]{1,200}', '{1,3}[a-z]', '{ 2}a', '+?a', '*?a', '^+a$', '{2}\\d', '?']


@pytest.mark.parametrize("pattern", LEADING)
def test_a_leading_quantifier_reads_the_quote(pattern: str) -> None:
    assert pattern_reads_quote(pattern)  # before: False


@pytest.mark.parametrize("pattern", ['a+', '^a*$', '[a-z]{1,3}', '^\\+\\d{1,14}$', '\\?', '^(a)?$', '^[*+?{]$', ''])
def test_a_quantifier_after_an_atom_and_escaped_or_class_members_do_not(pattern: str) -> None:
    assert not pattern_reads_quote(pattern)


async def test_a_leading_quantifier_is_refused_over_http(stack: Any, capture: Any,
                                                         audit_log: ListLog) -> None:  # noqa: F811
    schema = {"type": "object", "required": [SECRET], "properties": {
        SECRET: {"type": "string", "pattern": '?[^"]{1,200}'}}}
    r = await stack.client.post(PATH, json=_chat(**_rf(schema)), headers=stack.auth())
    err = refused(r, capture, "quote_reading_patterns")  # before: 200, forwarded
    assert err["param"].endswith(".pattern")
    event = _event(audit_log)
    assert event.policy.reason == "response_format over limits.json_schema.quote_reading_patterns"
    assert "QQQ" not in json.dumps(event.to_dict()) and '[^\\"]' not in json.dumps(event.to_dict())
