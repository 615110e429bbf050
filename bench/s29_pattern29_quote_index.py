"""Session 29 (pattern29, S29-pattern29-1): outlines-core 0.2.14's ``Index`` for schemas whose ``pattern`` (or
``format``) can or cannot read the string's closing ``"``, beside the gateway's verdict
(:func:`gateway.pattern_quote.pattern_reads_quote`). Each schema is built in a child process limited to 3 GiB of
address space and 60 s of CPU (a killed child prints its return code); the vocabulary is the 95 printable ASCII
characters and ``\\n``, one token each (CPU per state far below a real tokenizer's). Markdown on stdout.

outlines-core is not a project dependency: ``OUTLINES_PYTHON`` names an interpreter that has it. Usage:
``OUTLINES_PYTHON=/tmp/oc-venv/bin/python python -m bench.s29_pattern29_quote_index [NAME_PART ...]``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

from gateway.pattern_quote import QUOTE_READING_FORMATS, pattern_reads_quote
from tests.support.ordinary_patterns import ORDINARY as ORDINARY_PATTERNS

CHILD = r'''
import json, resource, sys, time
resource.setrlimit(resource.RLIMIT_AS, (3 << 30, 3 << 30))
resource.setrlimit(resource.RLIMIT_CPU, (60, 60))
from outlines_core import Index, Vocabulary
from outlines_core.json_schema import build_regex_from_schema
regex = build_regex_from_schema(sys.stdin.read())
tokens = {c: [i] for i, c in enumerate([chr(c) for c in range(32, 127)] + ["\n"])}
t = time.process_time()
Index(regex, Vocabulary(len(tokens) + 1, tokens))
print(json.dumps({"regex": len(regex), "index_s": round(time.process_time() - t, 3),
                  "rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024}))
'''


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
    """Whether the gateway's default refuses ``schema`` (a ``pattern`` reads ``"``, or ``format: uri``)."""
    for s in schema.get("properties", {}).values():
        if ("pattern" in s and pattern_reads_quote(s["pattern"])) or s.get("format") in QUOTE_READING_FORMATS:
            return "400"
    return "admitted"


def main() -> None:
    python = os.environ.get("OUTLINES_PYTHON", "python3")
    only = sys.argv[1:]
    print("| required properties | gateway (default) | outlines-core: regex chars, Index CPU s, peak RSS MB |")
    print("|---|---|---|")
    for name, schema in CASES.items():
        if only and not any(part in name for part in only):
            continue
        text = json.dumps(schema, separators=(",", ":"))
        try:
            p = subprocess.run([python, "-c", CHILD], input=text, capture_output=True, text=True, timeout=900)
            out = p.stdout.strip() or f"killed (rc {p.returncode}: 60 s CPU or 3 GiB)"
        except subprocess.TimeoutExpired:  # a loaded machine: the child's 60 s of CPU not reached in 900 s
            out = "not finished in 900 s wall"
        print(f"| {name} | {_verdict(schema)} | {out} |", flush=True)


if __name__ == "__main__":
    main()
