"""Session 27 (expand27, S27-review27-3): :func:`gateway.schema_expansion.regex_chars` (the gateway's upper bound)
against the length of the regular expression outlines-core 0.2.14 really builds (``build_regex_from_schema``), on
review27's blow-up shapes, a few more, the ordinary corpus (tests/support/ordinary_schemas.py), vLLM's ``tool_choice:
"required"`` schema of that corpus, and seeded random schemas; then the estimate's CPU on a 64 KiB schema.

outlines-core is not a project dependency: put a scratch environment's site-packages after this tree on
``PYTHONPATH`` (``pip install outlines-core==0.2.14``). Markdown on stdout. Usage:
``python -m bench.s27_expand27_estimate [--random N] [--seed S]``.
"""

from __future__ import annotations

import json
import random
import time
from typing import Any

import orjson
from outlines_core.json_schema import build_regex_from_schema

from gateway.schema_expansion import regex_chars, required_tools_chars
from sim.click_options import ClickOptions
from tests.support.ordinary_schemas import ORDINARY

BIG = 1 << 60
#: random schemas whose estimate passes this are not built (outlines-core's memory)
BUILD_LIMIT = 20_000_000


def _optional(n: int) -> dict[str, Any]:
    return {"type": "object", "properties": {f"p{i}": {"type": "integer"} for i in range(n)}}


def _nested_optional(levels: int, k: int) -> dict[str, Any]:
    s: dict[str, Any] = {"type": "integer"}
    for _ in range(levels):
        s = {"type": "object", "properties": {"n": s, **{f"p{i}": {"type": "integer"} for i in range(k - 1)}}}
    return s


def _arrays(levels: int) -> dict[str, Any]:
    s: dict[str, Any] = {"type": "integer"}
    for _ in range(levels):
        s = {"type": "array", "items": s}
    return s


def _self_root(k: int, required: bool = False) -> dict[str, Any]:
    s: dict[str, Any] = {"type": "object", "properties": {f"p{i}": {"$ref": "#"} for i in range(k)}}
    if required:
        s["required"] = list(s["properties"])
    return s


KNOWN = [
    ("review27: 400 optional integer properties", _optional(400)),
    ("review27: 6 nested objects of 5 optional properties", _nested_optional(6, 5)),
    ("review27: 16 nested arrays", _arrays(16)),
    ("S27-review27-1: ref cycle, 6 optional {$ref: '#'}", _self_root(6)),
    ("S27-review27-1: ref cycle, 8 optional {$ref: '#'}", _self_root(8)),
    ("S27-review27-1: ref cycle, 10 required {$ref: '#'}", _self_root(10, True)),
    ("200 optional integer properties", _optional(200)),
    ("100 optional integer properties", _optional(100)),
    ("bare object, depth 6 (29 bytes)", {"type": "object", "depth": 6}),
    ("empty schema {}", {}),
]

_LEAVES = [{"type": "string"}, {"type": "integer"}, {"type": "number"}, {"type": "boolean"}, {"type": "null"},
           {"type": "string", "format": "date-time"}, {"type": "string", "maxLength": 20},
           {"type": "string", "pattern": "^[a-z]+$"}, {"enum": ["a.b", "c(d", 1, None]}, {"const": "x|y"},
           {"type": ["string", "null"]}, {"type": "object"}, {"type": "array"}, {}]


def _random(rng: random.Random, depth: int) -> dict[str, Any]:
    """A random schema over the keywords outlines-core supports (``$ref`` to its ``$defs`` and to the root)."""
    if depth <= 0 or rng.random() < 0.3:
        return dict(rng.choice(_LEAVES))
    kind = rng.choice(["props", "props", "props_req", "array", "anyOf", "oneOf", "allOf", "prefix", "ap", "ref"])
    if kind in ("props", "props_req"):
        n = rng.randint(0, 8)
        s: dict[str, Any] = {"type": "object", "properties": {f"k{i}.{rng.randint(0, 9)}": _random(rng, depth - 1)
                                                              for i in range(n)}}
        if kind == "props_req" and n:
            s["required"] = rng.sample(list(s["properties"]), rng.randint(1, n))
        return s
    if kind == "array":
        s = {"type": "array", "items": _random(rng, depth - 1)}
        if rng.random() < 0.3:
            s["minItems"], s["maxItems"] = 1, rng.randint(1, 9)
        return s
    if kind in ("anyOf", "oneOf", "allOf", "prefix"):
        key = {"prefix": "prefixItems"}.get(kind, kind)
        return {key: [_random(rng, depth - 1) for _ in range(rng.randint(1, 4))]}
    if kind == "ap":
        return {"type": "object", "additionalProperties": _random(rng, depth - 1)}
    return {"$ref": rng.choice(["#/$defs/d0", "#/$defs/d1", "#"])}


