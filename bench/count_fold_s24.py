"""S23-review-3 (session 24): thread CPU of ``parse_inference_request`` on 1 MB chat bodies that take the schema
path (a ``temperature`` field: not the plain shortcut), for one tree given by ``PYTHONPATH``; prints the median
ms per body of each shape as JSON. Run by ``bench/count_fold_s24_rounds.sh`` over base / this / A-A copies."""

from __future__ import annotations

import json
import sys
import time

from gateway.request import parse_inference_request


def _body(content: str) -> bytes:
    return json.dumps({"model": "m", "temperature": 0.5, "max_tokens": 4,
                       "messages": [{"role": "user", "content": content}]}).encode()


#: under limits.max_json_items (65,536): few commas; "brackets" holds 32,000 brackets (the depth shortcut walks)
SHAPES = {"words_1m": _body("hello world " * 87_000), "chars_1m": _body("x" * 1_040_000),
          "brackets_1m": _body("[{x}]" * 16_000 + "y" * 960_000)}


def main(n: int) -> None:
    out = {}
    for name, raw in SHAPES.items():
        parse_inference_request(raw, "chat", max_json_items=65536)  # warm
        times = []
        for _ in range(n):
            t = time.thread_time_ns()
            parse_inference_request(raw, "chat", max_json_items=65536)
            times.append(time.thread_time_ns() - t)
        times.sort()
        out[name] = round(times[len(times) // 2] / 1e6, 3)
    print(json.dumps(out))


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 30)
