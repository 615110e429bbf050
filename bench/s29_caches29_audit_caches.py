"""The audit worker's OTLP attribute caches (session 29, caches29): keys, hit rates, memory, CPU (not a test).

``PYTHONPATH=<tree> python bench/s29_caches29_audit_caches.py cpu [--rows 3000] [--passes 5]``: thread CPU
(``time.thread_time_ns``, best of ``--passes``) per row of :func:`audit.row_spans.row_span_bytes` and per
event of :func:`audit.otlp_log_request.encode_logs_request` (batches of 75) on request rows shaped as
``bench.audit_overhead_worker.make_rows`` makes them (8 tenants, 2 replicas), in four feeds: ``repeated``
(one decision id for every row), ``distinct`` (a decision id per row, as the gateway sends them), each
without span links and with the client-traceparent link (the server span then takes
:func:`audit.otlp_pb.span_message`, whose attribute cache took every decision id before caches29).
Token counts vary per row (prompt 1-4,000, output 1-512). Runs on any tree (the baseline's modules when
``PYTHONPATH`` is an export of it); prints one JSON line.

``... keys``: this tree only: the caches' ``cache_info`` after the ``distinct`` feed with links (keys held,
hits, misses) and the memory per entry (``tracemalloc``: a cache filled with realistic distinct keys,
retained bytes over entries).
"""
from __future__ import annotations

import json
import os
import random
import sys
import time
import tracemalloc
from typing import Any

_LINK = [(0x0AF7651916CD43DD, 0x8448EB211C80319C, 0xB7AD6B7169203331, 1, True,
          {"prefixgate.link": "client_traceparent"})]


def feeds(n: int, seed: int = 29) -> dict[str, list[tuple[list[Any], tuple]]]:
    """``{feed name: [(row, span extra)]}`` (module doc)."""
    from audit.request_event import REQUEST_ROW_FIELDS
    from bench.audit_overhead_worker import make_rows

    rng = random.Random(seed)
    i_dec, i_pt, i_ot = (REQUEST_ROW_FIELDS.index(k) for k in ("decision_id", "prompt_tokens", "output_tokens"))
    rows = make_rows(n)
    for r in rows:
        r[i_pt] = rng.randint(1, 4000)
        r[i_ot] = rng.randint(1, 512)
    one = [list(r) for r in rows]
    for r in one:
        r[i_dec] = "0" * 32
    now = time.time_ns()
    out = {}
    for name, rs in (("repeated", one), ("distinct", rows)):
        out[name] = [(r, (0x1000 + k, 1, now + k, None, None)) for k, r in enumerate(rs)]
        out[name + "+links"] = [(r, (0x1000 + k, 1, now + k, _LINK, None)) for k, r in enumerate(rs)]
    return out


def cpu(rows: int, passes: int) -> dict[str, Any]:
    """µs per row (spans) / per event (OTLP logs), best of ``passes`` (module doc)."""
    from audit.otlp import SCOPE_NAME
    from audit.otlp_log_build import build_resource
    from audit.otlp_log_request import encode_logs_request
    from audit.request_event import request_event
    from audit.row_spans import row_span_bytes
    from opentelemetry.proto.common.v1 import common_pb2

    resource, scope = build_resource("prefixgate"), common_pb2.InstrumentationScope(name=SCOPE_NAME, version="t")
    clock = time.thread_time_ns
    out: dict[str, Any] = {}
    for name, feed in feeds(rows).items():
        events = [request_event(r, "i-1") for r, _x in feed]
        best_s = best_l = float("inf")
        for _ in range(passes + 1):  # the first warms up, then best of passes
            t0 = clock()
            for r, x in feed:
                row_span_bytes(r, x)
            t1 = clock()
            if "links" not in name:
                for i in range(0, len(events), 75):
                    encode_logs_request(events[i:i + 75], resource, scope, 1)
            t2 = clock()
            best_s, best_l = min(best_s, t1 - t0), min(best_l, t2 - t1)
        out[f"spans {name}"] = round(best_s / 1000 / len(feed), 3)
        if "links" not in name:
            out[f"otlp_logs {name}"] = round(best_l / 1000 / len(feed), 3)
    out["load"] = os.getloadavg()[0]
    return out


def _per_entry(fill: Any, clear: Any, n: int) -> float:
    """Retained bytes per cache entry after ``fill(n)`` (``clear()`` first)."""
    clear()
    tracemalloc.start()
    a = tracemalloc.take_snapshot()
    fill(n)
    b = tracemalloc.take_snapshot()
    tracemalloc.stop()
    used = sum(s.size_diff for s in b.compare_to(a, "filename"))
    clear()
    return round(used / n)


