"""Gateway CPU (loop thread's CPU clock, ``time.thread_time``) of the front step on chat bodies with large
free-form fields (session 22, fixschema, S22-review-4), in process, for the tree on ``PYTHONPATH``.

Bodies: ``tools_kv`` (``[{"a": "b"}] * 30000``, 360 kB: the review's), ``params_60k`` (one tool whose
``parameters`` hold 60,000 values), ``ordinary_4tools`` (4 small function tools: must not change), ``plain``
(one user message, no tools). Each goes through :func:`gateway.admission_front.parse_and_count` with the
default limits (``LimitsConfig()``), the word tokenizer and ``max_prompt_tokens`` 8192, as a request does
between reading its body and admission (the small bodies first, 100 x ``reps`` times; the large ones ``reps``
times). Prints one JSON line: the median CPU ms per body and its outcome.

Usage: ``PYTHONPATH=<tree> python bench/free_form_refusal.py [reps]``; bench/results/fixschema-s22-*.md runs
it on three trees in turn (baseline, this branch, a copy of this branch: the A/A), several rounds.
"""
from __future__ import annotations

import json
import statistics
import sys
import time
from typing import Any

from gateway.admission import Admission
from gateway.admission_front import parse_and_count
from gateway.config_http import LimitsConfig
from gateway.config_state import StateConfig
from gateway.errors import GatewayError
from gateway.metrics import GatewayMetrics
from tenancy.registry import Tenant, TenantRegistry
from tenancy.shared import make_limits
from tenancy.tokenizer import WordTokenizer

MSGS = [{"role": "user", "content": "What is the weather in Paris today?"}]


def bodies() -> dict[str, bytes]:
    """The bodies measured, as sent (``json.dumps``)."""
    tool = {"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {
        f"k{i}": i for i in range(30_000)}, "x": [0] * 30_000}}}
    small = [{"type": "function", "function": {"name": f"f{i}", "description": "get the weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}} for i in range(4)]
    out = {"plain": {"model": "m", "messages": MSGS, "max_tokens": 16},
           "ordinary_4tools": {"model": "m", "messages": MSGS, "tools": small, "tool_choice": "auto"},
           "tools_kv": {"model": "m", "messages": MSGS, "tools": [{"a": "b"}] * 30_000},
           "params_60k": {"model": "m", "messages": MSGS, "tools": [tool]}}
    return {k: json.dumps(v).encode() for k, v in out.items()}


def measure(bodies_by_name: dict[str, bytes], reps: int) -> dict[str, Any]:
    """``{name: {"cpu_ms_median", "outcome", "body_bytes"}}``: the loop thread's CPU ms (median) of
    :func:`gateway.admission_front.parse_and_count` on each body, run ``reps`` times (bodies under 10,000
    bytes 100 x ``reps`` times), with the default limits, the word tokenizer and ``max_prompt_tokens`` 8192;
    the outcome is ``ok N tokens`` or the refusal's ``status code``. Shared by bench/integer_scan_cost.py."""
    adm = Admission(TenantRegistry.from_config([]), make_limits(StateConfig()), WordTokenizer(), ["m"],
                    GatewayMetrics(), max_messages=2048, max_output_tokens=4096, default_max_prompt_tokens=8192)
    tenant = Tenant(id="acme", models=frozenset({"m"}))
    bounds, limits = adm.request_bounds(tenant), LimitsConfig()
    result: dict[str, Any] = {}
    for name, raw in bodies_by_name.items():
        times, outcome = [], ""
        for _ in range(reps if len(raw) > 10_000 else 100 * reps):  # small bodies: 100 x (sub-ms each)
            t0 = time.thread_time()
            try:
                got = parse_and_count(adm, raw, "chat", limits, bounds, tenant, None, False)  # type: ignore[arg-type]
                outcome = f"ok {got[3]} tokens"
            except GatewayError as err:
                outcome = f"{err.status} {err.code}"
            times.append((time.thread_time() - t0) * 1000)
        result[name] = {"cpu_ms_median": round(statistics.median(times), 3), "outcome": outcome,
                        "body_bytes": len(raw)}
    return result


def main(reps: int) -> None:
    """Print :func:`measure` of :func:`bodies` as one JSON line."""
    print(json.dumps(measure(bodies(), reps)))


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 15)
