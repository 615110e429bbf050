"""Session 31 (tools31, S31-review31-4): what outlines-core 0.2.14 builds for a named ``tool_choice`` under SGLang
(``{"type": "array", "minItems": 1, "items": <the tool's member>}``, and with ``maxItems`` 1 when the body says
``parallel_tool_calls: false``) beside the tool's ``parameters`` alone (vLLM's named choice), and what the gateway
counts for each (:func:`gateway.response_format.tools_refusal`: ``max_pattern_states`` and ``max_regex_chars``).

Per case: the copies of the pattern in outlines-core's regular expression, its length, the ``Index`` CPU and the byte
DFA's states (bench/s30_pattern30_states.py's child: 3 GiB, ``--cpu`` s), and the gateway's estimate of the same
schema (:func:`gateway.schema_expansion.regex_chars`) with the states it counts for the tool
(:func:`gateway.pattern_states.pattern_states` x the copies ``tools_refusal`` takes for that ``tool_choice``).

outlines-core is not a project dependency: ``OUTLINES_PYTHON`` names an interpreter that has it. Usage:
``OUTLINES_PYTHON=/tmp/oc-venv/bin/python python -m bench.s31_tools31_named_choice``. Markdown on stdout, the load
average first. ``... named_choice cpu``: the gateway's in-process thread CPU of ``tools_refusal`` per call (median of
15 rounds of 20 calls, the pattern cache warm) over each ordinary schema of tests/support/ordinary_schemas.py as one
tool, and over all 13 as one body's tools, with no ``tool_choice`` and with one naming the (first) tool, alternated
twice (A/A); ``quote_reading_patterns: allow`` (three of them hold ``format`` ``email`` / ``uri``).
``... named_choice anchor`` (S30-attack30-4, S31-tools31-2): thread CPU of ``response_format_refusal`` over a 30 KB
schema with 6,000 containers in ``default``, its reference a pointer (no scan) or a name (``#s``: one scan), median of
15, alternated twice.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from typing import Any

from bench.s30_pattern30_states import _index, _one
from gateway.config_http import JsonSchemaLimits
from gateway.response_format import tools_refusal
from gateway.pattern_states import pattern_states
from gateway.schema_expansion import regex_chars
from gateway.tool_schemas import sglang_schemas

_REGEX = ("import json, resource, sys; resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30)); "
          "from outlines_core.json_schema import build_regex_from_schema as b; "
          "r = b(sys.stdin.read()); print(json.dumps([len(r), r.count(sys.argv[1])]))")


def _regex(schema: dict[str, Any], pattern: str, python: str) -> str:
    """outlines-core's regular expression of ``schema``: ``chars, copies of pattern`` (a bounded child)."""
    p = subprocess.run([python, "-c", _REGEX, pattern], input=json.dumps(schema), capture_output=True, text=True,
                       timeout=120)
    if p.returncode != 0:
        return f"error (rc {p.returncode})"
    chars, copies = json.loads(p.stdout)
    return f"{chars:,} chars, pattern x{copies}"


def main() -> None:
    python = os.environ.get("OUTLINES_PYTHON", "python3")
    cpu_s = 20
    with open("/proc/loadavg") as f:
        print(f"load average: {f.read().split()[:3]}\n")
    print("| pattern in the tool | schema compiled | outlines-core regex | Index CPU s, byte-DFA states | gateway: regex "
          "estimate, states counted |")
    print("|---|---|---|---|---|")
    for k in (10, 12):
        pattern = "[ab]*a" + "[ab]" * k
        tools = [{"type": "function", "function": {"name": "f", "parameters": _one(pattern)}}]
        named = sglang_schemas(tools)[1][0]
        assert named is not None
        states = pattern_states(pattern, 1 << 20)
        cases = [("parameters alone (vLLM named)", _one(pattern), 1),
                 ("SGLang named array", named, 2),
                 ("SGLang named array, maxItems 1", {**named, "maxItems": 1}, 2)]
        for label, schema, copies in cases:
            idx = _index(schema, python, cpu_s)
            built = (f"{idx['index_s']}, {idx.get('dfa_states', '-'):,}" if isinstance(idx, dict) else idx)
            print(f"| `{pattern}` | {label} | {_regex(schema, pattern, python)} | {built} | "
                  f"{regex_chars(schema, 1 << 62):,}, {states * copies:,} |", flush=True)
    # a second property referring to the first through SGLang's array (``#/items/...``): the pattern 4 times there
    pattern = "[ab]*a" + "[ab]" * 11
    params = {"type": "object", "required": ["s", "b"], "properties": {
        "s": {"type": "string", "pattern": pattern}, "b": {"$ref": "#/items/properties/parameters/properties/s"}}}
    named = sglang_schemas([{"type": "function", "function": {"name": "f", "parameters": params}}])[1][0]
    assert named is not None
    idx = _index(named, python, cpu_s)
    built = f"{idx['index_s']}, {idx.get('dfa_states', '-'):,}" if isinstance(idx, dict) else idx
    print(f"| `{pattern}` and a `$ref` to it through `#/items/...` | SGLang named array | "
          f"{_regex(named, pattern, python)} | {built} | {regex_chars(named, 1 << 62):,}, - |", flush=True)
    # two unconstrained objects (outlines-core's ``depth``): the regular expression only (no Index: ~1 M characters)
    wide = {"type": "object", "required": ["x", "y"], "properties": {"x": {"type": "object", "depth": 5},
                                                                     "y": {"type": "object", "depth": 4}}}
    named = sglang_schemas([{"type": "function", "function": {"name": "f", "parameters": wide}}])[1][0]
    assert named is not None
    for label, schema in (("parameters alone (vLLM named)", wide), ("SGLang named array", named)):
        chars = _regex(schema, "depth", python).split(", pattern")[0]
        print(f"| none (`depth` 5 and 4 objects) | {label} | {chars} | - | {regex_chars(schema, 1 << 62):,}, - |",
              flush=True)