def _root(rng: random.Random) -> dict[str, Any]:
    s = _random(rng, 4)
    if "$ref" in s or not s:
        s = {"type": "object", "properties": {"r": s}}
    return {**s, "$defs": {"d0": _random(rng, 2), "d1": _random(rng, 3)}}


def _row(name: str, schema: Any, estimate: int | None = None) -> tuple[int, int | None]:
    est = regex_chars(schema, BIG) if estimate is None else estimate
    if est > BUILD_LIMIT:
        print(f"| {name} | {len(orjson.dumps(schema)):,} | {est:,} | not built | - |")
        return est, None
    try:
        actual = len(build_regex_from_schema(json.dumps(schema)))
    except Exception as exc:  # noqa: BLE001 - outlines-core refuses it: nothing built
        print(f"| {name} | {len(orjson.dumps(schema)):,} | {est:,} | refused ({type(exc).__name__}) | - |")
        return est, 0
    print(f"| {name} | {len(orjson.dumps(schema)):,} | {est:,} | {actual:,} | {est / max(actual, 1):.2f} |")
    return est, actual


def _cpu(rounds: int = 10) -> None:
    """The estimate's CPU on schemas of about 64 KiB (ms, the best of ``rounds``)."""
    wide = _optional(2_500)  # ~64 KiB of optional properties, no cap (the whole walk)
    nested: dict[str, Any] = {"type": "object", "properties": {}}
    for i in range(258):  # objects 3 deep of ordinary properties, ~64 KiB
        nested["properties"][f"group_{i}"] = {"type": "object", "required": ["a"], "properties": {
            "a": {"type": "string"}, "b": {"type": "array", "items": {"type": "object", "properties": {
                "x": {"type": "number"}, "y": {"enum": ["one", "two", "three"]}}}}, "c": {"anyOf": [
                {"type": "integer"}, {"type": "null"}]}}}
    cycle = {"$defs": {f"d{i}": {"type": "object", "properties": {f"p{j}": {"$ref": f"#/$defs/d{(i + j) % 60}"}
                                                                     for j in range(30)}} for i in range(60)},
             "$ref": "#/$defs/d0"}
    print()
    print("| schema | JSON bytes | estimate (cap 10**6) | CPU ms, uncapped | CPU ms, cap 10**6 |")
    print("|---|---:|---:|---:|---:|")
    for name, schema in [("2,500 optional integer properties", wide), ("258 objects 3 deep", nested),
                         ("60 definitions x 30 references (a cycle)", cycle)]:
        times = {}
        for cap in (BIG, 1_000_000):
            best = float("inf")
            for _ in range(rounds):
                t = time.process_time()
                regex_chars(schema, cap)
                best = min(best, time.process_time() - t)
            times[cap] = best * 1000
        print(f"| {name} | {len(orjson.dumps(schema)):,} | {regex_chars(schema, 1_000_000):,} | {times[BIG]:.2f} | "
              f"{times[1_000_000]:.2f} |")


def main() -> None:
    ap = ClickOptions(prog="python -m bench.s27_expand27_estimate", description=__doc__.splitlines()[0])
    ap.option("--random", type=int, default=30, help="random schemas to compare")
    ap.option("--seed", type=int, default=27, help="their seed")
    args = ap.parse(None)
    print("| schema | JSON bytes | estimate | outlines-core 0.2.14 regex chars | estimate / actual |")
    print("|---|---:|---:|---:|---:|")
    worst: tuple[float, str] = (float("inf"), "")
    for name, schema in [*KNOWN, *((f"ordinary: {k}", v) for k, v in ORDINARY.items())]:
        est, actual = _row(name, schema)
        if actual:
            worst = min(worst, (est / actual, name))
    tools = [(k.split()[0], v) for k, v in ORDINARY.items()]
    defs = {k: v for _, p in tools for k, v in p.get("$defs", {}).items()}  # vLLM hoists each tool's $defs
    wrapper = {"type": "array", "minItems": 1, "items": {"type": "object", "anyOf": [
        {"properties": {"name": {"type": "string", "enum": [n]}, "parameters": {
            k: v for k, v in p.items() if k != "$defs"}}, "required": ["name", "parameters"]} for n, p in tools]},
        "$defs": defs}
    est, actual = _row("ordinary: all 13 as vLLM's tool_choice required", wrapper,
                       required_tools_chars([(n, regex_chars(p, BIG)) for n, p in tools]))
    if actual:
        worst = min(worst, (est / actual, "required wrapper"))
    rng = random.Random(args.seed)
    for i in range(args.random):
        schema = _root(rng)
        est, actual = _row(f"random {i}", schema)
        if actual:
            worst = min(worst, (est / actual, f"random {i}"))
    print(f"\nsmallest estimate / actual over the schemas built: {worst[0]:.3f} ({worst[1]})")
    _cpu()


if __name__ == "__main__":
    main()
