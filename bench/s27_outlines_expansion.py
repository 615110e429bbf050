"""Session 27 review (review27): what outlines-core builds from schemas the gateway's ``limits.json_schema`` accepts.

For each schema: its compact JSON bytes, the gateway's inlined count (:func:`gateway.schema_refs.inlined_bytes`)
and verdict (:func:`gateway.response_format.response_format_refusal`, default limits), and, when ``outlines_core``
imports, the length of the regular expression ``outlines_core.json_schema.build_regex_from_schema`` builds from it
(the step before its automaton) and that call's CPU; then the gateway's own CPU for the check on crafted schemas.
outlines-core is not a dependency of the project: install it
in a scratch environment (``pip install outlines-core==0.2.14``) and put its site-packages on ``PYTHONPATH`` after
this tree. Markdown table on stdout. Usage: ``python -m bench.s27_outlines_expansion [--index N]``.
"""

from __future__ import annotations

import json
import time
from typing import Any

import orjson

from gateway.config_http import JsonSchemaLimits
from gateway.response_format import response_format_refusal
from gateway.schema_refs import inlined_bytes
from sim.click_options import ClickOptions

try:
    from outlines_core.json_schema import build_regex_from_schema
except ImportError:  # the gateway's side only
    build_regex_from_schema = None


def _self_root(k: int, required: bool = False) -> dict[str, Any]:
    s: dict[str, Any] = {"type": "object", "properties": {f"p{i}": {"$ref": "#"} for i in range(k)}}
    if required:
        s["required"] = list(s["properties"])
    return s


def _flat_optional(n: int) -> dict[str, Any]:
    return {"type": "object", "properties": {f"p{i}": {"type": "integer"} for i in range(n)}}


def _nested_optional(levels: int, k: int) -> dict[str, Any]:
    s: dict[str, Any] = {"type": "integer"}
    for _ in range(levels):
        props = {"n": s, **{f"p{i}": {"type": "integer"} for i in range(k - 1)}}
        s = {"type": "object", "properties": props}
    return s


def _nested_arrays(levels: int) -> dict[str, Any]:
    s: dict[str, Any] = {"type": "integer"}
    for _ in range(levels):
        s = {"type": "array", "items": s}
    return s


CASES = [
    ("ref cycle: 2 optional properties {$ref: '#'}", _self_root(2)),
    ("ref cycle: 6 optional properties {$ref: '#'}", _self_root(6)),
    ("ref cycle: 10 required properties {$ref: '#'}", _self_root(10, required=True)),
    ("flat: 400 optional integer properties", _flat_optional(400)),
    ("flat: 800 optional integer properties", _flat_optional(800)),
    ("nested: 6 objects of 5 optional properties", _nested_optional(6, 5)),
    ("nested: 16 arrays of arrays", _nested_arrays(16)),
]


def _nested_targets(depth: int, pad: int) -> dict[str, Any]:
    """A chain of ``depth`` nested lists (each with a ``pad``-character string) and one distinct reference to each
    level (``#/allOf/0/0/...``): the count encodes each referenced level once, overlapping (S27-review27-5)."""
    node: Any = [{}]
    for _ in range(depth):
        node = [node, "x" * pad]
    return {"allOf": [node], "anyOf": [{"$ref": "#/allOf/0" + "/0" * i} for i in range(depth)]}


def _cpu_table(limits: JsonSchemaLimits, rounds: int = 20) -> None:
    """The gateway's CPU for :func:`response_format_refusal` (ms per call, the best of ``rounds``)."""
    size = lambda v: len(orjson.dumps(v))  # noqa: E731
    print()
    print("| gateway check | body bytes | verdict | CPU ms per call (best of 20) |")
    print("|---|---:|---|---:|")
    for name, schema in [("180 nested list targets, 120-char pads", _nested_targets(180, 120)),
                         ("100 nested list targets, 450-char pads", _nested_targets(100, 450)),
                         ("ref cycle: 12 optional properties {$ref: '#'}", _self_root(12)),
                         ("flat: 2,000 optional integer properties", _flat_optional(2000))]:
        rf = {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}
        body = size(rf)
        best = float("inf")
        for _ in range(rounds):
            t = time.process_time()
            err = response_format_refusal(rf, limits, {}, body)
            best = min(best, time.process_time() - t)
        verdict = "accepted" if err is None else f"400 ({err.record['reason'].split('.')[-1]})"
        print(f"| {name} | {body:,} | {verdict} | {best * 1000:.2f} |")


def _index(n: int) -> None:
    """outlines-core's ``Index`` of :func:`_flat_optional` ``(n)``: what a replica builds before the first token."""
    import resource

    from outlines_core import Index, Vocabulary

    tokens = {c: [i] for i, c in enumerate(list('{}[]",:0123456789-.eEtrufalsn abcdp') + ["\n"])}
    schema = _flat_optional(n)
    regex = build_regex_from_schema(json.dumps(schema))
    t = time.process_time()
    Index(regex, Vocabulary(len(tokens) + 1, tokens))
    print(f"{n} optional integer properties: {len(orjson.dumps(schema)):,} JSON bytes, {len(regex):,} regex chars, "
          f"Index {time.process_time() - t:.2f} s CPU, peak RSS "
          f"{resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024} MB")


def main() -> None:
    ap = ClickOptions(prog="python -m bench.s27_outlines_expansion", description=__doc__.splitlines()[0])
    ap.option("--index", type=int, default=0,
              help="instead: build outlines-core's Index (its automaton) for N optional integer properties "
                   "with a 37-token vocabulary; print its CPU seconds and the process's peak RSS (MB)")
    args = ap.parse(None)
    if args.index:
        _index(args.index)
        return
    limits = JsonSchemaLimits()
    size = lambda v: len(orjson.dumps(v))  # noqa: E731
    print("| schema | JSON bytes | gateway inlined count | gateway verdict | outlines-core regex chars | its CPU ms |")
    print("|---|---:|---:|---|---:|---:|")
    for name, schema in CASES:
        rf = {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}
        err = response_format_refusal(rf, limits, {}, size(rf))
        verdict = "accepted" if err is None else f"400 ({err.record['reason'].split('.')[-1]})"
        regex, cpu = "-", "-"
        if build_regex_from_schema is not None:
            t = time.process_time()
            regex = f"{len(build_regex_from_schema(json.dumps(schema))):,}"
            cpu = f"{(time.process_time() - t) * 1000:.1f}"
        print(f"| {name} | {size(schema):,} | {inlined_bytes(schema, size, 1 << 40):,} | {verdict} | {regex} | {cpu} |")
    _cpu_table(limits)


if __name__ == "__main__":
    main()
