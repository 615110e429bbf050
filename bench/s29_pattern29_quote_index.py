"""Session 29 (pattern29, S29-pattern29-1): outlines-core 0.2.14's ``Index`` for schemas whose ``pattern`` (or
``format``) can or cannot read the string's closing ``"``, beside the gateway's verdict
(:func:`gateway.response_format.response_format_refusal` under the default bounds). Each schema is built in a child
process limited to 3 GiB of address space and 60 s of CPU (:mod:`bench.outlines_index_child`; a killed child prints
its return code); the vocabulary is the 95 printable ASCII characters and ``\\n``, one token each (CPU per state
far below a real tokenizer's). Markdown on stdout.

outlines-core is not a project dependency: ``OUTLINES_PYTHON`` names an interpreter that has it. Usage:
``OUTLINES_PYTHON=/tmp/oc-venv/bin/python python -m bench.s29_pattern29_quote_index [NAME_PART ...]``.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

from bench.outlines_index_child import index_in_child
from gateway.config_http import JsonSchemaLimits
from gateway.response_format import response_format_refusal
from tests.support.ordinary_patterns import ORDINARY as ORDINARY_PATTERNS

#: the child's vocabulary: the 95 printable ASCII characters and a newline, one token each
ALPHABET = [chr(c) for c in range(32, 127)] + ["\n"]


def _then(first: dict[str, Any], *rest: dict[str, Any]) -> dict[str, Any]:
    """An object whose required properties are ``first`` then ``rest`` (in this order)."""
    props = {"a": first, **{f"p{i}": s for i, s in enumerate(rest)}}
    return {"type": "object", "properties": props, "required": list(props)}


def _pat(p: str) -> dict[str, Any]:
    return {"type": "string", "pattern": p}


_DATE = {"type": "string", "format": "date"}
_ORDINARY_READING = {k: ORDINARY_PATTERNS[k] for k in ("email simple", "url simple", "free text 1-200", "non empty",
                                                      "file path")}
_REWRITTEN = {"email simple": '^[^"@\\s]+@[^"@\\s]+\\.[^"@\\s]+$',
              "url simple": '^https?://[^"\\s/$.?#][^"\\s]*$',
              "free text 1-200": '^[^"]{1,200}$', "non empty": '^[^"\\s][^"]*$',
              "file path": '^(/[^"/\\x00]{1,255}){1,32}$'}
_NAME = _pat("^[A-Za-z0-9_-]{1,64}$")
CASES: dict[str, Any] = {
    # refused (the pattern can read the closing quote)
    "^.{1,200}$ then 2 properties": _then(_pat("^.{1,200}$"), _NAME, _DATE),
    "^[^@]{1,64}@[^@]{1,255}$ then 2 properties": _then(_pat("^[^@]{1,64}@[^@]{1,255}$"), _NAME, _DATE),
    "^.{1,40}$ then a date": _then(_pat("^.{1,40}$"), _DATE),
    "^\\S+$ then 2 properties": _then(_pat("^\\S+$"), _NAME, _DATE),
    "^\\S{1,64}$ then 2 properties": _then(_pat("^\\S{1,64}$"), _NAME, _DATE),
    "^[ -~]{1,100}$ then 2 properties": _then(_pat("^[ -~]{1,100}$"), _NAME, _DATE),
    "format uri then a date": _then({"type": "string", "format": "uri"}, _DATE),
    "format uri then 3 uris": _then(*[{"type": "string", "format": "uri"}] * 4),
    "format email then 3 dates": _then({"type": "string", "format": "email"}, _DATE, _DATE, _DATE),
    "8 x format email": _then(*[{"type": "string", "format": "email"}] * 8),
    "8 x ^[^@]+@[^@]+$": _then(*[_pat("^[^@]+@[^@]+$")] * 8),
    "8 x ^\\S+$": _then(*[_pat("^\\S+$")] * 8),
    # admitted (quote-free)
    "8 x ^[^\"@]+@[^\"@]+$": _then(*[_pat('^[^"@]+@[^"@]+$')] * 8),
    "8 x format date-time": _then(*[{"type": "string", "format": "date-time"}] * 8),
    "^[^\"]{1,200}$ then 2 properties": _then(_pat('^[^"]{1,200}$'), _NAME, _DATE),
    "^[^\"@]{1,64}@[^\"@]{1,255}$ then 2 properties": _then(_pat('^[^"@]{1,64}@[^"@]{1,255}$'), _NAME, _DATE),
    "^[A-Za-z0-9_-]{1,64}$ then a date": _then(_NAME, _DATE),
    "^\\d{4}-\\d{2}-\\d{2}$ then 2 properties": _then(_pat("^\\d{4}-\\d{2}-\\d{2}$"), _NAME, _DATE),
    "^[\\w.+-]{1,64}@[\\w-]{1,63}(\\.[\\w-]{1,63}){1,8}$ then 2 properties": _then(
        _pat("^[\\w.+-]{1,64}@[\\w-]{1,63}(\\.[\\w-]{1,63}){1,8}$"), _NAME, _DATE),
    # tests/support/ordinary_patterns.py: the 5 of 46 that read the quote, and each rewritten without it
    **{f"ordinary {k} then 2 properties": _then(_pat(v), _NAME, _DATE) for k, v in _ORDINARY_READING.items()},
    **{f"rewritten {k} then 2 properties": _then(_pat(v), _NAME, _DATE) for k, v in _REWRITTEN.items()},
    # S28-attack28-2 (H1): quote-free, admitted by this bound
    "[ab]*a + 12 [ab] then a date": _then(_pat("[ab]*a" + "[ab]" * 12), _DATE),
    "[ab]*a + 16 [ab] then a date": _then(_pat("[ab]*a" + "[ab]" * 16), _DATE),
    "[ab]*a + 20 [ab] then a date": _then(_pat("[ab]*a" + "[ab]" * 20), _DATE),
}


def _verdict(schema: Any) -> str:
    """The gateway's answer to ``schema`` as a ``response_format`` under the default ``limits.json_schema``: ``400
    (<bound>)`` or ``admitted`` (:func:`gateway.response_format.response_format_refusal` itself)."""
    refused = response_format_refusal({"type": "json_schema", "json_schema": {"name": "x", "schema": schema}},
                                      JsonSchemaLimits(), {}, 0)
    return "admitted" if refused is None else f"400 ({refused.record['reason'].rpartition('.')[2]})"


def main() -> None:
    python = os.environ.get("OUTLINES_PYTHON", "python3")
    only = sys.argv[1:]
    print("| required properties | gateway (default) | outlines-core: regex chars, Index CPU s, peak RSS MB |")
    print("|---|---|---|")
    for name, schema in CASES.items():
        if only and not any(part in name for part in only):
            continue
        text = json.dumps(schema, separators=(",", ":"))
        out = index_in_child(text, python, ALPHABET, 900)  # 900 s wall: a loaded machine
        print(f"| {name} | {_verdict(schema)} | {out} |", flush=True)


if __name__ == "__main__":
    main()
