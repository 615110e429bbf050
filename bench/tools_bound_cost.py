"""Session 25 (mend, S24-fields-1): what bounding ``tools[].function.parameters`` (gateway/response_format.py
``tools_refusal``) costs :func:`gateway.request.parse_inference_request`: a plain chat body WITHOUT tools (the
commonest; it must cost nothing) and a body with four usual tools (the walk's cost), both with the default
``limits.json_schema`` as the gateway passes them.

Usage: PYTHONPATH=<tree> python bench/tools_bound_cost.py [BATCHES]; prints the median µs per parse of each body
(median over BATCHES batches of 2,000 parses, thread CPU time: less sensitive than the wall clock to the other
processes of a shared machine, not immune to them: caches, frequency).
Run it for the base tree, this tree and a copy of this tree (A/A), interleaved, several rounds
(bench/tools_bound_rounds.sh)."""
from __future__ import annotations

import json
import statistics
import sys
import time

from gateway.config_http import JsonSchemaLimits
from gateway.request import parse_inference_request

LIMITS = JsonSchemaLimits()
PLAIN = json.dumps({"model": "sim-model", "max_tokens": 16,
                    "messages": [{"role": "system", "content": "You are a helpful assistant."},
                                 {"role": "user", "content": "What is the capital of France?"}]}).encode()
TOOLS = json.dumps({"model": "sim-model", "max_tokens": 16, "tool_choice": "auto",
                    "messages": [{"role": "user", "content": "Weather in Paris and Oslo?"}],
                    "tools": [{"type": "function", "function": {
                        "name": f"tool_{i}", "description": "Look something up.",
                        "parameters": {"type": "object", "required": ["city"], "properties": {
                            "city": {"type": "string", "description": "City name"},
                            "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
                            "days": {"type": "integer", "minimum": 1, "maximum": 14}}}}} for i in range(4)]}).encode()
PER_BATCH = 2000


def _us(raw: bytes, batches: int) -> float:
    out = []
    for _ in range(batches):
        t = time.thread_time()
        for _ in range(PER_BATCH):
            parse_inference_request(raw, "chat", 64, max_tools=128, json_schema=LIMITS)
        out.append((time.thread_time() - t) / PER_BATCH)
    return statistics.median(out) * 1e6


def main() -> None:
    batches = int(sys.argv[1]) if len(sys.argv) > 1 else 15
    _us(PLAIN, 2)
    _us(TOOLS, 2)
    print(f"no_tools {_us(PLAIN, batches):.3f} us  four_tools {_us(TOOLS, batches):.3f} us")


if __name__ == "__main__":
    main()
