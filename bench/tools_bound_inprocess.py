"""Session 25 (mend, S24-fields-1): the in-process check that bounding tools costs nothing on a body without tools.

Two measures in ONE process, so that the load of a shared machine drifts equally over both sides:
1. ``parse_inference_request`` of a plain chat body (no ``tools``, no ``response_format``) with
   ``json_schema=None`` (A: neither bound checked) and with the default ``JsonSchemaLimits`` (B: both the
   response_format and the tools checks' key tests run), batches alternating A, B, A, B ... and an A/A pair
   (A against A) the same way: B - A bounds what the tools check adds (it includes the response_format key test
   that was there before);
2. ``timeit`` of the exact condition the tools check adds to such a body.

Usage: PYTHONPATH=<tree> python bench/tools_bound_inprocess.py [PAIRS]; prints medians in µs (thread CPU)."""
from __future__ import annotations

import json
import statistics
import sys
import time
import timeit

from gateway.config_http import JsonSchemaLimits
from gateway.request import parse_inference_request

LIMITS = JsonSchemaLimits()
PLAIN = json.dumps({"model": "sim-model", "max_tokens": 16,
                    "messages": [{"role": "system", "content": "You are a helpful assistant."},
                                 {"role": "user", "content": "What is the capital of France?"}]}).encode()
PER_BATCH = 2000


def _batch(limits: JsonSchemaLimits | None) -> float:
    t = time.thread_time()
    for _ in range(PER_BATCH):
        parse_inference_request(PLAIN, "chat", 64, max_tools=128, json_schema=limits)
    return (time.thread_time() - t) / PER_BATCH * 1e6


def main() -> None:
    pairs = int(sys.argv[1]) if len(sys.argv) > 1 else 40
    for _ in range(3):
        _batch(None), _batch(LIMITS)
    ab, aa = [], []
    for _ in range(pairs):
        a, b = _batch(None), _batch(LIMITS)
        ab.append(b - a)
        a1, a2 = _batch(None), _batch(None)
        aa.append(a2 - a1)
    data, json_schema, endpoint = json.loads(PLAIN), LIMITS, "chat"
    n = 1_000_000
    cond = min(timeit.repeat(lambda: endpoint == "chat" and json_schema is not None and "tools" in data,
                             number=n, repeat=5)) / n * 1e9
    empty = min(timeit.repeat(lambda: None, number=n, repeat=5)) / n * 1e9
    q = statistics.quantiles
    print(f"pairs {pairs}: parse without tools, B(limits) - A(None): median {statistics.median(ab):+.3f} us "
          f"(quartiles {q(ab, n=4)[0]:+.3f} .. {q(ab, n=4)[2]:+.3f}); A/A: median {statistics.median(aa):+.3f} us "
          f"(quartiles {q(aa, n=4)[0]:+.3f} .. {q(aa, n=4)[2]:+.3f}); the added condition: {cond - empty:.1f} ns "
          f"(timeit min of 5 x 1e6, a lambda call's {empty:.1f} ns subtracted)")


if __name__ == "__main__":
    main()
