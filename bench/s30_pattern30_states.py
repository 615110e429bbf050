"""Session 30 (pattern30, S30-pattern30-1, S29-pattern29-2): outlines-core 0.2.14's ``Index`` for quote-free patterns
beside the gateway's state count (:func:`gateway.pattern_states.pattern_states`) and its CPU.

``index``: each pattern as the one required property of an object, built in a child process (3 GiB of address
space, ``--cpu`` s of CPU, default 20) over a vocabulary of the 95 printable ASCII characters and ``\\n`` (one token
each, as bench/s29_pattern29_quote_index.py): the ``Index`` CPU and the child's peak RSS; then, when that took under
2 s, the same ``Index`` over the 256 single bytes, whose states (``len(get_transitions())``) are the DFA's byte-level
states: outlines-core's own count, the reference of the gateway's. ``cpu``: the gateway's in-process thread CPU of
``pattern_states`` per ordinary pattern (median of 7 runs, cache-free) and of
:func:`gateway.response_format.response_format_refusal` over one schema of every quote-free ordinary pattern with
``max_pattern_states`` off, on (its cache cleared before each call) and on (cached), alternated twice (A/A).

outlines-core is not a project dependency: ``OUTLINES_PYTHON`` names an interpreter that has it. Usage:
``OUTLINES_PYTHON=/tmp/oc-venv/bin/python python -m bench.s30_pattern30_states index [NAME_PART ...]`` and
``python -m bench.s30_pattern30_states cpu``. ``index --big ...``: a vocabulary of 26,792 tokens (the 96, every
2-character string of printable ASCII and every 3-letter one of ``[a-z]``), nearer a real tokenizer's per-state cost
(no byte-DFA pass). ``rss_mb``: the child's peak (``VmHWM``), ``index_mb``: its growth during the ``Index``. Markdown on stdout, the load average first.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

from bench.harness import median_thread_cpu_us as _us
from gateway.config_http import JsonSchemaLimits
from gateway.pattern_quote import pattern_reads_quote
from gateway.pattern_states import pattern_states
from gateway.response_format import response_format_refusal
from gateway.schema_patterns import states_cache_clear
from tests.support.ordinary_patterns import ORDINARY

ALPHABET = [chr(c) for c in range(32, 127)] + ["\n"]
REPORT_CAP = 1 << 18
_CHILD = r'''
import json, resource, sys, time
resource.setrlimit(resource.RLIMIT_AS, (3 << 30, 3 << 30))
resource.setrlimit(resource.RLIMIT_CPU, (int(sys.argv[2]), int(sys.argv[2])))
from outlines_core import Index, Vocabulary
from outlines_core.json_schema import build_regex_from_schema
regex = build_regex_from_schema(sys.stdin.read())
def hwm():  # this process's own peak (ru_maxrss keeps the forking parent's across exec)
    return next(int(l.split()[1]) for l in open("/proc/self/status") if l.startswith("VmHWM")) // 1024
alphabet = json.loads(sys.argv[1])
if sys.argv[3] == "big":  # + every 2-character string of printable ASCII and 3 of [a-z]: 26,792 tokens
    alphabet += [a + b for a in alphabet[:95] for b in alphabet[:95]]
    alphabet += [a + b + c for a in "abcdefghijklmnopqrstuvwxyz" for b in "abcdefghijklmnopqrstuvwxyz" for c in "abcdefghijklmnopqrstuvwxyz"]
tokens = {c: [i] for i, c in enumerate(alphabet)}
base = hwm()
t = time.process_time()
Index(regex, Vocabulary(len(tokens) + 1, tokens))
out = {"index_s": round(time.process_time() - t, 3), "rss_mb": hwm(), "index_mb": hwm() - base}
print(json.dumps(out), flush=True)
if out["index_s"] < 2 and sys.argv[3] != "big":
    index = Index(regex, Vocabulary(256, {bytes([b]): [b] for b in range(256)}))
    out["dfa_states"] = len(index.get_transitions())
print(json.dumps(out), flush=True)
'''


def _one(pattern: str) -> dict[str, Any]:
    return {"type": "object", "properties": {"a": {"type": "string", "pattern": pattern}}, "required": ["a"]}


def _index(pattern: str | dict[str, Any], python: str, cpu_s: int, vocab: str = "small") -> dict[str, Any] | str:
    schema = _one(pattern) if isinstance(pattern, str) else pattern
    try:
        p = subprocess.run([python, "-c", _CHILD, json.dumps(ALPHABET), str(cpu_s), vocab], input=json.dumps(schema),
                           capture_output=True, text=True, timeout=cpu_s * 4 + 60)
    except subprocess.TimeoutExpired:
        return "not finished (wall)"
    lines = p.stdout.strip().splitlines()
    if not lines:
        return f"killed (rc {p.returncode}: {cpu_s} s CPU or 3 GiB)" if p.returncode < 0 else f"error (rc {p.returncode})"
    return json.loads(lines[-1])


#: cycle lengths whose product the DFA of their alternation needs (7 x 11 x ... x 23: 7.4 M)
CYCLES = (7, 11, 13, 17, 19, 23)


def _family() -> dict[str, str]:
    cases: dict[str, str] = {"(?:a{7})*|(?:a{11})*|(?:a{13})* in one pattern": "^(?:(?:a{7})*|(?:a{11})*|(?:a{13})*)$",
                             "the 6 cycles in one pattern": "^(?:" + "|".join(f"(?:a{{{p}}})*" for p in CYCLES) + ")$"}
    for k in (8, 10, 11, 12, 13, 14, 15, 16, 18, 20):
        cases[f"[ab]*a + {k} [ab]"] = "[ab]*a" + "[ab]" * k
    for k in (10, 12, 13, 14, 16):
        cases[f"(a|b)*a(a|b){{{k}}}"] = f"(a|b)*a(a|b){{{k}}}"
    for k in (6, 7, 8):
        cases[f"[ab]*a([ab]{{2}}){{{k}}} (nested counts)"] = f"[ab]*a([ab]{{2}}){{{k}}}"
    for k in (10, 12, 14):
        cases[f"[a-z]*x[a-z]{{{k}}} (overlapping classes)"] = f"[a-z]*x[a-z]{{{k}}}"
        cases[f"(ab|a|b)*a(ab|a|b){{{k}}} (alternations)"] = f"(ab|a|b)*a(ab|a|b){{{k}}}"
        cases[f"[0-9]{{1,{k}}}[0-9a-f]{{{k}}} (a counted overlap)"] = f"[0-9]{{1,{k}}}[0-9a-f]{{{k}}}"
    for k in (1024, 4096, 16000):  # linear, a permissive class: every state allows many tokens
        cases[f"[a-z0-9]{{1,{k}}}"] = f"^[a-z0-9]{{1,{k}}}$"
    for k in (64, 256, 1024):
        cases[f"\\w{{1,{k}}}"] = f"^\\w{{1,{k}}}$"
    cases["email w-bounded"] = "^[\\w.+-]{1,64}@[\\w-]{1,63}(\\.[\\w-]{1,63}){1,8}$"
    cases["file path rewritten"] = '^(/[^"/\\x00]{1,255}){1,32}$'
    cases["file path rewritten, 8 levels of 64"] = '^(/[^"/\\x00]{1,64}){1,8}$'
    return cases


def _schemas() -> dict[str, dict[str, Any]]:
    """Where outlines-core writes one pattern several times or beside another (what a per-pattern sum may miss)."""
    p11, p12 = "[ab]*a" + "[ab]" * 11, "[ab]*a" + "[ab]" * 12
    opt = {f"o{i}": {"type": "string", "pattern": p11} for i in range(4)}
    return {
        "4 optional properties of [ab]*a + 11 [ab]": {"type": "object", "properties": opt},
        "an array of [ab]*a + 12 [ab]": {"type": "array", "items": {"type": "string", "pattern": p12}},
        "an array (maxItems 60) of ordinary date": {"type": "array", "maxItems": 60, "items": {
            "type": "string", "pattern": ORDINARY["date"]}},
        "an array (maxItems 12) of ordinary url bounded": {"type": "array", "maxItems": 12, "items": {
            "type": "string", "pattern": ORDINARY["url bounded"]}},
        "anyOf of [ab]*a + 6 [ab] and [ab]*b + 6 [ab]": _one_any("[ab]*a" + "[ab]" * 6, "[ab]*b" + "[ab]" * 6),
        "anyOf of [ab]*a + 6 [ab] and [ab]*a + 7 [ab]": _one_any("[ab]*a" + "[ab]" * 6, "[ab]*a" + "[ab]" * 7),
        "anyOf of [ab]*a + 6 [ab], [ab]*b + 7 [ab], [ab]*a + 8 [ab]": _one_any(
            "[ab]*a" + "[ab]" * 6, "[ab]*b" + "[ab]" * 7, "[ab]*a" + "[ab]" * 8),
        "anyOf of (?:a{p})* for p 7, 11, 13 (cycles: a product)": _one_any(*[f"^(?:a{{{p}}})*$" for p in CYCLES[:3]]),
        "anyOf of (?:a{p})* for p 7 ... 23 (cycles: a product)": _one_any(*[f"^(?:a{{{p}}})*$" for p in CYCLES]),
    }


def _one_any(*patterns: str) -> dict[str, Any]:
    return {"type": "object", "properties": {"a": {"anyOf": [{"type": "string", "pattern": p} for p in patterns]}},
            "required": ["a"]}


def _verdict(pattern: str | dict[str, Any]) -> str:
    schema = _one(pattern) if isinstance(pattern, str) else pattern
    refused = response_format_refusal({"type": "json_schema", "json_schema": {"name": "x", "schema": schema}},
                                      JsonSchemaLimits(), {}, 0)
    return "admitted" if refused is None else f"400 ({refused.record['reason'].rpartition('.')[2]})"


def index_main(only: list[str]) -> None:
    python = os.environ.get("OUTLINES_PYTHON", "python3")
    cpu_s, vocab = 20, "small"
    if only[:1] == ["--cpu"]:
        cpu_s, only = int(only[1]), only[2:]
    if only[:1] == ["--big"]:
        vocab, only = "big", only[1:]
    cases = {**_family(), **{f"ordinary {k}": v for k, v in ORDINARY.items() if not pattern_reads_quote(v)}}
    print(f"| pattern (one required property) | gateway count (cap {REPORT_CAP:,}) | gateway (default) | outlines-core "
          f"Index CPU s, peak RSS MB (96 tokens), byte-DFA states |")
    print("|---|---|---|---|")
    for name, p in cases.items():
        if only and not any(part in name for part in only):
            continue
        n = pattern_states(p, REPORT_CAP)
        shown = f"over {REPORT_CAP:,}" if n > REPORT_CAP else f"{n:,}"
        print(f"| {name} | {shown} | {_verdict(p)} | {_index(p, python, cpu_s, vocab)} |", flush=True)
    for name, schema in _schemas().items():
        if only and not any(part in name for part in only):
            continue
        print(f"| schema: {name} | (summed in the walk) | {_verdict(schema)} | {_index(schema, python, cpu_s, vocab)} |",
              flush=True)


def cpu_main() -> None:
    print("| pattern | states counted | thread CPU µs per call (uncached) |")
    print("|---|---|---|")
    for name, p in ORDINARY.items():
        if pattern_reads_quote(p):
            continue
        print(f"| {name} | {pattern_states(p, 1 << 16):,} | {_us(lambda: pattern_states(p, 1 << 16), 20):.0f} |")
    for name, p in {"[ab]*a + 20 [ab]": "[ab]*a" + "[ab]" * 20, "email w-bounded":
                    "^[\\w.+-]{1,64}@[\\w-]{1,63}(\\.[\\w-]{1,63}){1,8}$",
                    "(?:[a-z0-9] or x){1000} (1,000 positions, wide)": "(?:[a-z0-9]|x){1000}",
                    "1,024 literal characters": "a" * 1024}.items():
        cap = JsonSchemaLimits().max_pattern_states
        print(f"| {name} (default cap) | {pattern_states(p, cap):,} | {_us(lambda: pattern_states(p, cap), 3):.0f} |")
    admitted = [v for v in ORDINARY.values() if not pattern_reads_quote(v)]
    schema = {"type": "object", "properties": {f"p{i}": {"type": "string", "pattern": v}
                                               for i, v in enumerate(admitted)}}
    rf = {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}
    print()
    print("| response_format_refusal, one schema of the quote-free ordinary patterns | thread CPU µs per call |")
    print("|---|---|")
    wide = {"max_pattern_chars": 4096, "max_pattern_states": 1 << 18}
    for _ in range(2):
        for mode in ("off", "on, uncached", "on, cached"):
            over = {**wide, "max_pattern_states": None} if mode == "off" else wide
            assert response_format_refusal(rf, JsonSchemaLimits(), over, 100) is None, mode

            def call() -> None:
                if mode == "on, uncached":
                    states_cache_clear()
                response_format_refusal(rf, JsonSchemaLimits(), over, 100)
            print(f"| {len(admitted)} patterns, {mode} | {_us(call, 10):.0f} |", flush=True)


def main() -> None:
    with open("/proc/loadavg") as f:
        print(f"load average: {f.read().split()[:3]}")
    if sys.argv[1:2] == ["cpu"]:
        cpu_main()
    else:
        index_main(sys.argv[2:] if sys.argv[1:2] == ["index"] else sys.argv[1:])


if __name__ == "__main__":
    main()
