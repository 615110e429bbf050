"""S24-review-2: thread CPU of parse_inference_request for a refused chat body whose logit_bias has 65,000 entries
(769 KB; refused for more than 300), and for a plain body with a 300-entry map (accepted) as a control.

Usage: PYTHONPATH=<tree> python bench/logit_bias_bound_cost.py [REPS]; prints the median ms per body kind.
Run it for the baseline tree, this tree and a copy of this tree (A/A), interleaved, several rounds."""
from __future__ import annotations

import json
import statistics
import sys
import time

from gateway.errors import GatewayError
from gateway.request import parse_inference_request


def _body(entries: int) -> bytes:
    return json.dumps({"model": "sim-model", "max_tokens": 1, "messages": [{"role": "user", "content": "hi"}],
                       "logit_bias": {str(i): 1 for i in range(entries)}}).encode()


def _ms(raw: bytes, reps: int) -> float:
    out = []
    for _ in range(reps):
        t = time.thread_time()
        try:
            parse_inference_request(raw, "chat", 64, max_json_items=65536)
        except GatewayError:
            pass
        out.append(time.thread_time() - t)
    return statistics.median(out) * 1000


def main() -> None:
    reps = int(sys.argv[1]) if len(sys.argv) > 1 else 15
    refused, accepted = _body(65000), _body(300)
    _ms(refused, 2)
    print(f"refused_65000 {_ms(refused, reps):.2f} ms  accepted_300 {_ms(accepted, reps * 20):.3f} ms")


if __name__ == "__main__":
    main()
