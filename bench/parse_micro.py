"""In-process CPU of a request body's parse and validation, per body shape and source tree (issue 14, session 25,
helper cut; not a test).

``python -m bench.parse_micro --tree NAME=DIR [--tree ...] [--calls 2000] [--rounds 8] [--name NAME]``

Each tree's :func:`gateway.request.parse_inference_request` parses the bodies of :data:`SHAPES` with the
defaults of that tree's :class:`gateway.config_http.LimitsConfig` (``max_json_depth``, ``max_json_items``,
``max_tools``, ``unknown_fields`` and, where the tree has it, ``json_schema``) and ``max_messages`` 256, as
:func:`gateway.admission_front.parse_and_count` passes them (keyword arguments the tree's function does not
take are left out). Every tree runs in a child process of its own (``PYTHONPATH=DIR``), rounds interleaved
(the order rotates each round); per round and shape: the best of 5 passes of ``--calls`` parses, thread CPU
µs per parse (``time.thread_time``: preemption by other processes excluded). Name one tree twice (e.g. ``this``
and ``aa``) for the A/A. Results: ``bench/results/<name>.md`` and ``.json``.
"""

from __future__ import annotations

import inspect
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import click

RESULTS = Path(__file__).resolve().parent.parent / "bench" / "results"

_WORDS = "lorem ipsum dolor sit amet consectetur adipiscing elit sed do eiusmod tempor".split()


def _text(n: int, salt: int) -> str:
    return " ".join(_WORDS[(salt + k) % len(_WORDS)] for k in range(n))


def _tool(i: int) -> dict[str, Any]:
    return {"type": "function", "function": {"name": f"get_value_{i}", "description": _text(8, i),
                                             "parameters": {"type": "object", "properties": {
                                                 "key": {"type": "string"}}, "required": ["key"]}}}


#: name -> (endpoint, body): the benchmark's completion (bench/loadgen.py's body: 64 words, max_tokens 1), the
#: chat shortcut's body, chat bodies that go to pydantic (a sampling field; tools and tool messages; a small
#: response_format schema; one of 30 properties with 20 enum values each) and a 16-message conversation.
SHAPES: dict[str, tuple[str, dict[str, Any]]] = {
    "completion": ("completions", {"model": "sim-model", "prompt": _text(64, 1), "max_tokens": 1}),
    "chat_plain": ("chat", {"model": "sim-model", "max_tokens": 1, "messages": [
        {"role": "system", "content": _text(16, 2)}, {"role": "user", "content": _text(48, 3)}]}),
    "chat_temp": ("chat", {"model": "sim-model", "max_tokens": 16, "temperature": 0.7, "top_p": 0.9, "messages": [
        {"role": "system", "content": _text(16, 2)}, {"role": "user", "content": _text(48, 3)}]}),
    "chat_16msg": ("chat", {"model": "sim-model", "max_tokens": 16, "temperature": 0.2, "messages": [
        {"role": "user" if i % 2 == 0 else "assistant", "content": _text(12, i)} for i in range(16)]}),
    "chat_tools": ("chat", {"model": "sim-model", "max_tokens": 16, "tools": [_tool(i) for i in range(4)],
                            "tool_choice": "auto", "messages": [
        {"role": "user", "content": _text(24, 4)},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "get_value_1", "arguments": "{\"key\":\"a\"}"}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "42"},
        {"role": "user", "content": _text(12, 5)}]}),
    "chat_schema": ("chat", {"model": "sim-model", "max_tokens": 16, "messages": [
        {"role": "user", "content": _text(24, 6)}], "response_format": {"type": "json_schema", "json_schema": {
            "name": "answer", "schema": {"type": "object", "properties": {
                "a": {"type": "string"}, "b": {"type": "integer"}, "c": {"type": "array", "items": {"type": "string"}}},
                "required": ["a", "b"]}}}}),
    "chat_schema30": ("chat", {"model": "sim-model", "max_tokens": 16, "messages": [
        {"role": "user", "content": _text(24, 7)}], "response_format": {"type": "json_schema", "json_schema": {
            "name": "form", "schema": {"type": "object", "properties": {
                f"field_{i}": {"type": "string", "enum": [f"v{j}" for j in range(20)]} for i in range(30)}}}}}),
}


def _child(calls: int) -> dict[str, float]:
    """In the child: best-of-5 thread CPU µs per parse for each shape (this process's ``gateway``)."""
    from gateway.config_http import LimitsConfig
    from gateway.request import parse_inference_request

    limits = LimitsConfig()
    accepted = inspect.signature(parse_inference_request).parameters
    kw = {k: v for k, v in {"max_messages": 256, "max_json_items": limits.max_json_items,
                            "max_tools": getattr(limits, "max_tools", None),
                            "unknown_fields": getattr(limits, "unknown_fields", None),
                            "json_schema": getattr(limits, "json_schema", None)}.items() if k in accepted}
    out: dict[str, float] = {}
    for name, (endpoint, doc) in SHAPES.items():
        raw = json.dumps(doc).encode()
        parse_inference_request(raw, endpoint, limits.max_json_depth, **kw)  # refusals would raise here
        for _ in range(200):
            parse_inference_request(raw, endpoint, limits.max_json_depth, **kw)
        best = float("inf")
        for _ in range(5):
            t0 = time.thread_time()
            for _ in range(calls):
                parse_inference_request(raw, endpoint, limits.max_json_depth, **kw)
            best = min(best, (time.thread_time() - t0) * 1e6 / calls)
        out[name] = best
    return out


@click.command()
@click.option("--tree", "trees", multiple=True, required=True, help="NAME=DIR: a source tree (repeatable)")
@click.option("--calls", default=2000, show_default=True)
@click.option("--rounds", default=8, show_default=True)
@click.option("--name", default="parse-micro", show_default=True)
@click.option("--child", is_flag=True, hidden=True)
def main(trees: tuple[str, ...], calls: int, rounds: int, name: str, child: bool) -> None:
    """Parse and validation CPU per body shape, per source tree (module doc)."""
    if child:
        print(json.dumps(_child(calls)))
        return
    # here, not at the top: the child runs this file with another tree's ``bench`` first on its path
    from bench._tree_rounds import child_json, interleaved, median_range, median_range_rows

    named = [t.partition("=")[::2] for t in trees]
    rows, _ = interleaved(named, rounds, lambda tree: child_json(
        [sys.executable, __file__, "--child", "--calls", str(calls), "--tree", "x=x"], tree),
        describe=lambda got: "/".join(f"{v:.1f}" for v in got.values()))
    shapes = list(SHAPES)
    summary, spread = median_range(rows, shapes, 2)
    doc = {"benchmark": "parse_micro", "args": {"trees": list(trees), "calls": calls, "rounds": rounds},
           "python": sys.version.split()[0], "loadavg_end": os.getloadavg(), "median_us": summary,
           "min_max_us": spread, "rows": rows}
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / f"{name}.json").write_text(json.dumps(doc, indent=1))
    lines = [f"# Parse and validation in process: thread CPU µs per body (`python -m bench.parse_micro`), {name}", "",
             f"{rounds} interleaved rounds; per round and shape the best of 5 passes of {calls} parses (child process "
             f"per tree); median of the rounds [min-max]; Python {doc['python']}; load average at the end "
             f"{doc['loadavg_end'][0]:.1f} (machine shared with other helpers).", "",
             *median_range_rows(summary, spread, shapes)]
    lines.append("")
    lines.append("Trees: " + ", ".join(f"{n} = {t}" for n, t in named) + ".")
    (RESULTS / f"{name}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
