"""Session 29 (pattern29, S29-pattern29-1; the hole: S28-pattern28-2): outlines-core inlines a string's ``pattern``
raw between ``"``; a pattern whose classes can read that closing quote (``.``, ``\\S``, ``[^@]``, a range over 0x22)
lets its determinised automaton be "after the string" after every position inside it: ``^.{1,200}$`` as a required
property followed by others kills such a replica (3 GiB), ``^[^"]{1,200}$`` costs 0.03 s. Over HTTP such a
``response_format`` or tool ``parameters`` answers 400 ``json_schema_too_complex``
(``limits.json_schema.quote_reading_patterns``, default ``refuse``), nothing forwarded, one audit event ``rejected``
without the schema's text; quote-free patterns are forwarded, and a tenant whose ``json_schema_limits`` say
``quote_reading_patterns: allow`` (a replica on xgrammar / llguidance) has them all forwarded. Before the fix every
one of these was forwarded (200).
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.support.audit_log import ListLog, audit_hub, audit_log  # noqa: F401 - fixtures
from tests.support.schema_http import PATH, capture_config, forwarded, named_tool, refused, refused_and_audited
from tests.support.schema_http import chat as _chat, rf as _rf

SECRET = "launch_code_1234"  # client text (a property name): never in the audit event
S = "response_format.json_schema.schema"


@pytest.fixture
def config_overrides(capture: Any, tmp_path: Any) -> dict[str, Any]:
    # session 30 (pattern30): an xgrammar / llguidance tenant turns max_pattern_states off too (it refuses what it
    # cannot parse, \p{L}, and counts ^.{1,200}$ and the like)
    return capture_config(capture, tmp_path, {
        "tenant-a": None, "tenant-b": {"quote_reading_patterns": "allow", "max_pattern_states": None}})


def _then(first: dict[str, Any]) -> dict[str, Any]:
    """``first`` as a required property followed by two more (the shape that kills outlines-core)."""
    return {"type": "object", "required": [SECRET, "b", "c"], "properties": {
        SECRET: first, "b": {"type": "string", "pattern": "^[A-Za-z0-9_-]{1,64}$"},
        "c": {"type": "string", "format": "date"}}}


READS = {  # each under every other bound (max_pattern_chars 1024, max_regex_chars)
    "dot": "^.{1,200}$",
    "negated-at": "^[^@]{1,64}@[^@]{1,255}$",
    "non-space": "\\S+",
    "range-over-quote": "^[ -~]{1,100}$",
    "escaped-quote": '^[a-z\\x22]{1,20}$',
    "unicode-property": "^\\p{L}{1,20}$",
}
QUOTE_FREE = {
    "identifier": "^[A-Za-z0-9_-]{1,64}$",
    "date": "^\\d{4}-\\d{2}-\\d{2}$",
    "not-a-quote": '^[^"]{1,200}$',
}


@pytest.mark.parametrize("name", list(READS))
async def test_a_quote_reading_pattern_is_refused_and_audited(
        stack: Any, capture: Any, audit_log: ListLog, name: str) -> None:  # noqa: F811
    err = await refused_and_audited(stack, capture, audit_log, _then({"type": "string", "pattern": READS[name]}),
                                    "quote_reading_patterns", SECRET, READS[name])  # before: 200, forwarded
    assert err["param"] == f"{S}.properties.{SECRET}.pattern"
    assert '[^"]' in err["message"]


@pytest.mark.parametrize("fmt", ["uri", "email"])
async def test_format_uri_and_email_are_refused(stack: Any, capture: Any, fmt: str) -> None:
    """outlines-core builds ``format: uri`` from ``[^\\s]*`` and the like, ``email`` with a domain literal
    ``[\\x21-\\x5a...]``: both read the quote (8 required emails: killed)."""
    r = await stack.client.post(PATH, json=_chat(**_rf(_then({"type": "string", "format": fmt}))),
                                headers=stack.auth())
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == f"{S}.properties.{SECRET}.format"
    assert capture.seen == []


async def test_a_quote_reading_pattern_in_a_named_tool_is_refused(stack: Any, capture: Any) -> None:
    r = await stack.client.post(PATH, json=named_tool(_then({"type": "string", "pattern": READS["dot"]})),
                                headers=stack.auth())
    assert refused(r, capture)["param"] == f"tools.0.function.parameters.properties.{SECRET}.pattern"


async def test_quote_free_patterns_are_forwarded(stack: Any, capture: Any) -> None:
    schemas = [_then({"type": "string", "pattern": p}) for p in QUOTE_FREE.values()]
    schemas.append(_then({"type": "string", "format": "uri", "pattern": "^https://[a-z.]{1,64}$"}))  # pattern wins
    await forwarded(stack, capture, schemas)


async def test_the_tenant_override_allow_forwards_them(stack: Any, capture: Any) -> None:
    schemas = [_then({"type": "string", "pattern": p}) for p in READS.values()]
    schemas += [_then({"type": "string", "format": "uri"}), _then({"type": "string", "format": "email"})]
    await forwarded(stack, capture, schemas, "tenant-b/app")
