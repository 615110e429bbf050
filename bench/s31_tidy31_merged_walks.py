"""Session 31 (tidy31): the merged pattern-states walk and tool-schema builder against a baseline tree's copies.

gateway/schema_patterns.py ``subtree_states`` now also does what ``ref_copies_states`` did (an optional root to follow
``$ref`` in, a node budget), and gateway/tool_schemas.py ``required_members`` builds both vLLM's and SGLang's
``tool_choice: "required"`` schemas. This loads the baseline's ``schema_patterns.py``, ``schema_expansion.py`` and
``tool_schemas.py`` (an export of a tree before the merge, e.g. 66abcdf4) beside this tree's and:

* ``equal``: compares them on ``--examples`` random schemas per check (seeded): ``subtree_states`` without a root,
  the walk's ``$ref`` copies (answer and the node budget left, budgets 0 to 65,536, caps 1 to 2**20), and the wrappers
  (equal, with the same sharing of containers as the old ones, the client's dicts untouched); prints the counts of
  cases and of non-trivial answers;
* ``cpu``: in-process thread CPU (median of 7 runs, :func:`bench.harness.median_thread_cpu_us`) of both walks on an
  S30-pattern30-6 / S30-review30-2 shaped schema, old and new, the old module loaded twice (A/A), rounds alternated.

Usage: ``python -m bench.s31_tidy31_merged_walks --baseline <export dir> [--examples N]``; Markdown on stdout, the
load average first and last.
"""

from __future__ import annotations

import copy
import importlib.util
import os
import random
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

from bench.harness import median_thread_cpu_us
from gateway import schema_patterns as new_sp
from gateway import tool_schemas as new_ts
from gateway.schema_refs import resolve_ref
from sim.click_options import ClickOptions

PATTERNS = ["[ab]*a[ab][ab][ab]", "^[a-z]{1,8}$", "a", "(a|b)*a(a|b){4}", "\\d{4}", "[ab]*a" + "[ab]" * 9]
REFS = ["#", "#/$defs/a", "#/$defs/b", "#/properties/x", "#/items", "#/nope", "#/default/x", "x", "#/anyOf/0"]


def _load(base: Path, name: str, file: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, base / "gateway" / file)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


def _node(rng: random.Random, depth: int) -> dict[str, Any]:
    """A random schema node: patterns, references, arrays with or without maxItems, objects, anyOf, data."""
    kind = rng.randrange(8 if depth < 4 else 3)
    if kind == 0:
        return {"type": "string", "pattern": rng.choice(PATTERNS)}
    if kind == 1:
        return {"$ref": rng.choice(REFS)}
    if kind == 2:
        return {"type": "integer"}
    if kind == 3:
        return {"type": "array", "items": _node(rng, depth + 1), **({"maxItems": rng.randrange(1, 5)}
                                                                   if rng.random() < 0.5 else {})}
    if kind == 4:
        return {"type": "object", "properties": {k: _node(rng, depth + 1) for k in rng.sample("xyz", rng.randrange(4))}}
    if kind == 5:
        return {**_node(rng, depth + 1), "$ref": rng.choice(REFS)}
    if kind == 6:
        return {"anyOf": [_node(rng, depth + 1) for _ in range(rng.randrange(4))]}
    return {"type": "object", "default": _node(rng, depth + 1), "enum": [_node(rng, depth + 1)]}


def _root(rng: random.Random) -> dict[str, Any]:
    a = _node(rng, 0)
    return {"$defs": {"a": a, "b": _node(rng, 0)}, "properties": {"x": _node(rng, 0)}, "items": _node(rng, 0),
            "default": {"x": a}, "anyOf": [_node(rng, 0)]}


def _tools(rng: random.Random) -> list[Any]:
    out: list[Any] = []
    for _ in range(rng.randrange(5)):
        kind = rng.randrange(6)
        if kind == 0:
            out.append(rng.choice([None, 3, {}, {"type": "function"}, {"function": "f"}]))
            continue
        fn: dict[str, Any] = {"name": rng.choice(["f", "g", 7, None])}
        if kind > 1:
            fn["parameters"] = rng.choice([_root(rng), {}, 5, {"$defs": 3, "type": "object"}, _node(rng, 0)])
        out.append({"type": "function", "function": fn})
    return out


def _shape(x: Any, seen: dict[int, int]) -> Any:
    """``x`` with each container replaced by its structure and the order its identity was first met."""
    if type(x) is tuple:
        return tuple(_shape(v, seen) for v in x)
    if type(x) is dict or type(x) is list:
        if id(x) in seen:
            return ("same", seen[id(x)])
        seen[id(x)] = len(seen)
        items = x.items() if type(x) is dict else enumerate(x)
        return (type(x).__name__, seen[id(x)], [(k, _shape(v, seen)) for k, v in items])
    return x


