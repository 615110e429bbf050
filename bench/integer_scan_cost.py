"""Gateway CPU (loop thread's CPU clock, ``time.thread_time``) of the front step on chat bodies whose digit runs
send ``json_fast.loads_checked`` to its long-integer scan (session 23, review, S23-review-1), in process, for the
tree on ``PYTHONPATH``.

Bodies (each under the default ``limits.max_body_bytes``, 1 MiB): ``float_1m`` (``temperature`` a float literal
``1.`` + 1,000,000 zeros: accepted, 1.0), ``floats_25d`` (an unknown field holding 30,000 floats of 25 digits
and ``.5``: accepted and dropped when measured; since session 23's ``limits.unknown_fields: refuse`` default it
is decoded, then refused 400 ``unsupported_parameter``), ``plain`` (one user message: must not change). Each goes through
:func:`gateway.admission_front.parse_and_count` with the default limits (``LimitsConfig()``), the word tokenizer
and ``max_prompt_tokens`` 8192, as a request does between reading its body and admission
(:func:`bench.free_form_refusal.measure`). Prints one JSON line: the median CPU ms per body and its outcome.

Usage: ``PYTHONPATH=<tree> python bench/integer_scan_cost.py [reps]``; bench/results/review-s23-integer-scan.md
runs it on three trees in turn (baseline, this branch, a copy of this branch: the A/A), several rounds.
"""
from __future__ import annotations

import json
import sys

from bench.free_form_refusal import measure

HEAD = b'{"model":"m","max_tokens":16,"messages":[{"role":"user","content":"What is the weather in Paris today?"}]'


def bodies() -> dict[str, bytes]:
    """The bodies measured, as sent."""
    return {"plain": HEAD + b"}",
            "float_1m": HEAD + b',"temperature":1.' + b"0" * 1_000_000 + b"}",
            "floats_25d": HEAD + b',"junk":[' + b",".join([b"1" * 25 + b".5"] * 30_000) + b"]}"}


def main(reps: int) -> None:
    """Print :func:`bench.free_form_refusal.measure` of :func:`bodies` as one JSON line."""
    print(json.dumps(measure(bodies(), reps)))


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 15)
