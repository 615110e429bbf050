"""Session 28 (attack28, S28-attack28-1): outlines-core 0.2.14's ``Index`` (the automaton a replica builds before the
first token) for small schemas with a counted string repetition, beside the gateway's estimate
(:func:`gateway.schema_expansion.regex_chars`). Each schema is built in a child process limited to 3 GiB of address
space and 60 s of CPU (a killed child prints its return code). Markdown on stdout.

outlines-core is not a project dependency: ``OUTLINES_PYTHON`` names an interpreter that has it (``pip install
outlines-core==0.2.14`` in a scratch venv). Usage: ``OUTLINES_PYTHON=/tmp/oc-venv/bin/python python -m
bench.s28_attack28_outlines_index [NAME_PART ...]`` (only the cases whose name contains one of the parts).
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

from bench.outlines_index_child import index_in_child
from gateway.schema_expansion import regex_chars

#: the child's vocabulary: one token per character
ALPHABET = list('{}[]",:0123456789-.eEtrufalsn abcdp') + ["\n"]

_REQ = {"type": "object", "required": ["a"]}
CASES: dict[str, Any] = {
    **{f"root maxLength {n}": {"type": "string", "maxLength": n} for n in (8, 12, 16, 24)},
    "root minLength 16": {"type": "string", "minLength": 16},
    "root pattern .{16}": {"type": "string", "pattern": ".{16}"},
    "root pattern (.{4}){4}": {"type": "string", "pattern": "(.{4}){4}"},
    "root $ref maxLength 16": {"$ref": "#/$defs/a", "$defs": {"a": {"type": "string", "maxLength": 16}}},
    "root anyOf [maxLength 24, null]": {"anyOf": [{"type": "string", "maxLength": 24}, {"type": "null"}]},
    "property maxLength 200": {**_REQ, "properties": {"a": {"type": "string", "maxLength": 200}}},
    "array items maxLength 24": {"type": "array", "items": {"type": "string", "maxLength": 24}},
    "property pattern .{24}": {**_REQ, "properties": {"a": {"type": "string", "pattern": ".{24}"}}},
    # S28-attack28-2 (open): a pattern's own structure, anywhere
    **{f"property pattern .*a + {k} dots": {**_REQ, "properties": {"a": {"type": "string", "pattern": ".*a" + "." * k}}}
       for k in (12, 16, 20)},
    "property pattern [ab]*a + 20 [ab]": {**_REQ, "properties": {"a": {"type": "string",
                                                                           "pattern": "[ab]*a" + "[ab]" * 20}}},
}


def main() -> None:
    python = os.environ.get("OUTLINES_PYTHON", "python3")
    only = sys.argv[1:]
    print("| schema | JSON bytes | gateway estimate (chars) | outlines-core: regex chars, Index CPU s, peak RSS MB |")
    print("|---|---|---|---|")
    for name, schema in CASES.items():
        if only and not any(part in name for part in only):
            continue
        text = json.dumps(schema, separators=(",", ":"))
        out = index_in_child(text, python, ALPHABET, 180)
        print(f"| `{text}` | {len(text)} | {regex_chars(schema, 1 << 62):,} | {out} |", flush=True)


if __name__ == "__main__":
    main()
