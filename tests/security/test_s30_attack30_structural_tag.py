"""Session 30 (attack30, S30-attack30-7): vLLM's structural-tag response format (``{"type": "structural_tag",
"format": {...}}``, ``StructuralTagResponseFormat.format: Any``) is compiled by xgrammar
(``Grammar.from_structural_tag``), whose contents include a raw EBNF ``grammar`` and a ``regex`` ``pattern``. A counted
repetition there, ``("," [0-9]){4999,}`` or ``(,1){1023,}``, compiles to the same rule repetition as ``minItems``
(``root_1{4999, -1}``), as do Lark's ``~ 4999`` (``"syntax": "lark"``) and a ``{"type": "repeat", "min": 5000}``
content (``const_string{5000, 6000}``), and costs the same (xgrammar 0.2.9, 2,048 items, a 96-token vocabulary:
``{1023,}`` 0.26 s of ``accept_token`` CPU, one accept of 30 ms, +89 MB, as ``minItems`` 1024; ``{2047,}`` 0.39 s,
59 ms, +177 MB), but
``limits.json_schema.max_item_count`` read only the JSON-schema keywords: forwarded (200). Now a count above the bound
in a ``grammar`` string, in the ``pattern`` of a ``{"type": "regex"}`` content or as a ``repeat``'s ``min`` /
``max``, answers 400
``json_schema_too_complex`` naming ``max_item_count``, nothing forwarded; small counts and JSON-schema patterns
(which xgrammar compiles without that cost: S29-final29-4) are forwarded as before.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.hostile.conftest import capture, n_replicas  # noqa: F401 - fixtures
from tests.support.audit_log import ListLog, audit_hub, audit_log  # noqa: F401 - fixtures
from tests.support.schema_http import PATH, capture_config, refused
from tests.support.schema_http import chat as _chat, request_event as _event, rf as _rf


@pytest.fixture
def config_overrides(capture: Any, tmp_path: Any) -> dict[str, Any]:  # noqa: F811
    return capture_config(capture, tmp_path, {"tenant-a": None, "tenant-b": {"max_item_count": None}})


def _tag(content: dict[str, Any]) -> dict[str, Any]:
    return {"response_format": {"type": "structural_tag", "format": {
        "type": "triggered_tags", "triggers": ["<f"], "tags": [{"begin": "<f>", "content": content, "end": "</f>"}]}}}


OVER = {
    "grammar-lower": {"type": "grammar", "grammar": 'root ::= "[" [0-9] ("," [0-9]){4999,} "]" # QQQ'},
    "grammar-upper": {"type": "grammar", "grammar": 'root ::= "[" ("1" ","){0, 100000} "]"'},
    "grammar-spaced": {"type": "grammar", "grammar": 'root ::= ("1" ","){ 129 }'},
    "regex": {"type": "regex", "pattern": "\\[1(,1){1023,}\\]"},
    "regex-huge": {"type": "regex", "pattern": "(1,){99999999999999999999}"},
    "lark": {"type": "grammar", "syntax": "lark", "grammar": 'start: "[" ITEM ("," ITEM) ~ 4999 "]"\nITEM: "1"'},
    "lark-range": {"type": "grammar", "syntax": "lark", "grammar": 'start: "[" ("1,") ~ 5000..6000 "]"'},
    "repeat": {"type": "repeat", "min": 5000, "max": -1, "content": {"type": "const_string", "value": "1,"}},
    "repeat-max": {"type": "repeat", "min": 0, "max": 100000, "content": {"type": "const_string", "value": "1,"}},
}
#: the key of each form's refused value
KEY = {"regex": "pattern", "regex-huge": "pattern", "repeat": "min", "repeat-max": "max"}


@pytest.mark.parametrize("form", sorted(OVER))
async def test_a_counted_repetition_over_the_bound_in_a_grammar_or_regex_is_refused(
        stack: Any, capture: Any, audit_log: ListLog, form: str) -> None:  # noqa: F811
    r = await stack.client.post(PATH, json=_chat(**_tag(OVER[form])), headers=stack.auth())
    err = refused(r, capture, "max_item_count")  # before: 200, forwarded
    assert err["param"] == "response_format.format.tags.0.content." + KEY.get(form, "grammar")
    event = _event(audit_log)
    assert event.policy.reason == "response_format over limits.json_schema.max_item_count"
    assert "QQQ" not in json.dumps(event.to_dict())


async def test_small_counts_json_schema_patterns_and_a_tenant_without_the_bound_are_forwarded(
        stack: Any, capture: Any) -> None:
    bodies = [
        _chat(**_tag({"type": "grammar", "grammar": 'root ::= [a-z]{1,128} ("," [a-z]{1,8}){0,127}'})),
        _chat(**_tag({"type": "regex", "pattern": "[0-9]{4}-[0-9]{2}"})),
        _chat(**_tag({"type": "repeat", "min": 1, "max": -1, "content": {"type": "const_string", "value": "x"}})),
        _chat(**_tag({"type": "grammar", "syntax": "lark", "grammar": 'start: "a" ~ 1..8'})),
        _chat(**_tag({"type": "json_schema", "json_schema": {"type": "string", "pattern": "^[a-z]{1,253}$"}})),
        _chat(**_rf({"type": "object", "properties": {"host": {"type": "string", "pattern": "^[a-z.]{1,253}$"}}})),
    ]
    for body in bodies:
        r = await stack.client.post(PATH, json=body, headers=stack.auth())
        assert r.status_code == 200, r.text
    r = await stack.client.post(PATH, json=_chat(**_tag(OVER["regex"])), headers=stack.auth("tenant-b/app"))
    assert r.status_code == 200, r.text  # max_item_count null for this tenant
    assert [seen.body.get("response_format") for seen in capture.seen] == [
        b["response_format"] for b in bodies] + [_tag(OVER["regex"])["response_format"]]