def equal_main(base: Path, examples: int) -> None:
    old_sp = _load(base, "old_schema_patterns", "schema_patterns.py")
    old_se = _load(base, "old_schema_expansion", "schema_expansion.py")
    old_ts = _load(base, "old_tool_schemas", "tool_schemas.py")
    rng = random.Random(31)
    counts = {"subtree_states": [0, 0], "$ref copies": [0, 0], "budget ran out": [0, 0], "at cap + 1": [0, 0],
              "wrappers": [0, 0]}
    for _ in range(examples):
        root, ref = _root(rng), rng.choice(REFS)
        cap, budget, extra = rng.choice([1, 600, 16_384, 1 << 20]), rng.choice([0, 3, 10, 40, 65_536]), rng.randrange(6)
        old = old_sp.subtree_states(root, "t", cap)
        assert new_sp.subtree_states(root, "t", cap) == old
        counts["subtree_states"][0] += 1
        counts["subtree_states"][1] += old > 0
        o, n = [budget], [budget]
        old = old_sp.ref_copies_states(root, ref, extra, "t", cap, o)
        new = new_sp.subtree_states(resolve_ref(root, ref), "t", cap, extra, root, n)
        assert (new, n) == (old, o), (ref, extra, cap, budget)
        counts["$ref copies"][0] += 1
        counts["$ref copies"][1] += new > 0
        counts["budget ran out"][1] += n[0] < 0
        counts["at cap + 1"][1] += new == cap + 1
        tools = _tools(rng)
        before = copy.deepcopy(tools)
        old_r, new_r = old_se.required_schema(tools), new_ts.required_schema(tools)
        old_s, new_s = old_ts.sglang_schemas(tools), new_ts.sglang_schemas(tools)
        assert (new_r, new_s) == (old_r, old_s)
        ids = {id(t): i for i, t in enumerate(tools)}
        assert _shape((old_r, old_s, tools), dict(ids)) == _shape((new_r, new_s, tools), dict(ids))
        assert tools == before
        counts["wrappers"][0] += 1
        counts["wrappers"][1] += bool(new_r["items"]["anyOf"])
    print("| check | cases equal | of which non-trivial (answer > 0; budget out; cap + 1; tools built) |")
    print("|---|---:|---:|")
    for name, (n_cases, hits) in counts.items():
        print(f"| {name} | {n_cases or counts['$ref copies'][0]:,} | {hits:,} |")


#: 8 properties referring to one definition (S30-pattern30-6's shape) beside 200 plain objects, and an array of
#: references (S30-review30-2's shape)
_DEF = {"type": "object", "properties": {f"p{i}": {"type": "string", "pattern": "[ab]*a[ab]{4}"} for i in range(20)}}
SCHEMA = {"type": "object", "$defs": {"d": _DEF},
          "properties": {**{f"r{i}": {"$ref": "#/$defs/d"} for i in range(8)},
                         **{f"x{i}": {"type": "object", "properties": {"y": {"type": "integer"}}} for i in range(200)}},
          "items": {"$ref": "#/$defs/d"}, "maxItems": 8}
CAP = 1 << 20


def cpu_main(base: Path) -> None:
    old_a, old_b = _load(base, "old_sp_a", "schema_patterns.py"), _load(base, "old_sp_b", "schema_patterns.py")
    calls = {
        "subtree_states, old": lambda: old_a.subtree_states(SCHEMA, "t", CAP),
        "subtree_states, old (A/A copy)": lambda: old_b.subtree_states(SCHEMA, "t", CAP),
        "subtree_states, new": lambda: new_sp.subtree_states(SCHEMA, "t", CAP),
        "ref_copies_states, old": lambda: old_a.ref_copies_states(SCHEMA, "#/$defs/d", 8, "t", CAP, [65_536]),
        "ref_copies_states, old (A/A copy)": lambda: old_b.ref_copies_states(SCHEMA, "#/$defs/d", 8, "t", CAP,
                                                                             [65_536]),
        "subtree_states with root, new": lambda: new_sp.subtree_states(resolve_ref(SCHEMA, "#/$defs/d"), "t", CAP, 8,
                                                                       SCHEMA, [65_536]),
    }
    answers = {name: fn() for name, fn in calls.items()}
    assert len(set(list(answers.values())[:3])) == 1 and len(set(list(answers.values())[3:])) == 1, answers
    rows: dict[str, list[float]] = {}
    for _ in range(3):
        for name, fn in calls.items():
            rows.setdefault(name, []).append(median_thread_cpu_us(fn, 200))
    print("| call (patterns cached) | thread CPU µs per call, 3 rounds |")
    print("|---|---|")
    for name, v in rows.items():
        print(f"| {name} | {' / '.join(f'{x:.1f}' for x in v)} |")


def main() -> None:
    p = ClickOptions(description=__doc__.splitlines()[0])
    p.option("--baseline", required=True, help="an export of the tree before the merge (e.g. 66abcdf4)")
    p.option("--examples", type=int, default=4000)
    args = p.parse()
    print(f"load average: {os.getloadavg()}")
    base = Path(args.baseline)
    equal_main(base, args.examples)
    print()
    cpu_main(base)
    print(f"\nload average: {os.getloadavg()}")


if __name__ == "__main__":
    main()
