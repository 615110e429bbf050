"""The audit worker's event-loop thread split by part, from py-spy's samples (not a test).

Session 29 (issue 14's audit ratio). ``python -m bench.audit_overhead_worker --spy DIR`` has py-spy
(``record --format raw --threads --nonblocking``; PG_PYSPY or ``py-spy`` on PATH, not a project
dependency) sample the worker process from outside during each run's window: no wrapper and no
profiler hook runs in the worker (cProfile inflates call-heavy code; a wrapper per call costs
~0.1-0.2 µs). :func:`spy_split` reads the raw stacks of the worker's main thread and charges each sample
to the innermost frame of :data:`PARTS` on its stack (``loop`` when none is: uvloop's C code between
callbacks, task steps, futures). py-spy leaves out samples where the thread is idle (blocked in a
system call such as epoll), so the shares are of the thread's CPU.
"""
from __future__ import annotations

from pathlib import Path

__all__ = ["PARTS", "spy_split"]

#: (part, substrings of a py-spy frame ``function (file:line)``), innermost part wins
PARTS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("read_decode", ("run (audit/worker.py",)),
    ("pipe_read", ("read (audit/worker_stdin.py", "_wait_readable (audit/worker_stdin.py")),
    ("status_ack", ("report (audit/worker.py", "durable_n (audit/log.py", "flush_spills (audit/log.py")),
    ("metrics_frame", ("generate_latest", "_report_loop (audit/worker.py")),
    ("request_event", ("request_event (audit/request_event.py",)),
    ("row_is_clean", ("row_is_clean (audit/scrub.py",)),
    ("emit", ("emit (audit/log.py",)),
    ("delivery_loop", ("_run (audit/log_delivery.py", "_deliver (audit/log_delivery.py")),
    ("jsonl", ("(audit/jsonl.py", "(audit/chain.py", "(audit/keys.py")),
    ("ocsf", ("(audit/ocsf.py", "(audit/ocsf_unmapped.py", "(audit/files.py", "(audit/jsonl_files.py")),
    ("syslog", ("(audit/syslog.py", "(audit/cef.py")),
    ("otlp_logs", ("(audit/otlp.py", "(audit/otlp_log_request.py", "(audit/otlp_log_build.py")),
    ("spans_build", ("request (audit/worker_spans.py", "(audit/row_spans.py")),
    ("spans_post", ("(audit/span_post.py", "(audit/otlp_trace_request.py")),
    ("http_client", ("/aiohttp/", "/yarl/", "/multidict/")),
    ("asyncio_streams", ("/asyncio/streams.py", "/asyncio/selector_events.py")),
    ("gc", ("<gc>",)),
)


def _part(stack: list[str]) -> str:
    for frame in reversed(stack):  # innermost first
        for name, keys in PARTS:
            if any(k in frame for k in keys):
                return name
    return "loop"


def spy_split(path: Path, main_tid: int) -> dict[str, float]:
    """Share (0-1) of the main thread's samples per part in py-spy's raw output at ``path`` (lines
    ``thread (TID): NAME;frame;... COUNT``, root first), plus ``samples``. ``main_tid``: the main
    thread's native id (``threading.get_native_id()``). Empty when the file is missing or holds no
    sample of that thread."""
    try:
        text = path.read_text()
    except OSError:
        return {}
    counts: dict[str, int] = {}
    total = 0
    for line in text.splitlines():
        stack_text, _, count = line.rpartition(" ")
        if not stack_text or not count.isdigit():
            continue
        stack = stack_text.split(";")
        if not stack[0].startswith(f"thread ({main_tid})"):
            continue
        k = int(count)
        part = _part(stack)
        counts[part] = counts.get(part, 0) + k
        total += k
    if not total:
        return {}
    return {"samples": total} | {p: round(c / total, 4) for p, c in sorted(counts.items(), key=lambda x: -x[1])}