#: three ordinary schemas hold ``format`` ``email`` / ``uri`` (refused by ``quote_reading_patterns``): allowed here so
#: that every bound runs
_ALLOW = {"quote_reading_patterns": "allow"}


def _us(tools: list[Any], choice: Any) -> float:
    """Median thread CPU µs of one ``tools_refusal`` call (15 rounds of 20)."""
    limits, rounds = JsonSchemaLimits(), []
    for _ in range(15):
        t = time.thread_time_ns()
        for _ in range(20):
            tools_refusal(tools, limits, _ALLOW, 100, choice, "bench")
        rounds.append((time.thread_time_ns() - t) / 20 / 1000)
    return statistics.median(rounds)


def cpu_main() -> None:
    from tests.support.ordinary_schemas import ORDINARY
    with open("/proc/loadavg") as f:
        print(f"load average: {f.read().split()[:3]}\n")
    print("| tools | no tool_choice µs (A, A') | named tool_choice µs (B, B') |")
    print("|---|---|---|")
    bodies = {name: [{"type": "function", "function": {"name": "f", "parameters": schema}}]
              for name, schema in ORDINARY.items()}
    bodies["all 13 (the first named)"] = [{"type": "function", "function": {"name": "f" if i == 0 else f"t{i}",
                                                                            "parameters": schema}}
                                          for i, schema in enumerate(ORDINARY.values())]
    named = {"type": "function", "function": {"name": "f"}}
    for name, tools in bodies.items():
        assert tools_refusal(tools, JsonSchemaLimits(), _ALLOW, 100, named, "bench") is None, name
        a, b, a2, b2 = _us(tools, None), _us(tools, named), _us(tools, None), _us(tools, named)
        print(f"| {name} | {a:.0f}, {a2:.0f} | {b:.0f}, {b2:.0f} |", flush=True)


def anchor_main() -> None:
    from gateway.response_format import response_format_refusal
    with open("/proc/loadavg") as f:
        print(f"load average: {f.read().split()[:3]}\n")
    data = [{"k": [1, {"v": "x"}]} for _ in range(1500)]
    limits = JsonSchemaLimits()
    print("| reference | schema JSON bytes | thread CPU µs per call |")
    print("|---|---|---|")
    for ref in ("#/$defs/s", "#s", "#/$defs/s", "#s"):
        rf = {"type": "json_schema", "json_schema": {"name": "a", "schema": {
            "type": "object", "properties": {"a": {"$ref": ref}, "b": {"type": "string"}}, "default": data,
            "$defs": {"s": {"type": "string"}}}}}
        rounds = []
        for _ in range(15):
            t = time.thread_time_ns()
            response_format_refusal(rf, limits, {}, 100, "bench")
            rounds.append((time.thread_time_ns() - t) / 1000)
        print(f"| `{ref}` | {len(json.dumps(rf, separators=(',', ':'))):,} | {statistics.median(rounds):,.0f} |")


if __name__ == "__main__":
    {"cpu": cpu_main, "anchor": anchor_main}.get(sys.argv[1] if sys.argv[1:] else "", main)()
