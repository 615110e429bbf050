"""Session 26 review (review26, S26-review26-1/-2): thread CPU of ``gateway.request.parse_inference_request`` per
chat body whose ``response_format`` schema holds adversarial local ``$ref`` shapes, per source tree.

One child process per tree and round (``PYTHONPATH`` = the tree), rounds interleaved (A B, then B A, ...); name a
tree twice for an A/A. Each child parses every body ``N`` times and prints ``time.thread_time`` per call (µs,
median of the N) and the answer (``ok`` or the error code). Usage:
``python bench/refused_cpu_s26_refs.py OUT_FILE ROUNDS N TREE [TREE ...]``."""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time

CHILD = r'''
import json, statistics, sys, time
from gateway.config_http import JsonSchemaLimits
from gateway.errors import GatewayError
from gateway.request import parse_inference_request
bodies, n = json.loads(sys.stdin.read()), int(sys.argv[1])
lim = JsonSchemaLimits()
out = {}
for name, text in bodies.items():
    raw = text.encode()
    times, answer = [], "ok"
    for _ in range(n):
        t0 = time.thread_time()
        try:
            parse_inference_request(raw, "chat", 32, json_schema=lim)
        except GatewayError as err:
            answer = err.code
        times.append((time.thread_time() - t0) * 1e6)
    out[name] = [statistics.median(times), answer]
print(json.dumps(out))
'''

PRE = '{"model":"m","messages":[{"role":"user","content":"hi"}],"max_tokens":3,'


def rf(schema: object) -> str:
    """A chat body whose ``response_format`` JSON schema is ``schema``."""
    return PRE + '"response_format":{"type":"json_schema","json_schema":{"name":"x","schema":' + json.dumps(
        schema, separators=(",", ":")) + "}}}"


def nested(levels: int) -> dict:
    """``levels`` schema levels, each ``{"properties": {"a": ...}}``."""
    node: dict = {"type": "string"}
    for _ in range(levels):
        node = {"type": "object", "properties": {"a": node}}
    return node


def _bodies() -> dict[str, str]:
    deep = nested(13)
    pointers = ["#" + "/properties/a" * (1 + i % 13) for i in range(300)]
    deep_refs = dict(deep, anyOf=[{"$ref": p} for p in pointers])
    ring = {f"d{i}": {"anyOf": [{"$ref": f"#/$defs/d{(i + 1) % 1500}"}]} for i in range(1500)}
    doubling = {f"p{i}": {"anyOf": [{"$ref": f"#/properties/p{i + 1}"}] * 2} for i in range(20)}
    doubling["p20"] = {"type": "string"}
    return {
        "ordinary: 3 $defs, 6 refs": rf({"$defs": {k: {"type": "string"} for k in "abc"},
                                         "properties": {f"p{i}": {"$ref": f"#/$defs/{'abc'[i % 3]}"}
                                                        for i in range(6)}}),
        "chain of 2000 defs (S25 worst)": rf({"$defs": {**{f"d{i}": {"$ref": f"#/$defs/d{i + 1}"} for i in range(2000)},
                                                        "d2000": {"type": "string"}}, "$ref": "#/$defs/d0"}),
        "300 refs to 13 nested targets": rf(deep_refs),
        "ring of 1500 defs": rf({"$defs": ring, "$ref": "#/$defs/d0"}),
        "doubling via #/properties (20)": rf({"type": "object", "properties": doubling}),
        "cycle A<->B entered 300 times": rf({"$defs": {"A": {"anyOf": [{"$ref": "#/$defs/B"}, {"type": "string",
                                                 "description": "x" * 10000}]},
                                                 "B": {"anyOf": [{"$ref": "#/$defs/A"}, {"type": "null"}]}},
                                                 "anyOf": [{"$ref": "#/$defs/B"}] * 300 + [{"$ref": "#/$defs/A"}]}),
        "128 tools, each 8 doubling defs": PRE + '"tool_choice":"required","tools":' + json.dumps(
            [{"type": "function", "function": {"name": f"f{i}", "parameters": {"$defs": {
                **{f"d{j}": {"anyOf": [{"$ref": f"#/$defs/d{j + 1}"}] * 2} for j in range(8)},
                "d8": {"type": "string", "description": "x" * 150}}, "$ref": "#/$defs/d0"}}} for i in range(128)],
            separators=(",", ":")) + "}",
        "3000 refs, 200-part missing tail": rf({"$defs": {"a": {"type": "string"}},
                                                "anyOf": [{"$ref": "#/$defs/a" + "/x" * 8}] * 3000}),
    }


def main() -> None:
    out_file, rounds, n, trees = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4:]
    bodies = _bodies()
    res: dict[tuple[int, str], list[float]] = {}
    answers: dict[tuple[int, str], str] = {}
    for r in range(rounds):
        order = list(range(len(trees))) if r % 2 == 0 else list(reversed(range(len(trees))))
        for t in order:
            env = dict(os.environ, PYTHONPATH=trees[t])
            got = json.loads(subprocess.run([sys.executable, "-c", CHILD, str(n)], input=json.dumps(bodies),
                                            capture_output=True, text=True, env=env, check=True, cwd=trees[t]).stdout)
            for name, (us, answer) in got.items():
                res.setdefault((t, name), []).append(us)
                answers[(t, name)] = answer
    load = os.getloadavg()
    lines = [f"# parse_inference_request thread CPU per call, µs (median of {n} calls per child; min / median / max over "
             f"{rounds} interleaved rounds), {time.strftime('%Y-%m-%d %H:%M:%S', time.gmtime())} UTC, "
             f"loadavg {load[0]:.2f} {load[1]:.2f} (shared 2-core machine)"]
    lines += [f"# tree {i}: {t}" for i, t in enumerate(trees)]
    for name, text in bodies.items():
        cells = []
        for t in range(len(trees)):
            v = res[(t, name)]
            cells.append(f"{min(v):8.1f} / {statistics.median(v):8.1f} / {max(v):8.1f} {answers[(t, name)]}")
        lines.append(f"{name:34s} {len(text):6d} B | " + " | ".join(cells))
    text = "\n".join(lines) + "\n"
    with open(out_file, "w") as f:
        f.write(text)
    print(text)


if __name__ == "__main__":
    main()
