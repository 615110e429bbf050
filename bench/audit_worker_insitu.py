"""Per-call cost of the audit worker's formatters inside the running worker vs in a tight loop (not a test).

``python -m bench.audit_worker_insitu [--events 4000] [--rate 1000] [--out FILE]``

Session 12 (issue 14): the worker's parts measured one at a time in a loop (``bench.audit_worker_cpu``,
the session 10/11 tables) add up to about half of what ``bench.audit_overhead_worker`` measures for the
whole worker, and a part costs more inside the worker than in the loop (the OCSF line ~10 µs there,
~5 in the loop). This bench shows both side by side:

* in situ: the real ``audit.worker.main()`` fed as ``bench.audit_overhead_worker`` feeds it (this
  tree, one run, ``--events`` request rows at ``--rate``/s after a warm-up, receivers in another
  process), with the formatters the sinks and the read loop call wrapped by a wall-clock timer
  (``time.perf_counter_ns``, median per call: a preempted call moves the mean, not the median);
* in a loop: the same functions, the same wrapper, over the same kind of rows, in batches of 20 as
  the sinks take them (one sink's batch after another).

Each wrapped call costs ~0.1-0.2 µs more than unwrapped. Results: a JSON line on stdout and
``--out`` (default ``bench/results/audit_worker_insitu.json``). Numbers depend on the machine and
its load; compare the two columns of one run.
"""
from __future__ import annotations

import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

DEFAULT_OUT = Path(__file__).resolve().parent / "results" / "audit_worker_insitu.json"
#: (module, function name) wrapped in the worker: what the sinks and the read loop call per event
_WRAPPED = (("audit.ocsf", "ocsf_line"), ("audit.syslog", "cef_line"), ("audit.syslog", "_rfc5424"),
            ("audit.jsonl", "shared_json"), ("audit.otlp_log_request", "_record"),
            ("audit.worker", "request_event"), ("audit.worker", "row_is_clean"),
            ("audit.worker_spans", "row_span_bytes"))


def _wrap(times: dict[str, list[int]]) -> None:
    import importlib

    clock = time.perf_counter_ns
    for mod_name, name in _WRAPPED:
        mod = importlib.import_module(mod_name)
        fn = getattr(mod, name)
        got = times.setdefault(f"{mod_name}.{name}", [])

        def timed(*a: Any, _fn: Any = fn, _got: list[int] = got, **k: Any) -> Any:
            t = clock()
            r = _fn(*a, **k)
            _got.append(clock() - t)
            return r

        setattr(mod, name, timed)


def _medians(times: dict[str, list[int]]) -> dict[str, float]:
    return {k: round(statistics.median(v) / 1000, 2) for k, v in times.items() if v}


def in_loop(n: int) -> dict[str, float]:
    """Median µs per call of the wrapped functions over ``n`` rows, batches of 20, in this process."""
    from audit.cef import cef_line
    from audit.encoded import shared_json
    from audit.ocsf import ocsf_line
    from audit.otlp_log_request import _record
    from audit.request_event import REQUEST_ROW_FIELDS, request_event
    from audit.row_spans import row_span_bytes
    from audit.scrub import row_is_clean
    from audit.syslog import _rfc5424
    from bench.audit_overhead_worker import make_rows

    times: dict[str, list[int]] = {}
    clock = time.perf_counter_ns

    def t(name: str, fn: Any, *a: Any) -> Any:
        s = clock()
        r = fn(*a)
        times.setdefault(name, []).append(clock() - s)
        return r

    fp = REQUEST_ROW_FIELDS.index("prefix_fingerprint")
    rows = make_rows(n)
    for k in range(0, n, 20):
        evs = []
        for i, row in enumerate(rows[k:k + 20]):
            evs.append(t("audit.worker.request_event", request_event, row, "inst-1"))
            t("audit.worker.row_is_clean", row_is_clean, row, fp)
            t("audit.worker_spans.row_span_bytes", row_span_bytes, row, (0x1000 + k + i, 1, time.time_ns(), None, None))
        for ev in evs:
            t("audit.jsonl.shared_json", shared_json, ev)
        for ev in evs:
            t("audit.ocsf.ocsf_line", ocsf_line, ev)
        for ev in evs:
            t("audit.syslog.cef_line", cef_line, ev)
        for ev in evs:
            t("audit.syslog._rfc5424", _rfc5424, ev, "x", " host prefixgate - ")
        for ev in evs:
            t("audit.otlp_log_request._record", _record, ev, b"")
    return _medians(times)


def in_situ(events: int, rate: float) -> dict[str, Any]:
    """Median µs per call of the wrapped functions inside the worker (a forked child runs it) and the
    child's own figures (``bench.audit_overhead_worker``'s ``worker_us`` etc.)."""
    import multiprocessing as mp

    import bench.audit_overhead_worker as feed
    from bench.audit_worker_cpu import _receivers

    parent, child = mp.Pipe()
    recv = mp.get_context("spawn").Process(target=_receivers, args=(child,), daemon=True)
    recv.start()
    try:
        ports = parent.recv()
        with tempfile.TemporaryDirectory(prefix="pg-insitu-") as work:
            arg: dict[str, Any] = {"work": work, "syslog_port": ports[0], "otlp_port": ports[1], "rate": rate,
                                   "events": events, "warmup": 300, "tail": 0.5, "profile": None}
            try:  # newer feeds take the worker's config from bench.audit_feed_rounds (same sinks)
                from bench.audit_feed_rounds import worker_config
            except ImportError:
                pass
            else:
                arg["config"] = worker_config(Path(work), Path(work) / "keys" / "audit.key", ports, spans=True)
            r, w = os.pipe()
            pid = os.fork()
            if pid == 0:  # the child: the worker on its main thread, stdin/stdout replaced (feed._child)
                os.close(r)
                try:
                    times: dict[str, list[int]] = {}
                    _wrap(times)
                    res = feed._child(arg)
                    os.write(w, json.dumps({"worker": res, "in_situ": _medians(times)}).encode())
                finally:
                    os._exit(0)
            os.close(w)
            data = b""
            while chunk := os.read(r, 1 << 16):
                data += chunk
            os.close(r)
            os.waitpid(pid, 0)
    finally:
        recv.kill()
        recv.join(5)
    return json.loads(data)


def main(argv: list[str] | None = None) -> int:
    """CLI (module doc); returns 0."""
    import click

    from sim.click_options import ClickOptions

    ap = ClickOptions(description=__doc__.splitlines()[0])
    ap.option("--events", type=int, default=4000)
    ap.option("--rate", type=float, default=1000.0)
    ap.option("--out", type=click.Path(path_type=Path), default=DEFAULT_OUT)
    args = ap.parse(sys.argv[1:] if argv is None else argv)
    situ = in_situ(args.events, args.rate)
    loop = in_loop(args.events)
    result = {"bench": "audit_worker_insitu", "events": args.events, "rate": args.rate,
              "median_us_per_call": {k: {"in_situ": situ["in_situ"].get(k), "in_loop": v} for k, v in loop.items()},
              "worker": situ["worker"], "load": os.getloadavg()}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
