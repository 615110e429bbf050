"""Session 30 (pattern30, S30-pattern30-1; the hole: S29-pattern29-2, S28-attack28-2): a quote-free ``pattern`` whose
determinised automaton blows up (``[ab]*a`` then 20 ``[ab]``: killed at 3 GiB; outlines-core 0.2.14 builds it
before the first token, with no timeout) passed every gateway bound and was forwarded (200). Over HTTP such a
``response_format`` or tool ``parameters`` now answers 400 ``json_schema_too_complex``
(``limits.json_schema.max_pattern_states``), nothing forwarded, one audit event ``rejected`` naming the bound and not
the pattern; ordinary patterns are forwarded, and a tenant whose ``json_schema_limits`` say
``max_pattern_states: null`` (a replica on xgrammar / llguidance) has them forwarded.
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.support.audit_log import ListLog, audit_hub, audit_log  # noqa: F401 - fixtures
from tests.support.ordinary_patterns import ORDINARY
from tests.support.schema_http import PATH, capture_config, forwarded, named_tool, refused, refused_and_audited
from tests.support.schema_http import chat as _chat, rf as _rf

SECRET = "QQQ_launch_code"  # client text (a property name): never in the audit event
S = "response_format.json_schema.schema"


@pytest.fixture
def config_overrides(capture: Any, tmp_path: Any) -> dict[str, Any]:
    return capture_config(capture, tmp_path, {"tenant-a": {"max_pattern_chars": 4096},
                                              "tenant-b": {"max_pattern_states": None}},
                          limits={"max_body_bytes": 1 << 20})


def _then(first: dict[str, Any]) -> dict[str, Any]:
    """``first`` as a required property followed by a date."""
    return {"type": "object", "required": [SECRET, "b"], "properties": {
        SECRET: first, "b": {"type": "string", "format": "date"}}}


HOSTILE = {  # quote-free: S29-pattern29-1's bound admits each
    "classic": "[ab]*a" + "[ab]" * 20,
    "alternation": "(a|b)*a(a|b){20}",
    "nested-counts": "^[ab]*a([ab]{2}){10}$",
    "overlapping-class": "[a-z]*x[a-z]{16}",
    "unicode-counted": "^(?:[\\w-]{1,63}\\.){1,8}$",
}


@pytest.mark.parametrize("name", list(HOSTILE))
async def test_a_blow_up_pattern_is_refused_and_audited(
        stack: Any, capture: Any, audit_log: ListLog, name: str) -> None:  # noqa: F811
    err = await refused_and_audited(stack, capture, audit_log, _then({"type": "string", "pattern": HOSTILE[name]}),
                                    "max_pattern_states", SECRET, HOSTILE[name])  # before: 200, forwarded
    assert err["param"] == f"{S}.properties.{SECRET}.pattern"


async def test_a_blow_up_pattern_in_a_named_tool_is_refused(stack: Any, capture: Any) -> None:
    r = await stack.client.post(PATH, json=named_tool(_then({"type": "string", "pattern": HOSTILE["classic"]})),
                                headers=stack.auth())
    assert refused(r, capture)["param"] == f"tools.0.function.parameters.properties.{SECRET}.pattern"


async def test_an_any_of_of_cycles_is_refused(stack: Any, capture: Any) -> None:
    """Each alone is small; outlines-core's alternation of them needs their product (S30-pattern30-2)."""
    members = [{"type": "string", "pattern": f"^(?:a{{{p}}})*$"} for p in (7, 11, 13, 17, 19, 23)]
    r = await stack.client.post(PATH, json=_chat(**_rf(_then({"anyOf": members}))), headers=stack.auth())
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == f"{S}.properties.{SECRET}.anyOf"
    assert capture.seen == []


async def test_ordinary_patterns_are_forwarded(stack: Any, capture: Any) -> None:
    """Each quote-free ordinary pattern of tests/support/ordinary_patterns.py (41 of 46) as its own request."""
    from gateway.pattern_quote import pattern_reads_quote
    schemas = [_then({"type": "string", "pattern": p}) for p in ORDINARY.values() if not pattern_reads_quote(p)]
    await forwarded(stack, capture, schemas)


async def test_the_tenant_override_null_forwards_them(stack: Any, capture: Any) -> None:
    schemas = [_then({"type": "string", "pattern": p}) for p in HOSTILE.values()]
    await forwarded(stack, capture, schemas, "tenant-b/app")
