"""Gateway CPU (loop thread's CPU clock, ``time.thread_time``) of the front step on chat bodies whose digit runs
send ``json_fast.loads_checked`` to its long-integer scan (session 23, review, S23-review-1), in process, for the
tree on ``PYTHONPATH``.

Bodies (each under the default ``limits.max_body_bytes``, 1 MiB): ``float_1m`` (``temperature`` a float literal
``1.`` + 1,000,000 zeros: accepted, 1.0), ``floats_25d`` (an unknown field holding 30,000 floats of 25 digits
and ``.5``: accepted, dropped), ``plain`` (one user message: must not change). Each goes through
:func:`gateway.admission_front.parse_and_count` with the default limits (``LimitsConfig()``), the word tokenizer
and ``max_prompt_tokens`` 8192, as a request does between reading its body and admission (``plain`` 100 x
``reps`` times, the others ``reps`` times). Prints one JSON line: the median CPU ms per body and its outcome.

Usage: ``PYTHONPATH=<tree> python bench/integer_scan_cost.py [reps]``; bench/results/review-s23-integer-scan.md
runs it on three trees in turn (baseline, this branch, a copy of this branch: the A/A), several rounds.
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

HEAD = b'{"model":"m","max_tokens":16,"messages":[{"role":"user","content":"What is the weather in Paris today?"}]'


def bodies() -> dict[str, bytes]:
    """The bodies measured, as sent."""
    return {"plain": HEAD + b"}",
            "float_1m": HEAD + b',"temperature":1.' + b"0" * 1_000_000 + b"}",
            "floats_25d": HEAD + b',"junk":[' + b",".join([b"1" * 25 + b".5"] * 30_000) + b"]}"}


def main(reps: int) -> None:
    adm = Admission(TenantRegistry.from_config([]), make_limits(StateConfig()), WordTokenizer(), ["m"],
                    GatewayMetrics(), max_messages=2048, max_output_tokens=4096, default_max_prompt_tokens=8192)
    tenant = Tenant(id="acme", models=frozenset({"m"}))
    bounds, limits = adm.request_bounds(tenant), LimitsConfig()
    result: dict[str, Any] = {}
    for name, raw in bodies().items():
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
    print(json.dumps(result))


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 15)