def keys(rows: int) -> dict[str, Any]:
    """This tree's caches after the ``distinct+links`` and ``distinct`` feeds, and bytes per entry."""
    from audit import otlp_log_build, otlp_log_request, otlp_pb, row_spans
    from audit.event import Kind, Outcome
    from audit.otlp import SCOPE_NAME
    from audit.otlp_log_build import build_request, build_resource
    from audit.otlp_log_request import encode_logs_request
    from audit.request_event import request_event
    from opentelemetry.proto.common.v1 import common_pb2

    caches = {"otlp_pb.key_field": otlp_pb.key_field, "otlp_pb._str_kv": otlp_pb._str_kv,
              "otlp_pb._client_kv": otlp_pb._client_kv, "row_spans._str_field": row_spans._str_field,
              "row_spans._model_field": row_spans._model_field, "row_spans.int_field": row_spans.int_field,
              "otlp_log_build._cached_kv": otlp_log_build._cached_kv,
              "otlp_log_request._heads": otlp_log_request._heads}
    out: dict[str, Any] = {}
    resource, scope = build_resource("prefixgate"), common_pb2.InstrumentationScope(name=SCOPE_NAME, version="t")
    fs = feeds(rows)
    for feed_name in ("distinct", "distinct+links"):
        for c in caches.values():
            c.cache_clear()
        for r, x in fs[feed_name]:
            row_spans.row_span_bytes(r, x)
        events = [request_event(r, "i-1") for r, _x in fs[feed_name]]
        encode_logs_request(events, resource, scope, 1)
        build_request(events, resource, scope, 1)  # the generated-message path (the fallback)
        out[feed_name] = {k: c.cache_info()._asdict() for k, c in caches.items()}
    tenant = "tenant-" + "t" * 24
    out["bytes per entry"] = {
        "otlp_pb._str_kv (tenant, 32 chars)": _per_entry(
            lambda n: [otlp_pb._str_kv("prefixgate.tenant", f"{tenant}{i:06d}") for i in range(n)],
            otlp_pb._str_kv.cache_clear, 1000),
        "otlp_pb._client_kv (model, 256 chars)": _per_entry(
            lambda n: [otlp_pb._client_kv("gen_ai.request.model", f"{i:06d}" + "m" * 250) for i in range(n)],
            otlp_pb._client_kv.cache_clear, 200),
        "row_spans._str_field (tenant, 32 chars)": _per_entry(
            lambda n: [row_spans._str_field("prefixgate.tenant", f"{tenant}{i:06d}") for i in range(n)],
            row_spans._str_field.cache_clear, 1000),
        "row_spans._model_field (model, 256 chars)": _per_entry(
            lambda n: [row_spans._model_field("gen_ai.request.model", f"{i:06d}" + "m" * 250) for i in range(n)],
            row_spans._model_field.cache_clear, 200),
        "row_spans.int_field (prompt tokens)": _per_entry(
            lambda n: [row_spans.int_field(2, 1000 + i) for i in range(n)], row_spans.int_field.cache_clear, 1000),
        "otlp_log_build._cached_kv (tenant, 32 chars)": _per_entry(
            lambda n: [otlp_log_build._cached_kv("prefixgate.tenant", f"{tenant}{i:06d}") for i in range(n)],
            otlp_log_build._cached_kv.cache_clear, 1000),
        "otlp_log_request._heads (tenant, 32 chars)": _per_entry(
            lambda n: [otlp_log_request._heads(Kind.INFERENCE, Outcome.ALLOWED, f"{tenant}{i:06d}") for i in range(n)],
            otlp_log_request._heads.cache_clear, 1000),
    }
    return out


def main(argv: list[str]) -> int:
    """CLI (module doc)."""
    mode = argv[0] if argv else "cpu"
    rows = int(argv[argv.index("--rows") + 1]) if "--rows" in argv else 3000
    passes = int(argv[argv.index("--passes") + 1]) if "--passes" in argv else 5
    print(json.dumps(cpu(rows, passes) if mode == "cpu" else keys(rows)))
    return 0


if __name__ == "__main__":
    sys.path.insert(0, os.environ.get("PYTHONPATH", ".").split(os.pathsep)[0])
    raise SystemExit(main(sys.argv[1:]))
