"""The audit worker's CPU per event, this tree vs another, as ``bench.audit_overhead``'s "on" gateway feeds it (not a test).

``python -m bench.audit_overhead_worker [--baseline DIR] [--same] [--rate 1000] [--events 6000] [--rounds 6]
[--sinks all|overhead] [--without SINK ...] [--read-interval S] [--split [--changed PARTS]] [--spy DIR]
[--profile DIR]``

Session 29: every result has ``threads`` (:func:`thread_split`: CPU, its kernel part, run-queue wait and
context switches per event, per thread role); ``--split`` the loop thread's CPU by part in situ
(:data:`SPLIT_POINTS`, :func:`split_exclusive`; A/B differences with the round's drift taken out:
:func:`split_differences`); ``--without`` leaves a sink out; ``--read-interval`` sets the worker's pipe
read interval; ``--spy`` samples with py-spy (:mod:`bench.audit_worker_split`).

``--sinks overhead`` (session 13): the sinks ``bench.overhead``'s PrefixGate has instead (``sim.demo``'s
audit section: JSONL hash chain with 10 s checkpoints, OCSF file, spill; no syslog, no OTLP, no spans, so
the frames carry no span extra).

Each run is one process per tree (``PYTHONPATH`` = that tree, started with THIS tree's script) that runs
that tree's real ``audit.worker.main()`` on its main thread, with its stdin and stdout replaced by pipes:
a feeder thread writes the config line (``bench.audit_overhead``'s "on" audit section: JSONL hash chain
with 1 s checkpoints, OCSF file, CEF over TCP syslog, OTLP logs, spill, flood summaries, and the
``spans`` section of OTLP tracing) and then request-row frames with their span extras, byte for byte as
``audit.remote.RemoteAuditLog`` writes them, ``--rate`` answers per second, one frame at a time; a
drain thread reads the status frames (acks). The syslog receiver and the OTLP collector (logs and
traces) run in another process (not counted). Measured over a fixed window (the feed plus ``--tail``
seconds, so the worker's fixed per-second costs count at this rate): the process's CPU
(``time.process_time``) minus the feeder's and the drain thread's own CPU
(``pthread_getcpuclockid``), i.e. the worker's CPU in all its threads, in µs per event; also its
main (event-loop) thread alone, and (session 28) the whole process's system CPU and minor page faults
per event (``getrusage``; the feeder's and drain thread's pipe writes and reads included) and its peak
resident size (``maxrss_mib``, the bench's prepared frames included). Rounds alternate the order of the trees; ``--same`` is an A/A (this
tree twice). ``--profile DIR``: cProfile of the worker's main thread on the thread-CPU clock, one
``.prof`` per run (whole run, warm-up and close included; compare shares). Results:
``bench/results/<--name>.{json,md}``.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "bench" / "results"
_TENANTS = [f"tenant-{c}" for c in "abcdefgh"]


def make_rows(n: int, first: int = 0) -> list[list[Any]]:
    """``n`` request rows (audit.request_event.REQUEST_ROW_FIELDS) shaped like the gateway's in
    ``bench.audit_overhead`` (8 tenants, two replicas, one denial in 20), fresh ids and times."""
    rows = []
    now_ms = int(time.time() * 1000)
    for i in range(first, first + n):
        t = time.perf_counter()
        tenant = _TENANTS[i % 8]
        denied = i % 20 == 19
        rows.append([
            str(uuid.uuid4()), now_ms + i, "denied" if denied else "allowed", uuid.uuid4().hex,
            f"spiffe://demo.prefixgate.test/{tenant}/bench", "demo.prefixgate.test", tenant,
            uuid.uuid4().hex, "model_not_allowed" if denied else "allow",
            "model not in tenant allow-list" if denied else "tenant may use pool",
            "/v1/completions", "sim-model", 100, None if denied else 4, 1,
            104, 100 if denied else 104, 100, 0 if denied else 4, 0 if denied else 4, "refused" if denied else "usage",
            None, None if denied else f"r{i % 2}", "default", "cache_aware", 64, None if denied else 64,
            None if denied else 64, None if denied else 1200.0,
            t, t + 1e-4, t + 2e-4, t + 3e-4, t + 4e-4, None if denied else t + 5e-4,
            None if denied else t + 2e-3, t + 3e-3,
            403 if denied else 200, "127.0.0.1", uuid.uuid4().hex, f"{(i * 7919) % (1 << 64):016x}" * 2,
            None if denied else 1234.5, None if denied else 0.0, None, None])
    return rows


def _frames(rows: list[list[Any]], first_seq: int, spans: bool = True) -> list[bytes]:
    import orjson

    out = []
    for k, row in enumerate(rows):
        frame: dict[str, Any] = {"t": "r", "s": first_seq + k, "r": row}
        if spans:  # the span extra (only when the worker builds the request spans)
            frame["x"] = (0x1000 + first_seq + k, 1, time.time_ns(), None, None)
        out.append(orjson.dumps(frame, option=orjson.OPT_APPEND_NEWLINE))
    return out


def _thread_cpu(ident: int) -> float:
    return time.clock_gettime(time.pthread_getcpuclockid(ident))


def _name_thread(name: str) -> None:
    """Give the calling thread a kernel name (``/proc/<pid>/task/<tid>/comm``; Python 3.11 does not)."""
    import ctypes

    try:
        ctypes.CDLL(None).prctl(15, name.encode()[:15], 0, 0, 0)  # PR_SET_NAME
    except (OSError, AttributeError):  # pragma: no cover - not Linux
        pass


def _tasks() -> dict[int, dict[str, Any]]:
    """Per thread of this process (``/proc/self/task``, Linux): kernel name, CPU time on the core
    (``run_ns``) and time runnable but waiting for one (``wait_ns``, contention) from ``schedstat``,
    voluntary (blocked: a wait on epoll, a futex, a sleep) and involuntary (preempted) context switches
    from ``status``. Empty where ``/proc`` lacks them."""
    out: dict[int, dict[str, Any]] = {}
    try:
        tids = os.listdir("/proc/self/task")
    except OSError:
        return out
    for tid in tids:
        base = f"/proc/self/task/{tid}/"
        try:
            with open(base + "comm") as f:
                comm = f.read().strip()
            with open(base + "schedstat") as f:
                run_ns, wait_ns, _ = (int(x) for x in f.read().split())
            with open(base + "stat") as f:  # utime, stime: fields 14, 15 (clock ticks), after "(comm)"
                utime, stime = (int(x) for x in f.read().rpartition(")")[2].split()[11:13])
            with open(base + "status") as f:
                st = dict(ln.split(":\t", 1) for ln in f.read().splitlines() if ":\t" in ln)
        except (OSError, ValueError):
            continue  # a thread that ended meanwhile
        out[int(tid)] = {"comm": comm, "run_ns": run_ns, "wait_ns": wait_ns, "sys_ticks": stime, "user_ticks": utime,
                         "vcsw": int(st.get("voluntary_ctxt_switches", 0)),
                         "ivcsw": int(st.get("nonvoluntary_ctxt_switches", 0))}
    return out


def thread_split(before: dict[int, dict[str, Any]], after: dict[int, dict[str, Any]], main_tid: int,
                 bench_tids: dict[int, str], n: int) -> dict[str, dict[str, float]]:
    """Per role, per event over a window of ``n`` events: ``cpu_us`` and ``runq_wait_us`` (µs) and
    ``vcsw``/``ivcsw`` (context switches), from two :func:`_tasks` snapshots. Roles: ``main`` (the
    worker's event loop), the bench's own threads by their name in ``bench_tids`` (not the worker's),
    and ``other`` (the worker's other threads: the event loop's default executor, which runs the JSONL
    sink's checkpoint ``fsync`` and aiohttp's name resolution), with ``threads`` = how many ran in the
    window. A thread that started inside the window counts from zero."""
    zero = {"run_ns": 0, "wait_ns": 0, "vcsw": 0, "ivcsw": 0, "sys_ticks": 0, "user_ticks": 0}
    tick_us = 1e6 / os.sysconf("SC_CLK_TCK")
    roles: dict[str, dict[str, float]] = {}
    for tid, a in after.items():
        b = before.get(tid, zero)
        role = "main" if tid == main_tid else bench_tids.get(tid, "other")
        r = roles.setdefault(role, {"cpu_us": 0.0, "sys_us": 0.0, "runq_wait_us": 0.0, "vcsw": 0.0, "ivcsw": 0.0,
                                    "threads": 0})
        d_run = a["run_ns"] - b["run_ns"]
        if d_run <= 0 and a["vcsw"] == b["vcsw"]:
            continue  # idle in the window
        r["cpu_us"] += d_run / 1e3
        r["runq_wait_us"] += (a["wait_ns"] - b["wait_ns"]) / 1e3
        r["sys_us"] += (a["sys_ticks"] - b["sys_ticks"]) * tick_us  # the kernel's share (tick resolution)
        r["vcsw"] += a["vcsw"] - b["vcsw"]
        r["ivcsw"] += a["ivcsw"] - b["ivcsw"]
        r["threads"] += 1
    for r in roles.values():
        for k in ("cpu_us", "sys_us", "runq_wait_us"):
            r[k] = round(r[k] / n, 2)
        for k in ("vcsw", "ivcsw"):
            r[k] = round(r[k] / n, 4)
    return roles


class _TimedSteps:
    """Awaitable driving coroutine ``coro`` step by step, adding each step's thread CPU (ns) to
    ``acc[key]``: what that coroutine itself runs between its awaits, not what other tasks run meanwhile."""

    def __init__(self, coro: Any, acc: dict[str, int], key: str) -> None:
        self.coro, self.acc, self.key = coro, acc, key

    def __await__(self) -> Any:
        coro, acc, key, clock = self.coro, self.acc, self.key, time.thread_time_ns
        value: Any = None
        exc: BaseException | None = None
        while True:
            t = clock()
            try:
                y = coro.send(value) if exc is None else coro.throw(exc)
            except StopIteration as stop:
                acc[key] += clock() - t
                return stop.value
            acc[key] += clock() - t
            try:
                value, exc = (yield y), None
            except GeneratorExit:
                coro.close()
                raise
            except BaseException as e:  # noqa: BLE001 - handed to the coroutine (cancellation)
                value, exc = None, e


#: what ``--split`` times in the worker: (key, module, class or None, attribute, coroutine function?)
SPLIT_POINTS = (
    ("read_loop", "audit.worker", None, "run", True),
    ("status_metrics", "audit.worker", None, "_report_loop", True),
    ("request_event", "audit.worker", None, "request_event", False),
    ("row_is_clean", "audit.worker", None, "row_is_clean", False),
    ("emit", "audit.log", "AuditLog", "emit", False),
    ("spans_request", "audit.worker_spans", "WorkerSpans", "request", False),
    ("delivery", "audit.log_delivery", "DeliveryLoop", "_run", True),
    ("send_jsonl", "audit.jsonl", "JsonlChainSink", "send", True),
    ("send_ocsf", "audit.ocsf", "OcsfFileSink", "send", True),
    ("send_syslog", "audit.syslog", "SyslogSink", "send", True),
    ("send_otlp_logs", "audit.otlp", "OtlpLogSink", "send", True),
    ("spans_post", "audit.span_post", "SpanPoster", "_run", True),
)


def _install_split(acc: dict[str, int]) -> None:
    """Wrap :data:`SPLIT_POINTS` in the tree under test: plain functions timed per call, coroutine
    functions per step (:class:`_TimedSteps`); each key's inclusive thread CPU (ns) goes to ``acc``."""
    import importlib

    clock = time.thread_time_ns
    for key, mod_name, cls_name, attr, is_coro in SPLIT_POINTS:
        owner: Any = importlib.import_module(mod_name)
        if cls_name:
            owner = getattr(owner, cls_name)
        fn = getattr(owner, attr)
        acc[key] = acc[key + "#calls"] = 0
        if is_coro:
            async def wrapped(*a: Any, _fn: Any = fn, _key: str = key, **k: Any) -> Any:
                return await _TimedSteps(_fn(*a, **k), acc, _key)
        else:
            def wrapped(*a: Any, _fn: Any = fn, _key: str = key, **k: Any) -> Any:
                t = clock()
                try:
                    return _fn(*a, **k)
                finally:
                    acc[_key] += clock() - t
                    acc[_key + "#calls"] += 1
        setattr(owner, attr, wrapped)
    acc["#inside_ns"], acc["#outside_ns"] = _wrapper_cost()


def _wrapper_cost(n: int = 50_000) -> tuple[int, int]:
    """ns per call a timed plain-function wrapper of :func:`_install_split` adds inside the timed figure
    and outside it (in the caller's), from a no-op function timed ``n`` times on this thread."""
    clock = time.thread_time_ns
    acc = [0]

    def noop(x: Any) -> Any:
        return x

    def wrapped(*a: Any, _fn: Any = noop, **k: Any) -> Any:
        t = clock()
        try:
            return _fn(*a, **k)
        finally:
            acc[0] += clock() - t

    t0 = clock()
    for i in range(n):
        noop(i)
    t1 = clock()
    for i in range(n):
        wrapped(i)
    t2 = clock()
    inside = acc[0] / n - (t1 - t0) / n
    return round(inside), round((t2 - t1) / n - (t1 - t0) / n - inside)


def split_exclusive(acc: dict[str, int], main_ns: int, n: int) -> dict[str, float]:
    """µs per event by part from ``--split``'s inclusive figures over a window of ``n`` events:
    ``read_loop`` without the per-event calls it makes (request_event, row_is_clean, the emits of
    request events, spans_request: ``decode_and_frames``), ``delivery`` without the sinks' sends
    (``delivery_loop``), and ``loop_rest`` = the main thread's CPU ``main_ns`` minus every task
    timed here: uvloop, transports' and aiohttp's protocol callbacks, timers, the GC, the wrappers."""
    inside, outside = acc.get("#inside_ns", 0), acc.get("#outside_ns", 0)
    calls = {k[:-6]: v for k, v in acc.items() if k.endswith("#calls")}
    us = {k: (v - inside * calls.get(k, 0)) / 1e3 / n for k, v in acc.items() if not k.startswith("#")
          and not k.endswith("#calls")}  # the plain wrappers' own cost taken out (_wrapper_cost)
    sends = sum(v for k, v in us.items() if k.startswith("send_"))
    out = {k: v for k, v in us.items() if k not in ("read_loop", "delivery")}
    wrapped = sum(calls.values()) * (inside + outside) / 1e3 / n  # wrappers' cost, all in the read loop's steps
    out["decode_and_frames"] = us["read_loop"] - us["request_event"] - us["row_is_clean"] - us["emit"] \
        - us["spans_request"] - wrapped
    out["wrappers"] = wrapped
    out["delivery_loop"] = us["delivery"] - sends
    tops = us["read_loop"] + us["status_metrics"] + us["delivery"] + us["spans_post"]
    out["loop_rest"] = main_ns / 1e3 / n - tops
    return {k: round(v, 2) for k, v in sorted(out.items(), key=lambda x: -x[1])}


def split_differences(rows: list[dict[str, Any]], names: list[str], changed: set[str]) -> dict[str, dict[str, Any]]:
    """Per part of ``--split`` results, per tree after the first: the median over rounds of (first tree's
    part - this tree's part scaled by the ratio of the two runs' *unchanged* parts), i.e. the difference
    with the round's machine drift taken out (two runs of one round moved together by ~5 % in an A/A on the
    shared machine); ``changed``: the parts a change touched (left out of the yardstick), with ``wrappers``.
    Returns ``{tree: {part: {"median": µs, "rounds": [µs, ...]}}}``; negative = the first tree is lower."""
    import statistics

    out: dict[str, dict[str, Any]] = {}
    rounds = sorted({r["round"] for r in rows})
    for t in names[1:]:
        per: dict[str, list[float]] = {}
        for i in rounds:
            a = next(r for r in rows if r["tree"] == names[0] and r["round"] == i)["split"]
            b = next(r for r in rows if r["tree"] == t and r["round"] == i)["split"]
            ua = sum(v for k, v in a.items() if k not in changed and k != "wrappers")
            ub = sum(v for k, v in b.items() if k not in changed and k != "wrappers")
            for k in a:
                per.setdefault(k, []).append(a[k] - b[k] * ua / ub)
        out[t] = {k: {"median": round(statistics.median(v), 2), "rounds": [round(x, 2) for x in v]}
                  for k, v in per.items()}
    return out


def _child(arg: dict[str, Any]) -> dict[str, Any]:
    """Runs in the child (PYTHONPATH = the tree under test): the worker on this thread, fed (module doc)."""
    import resource

    import orjson

    work = Path(arg["work"])
    r0, w0 = os.pipe()
    r1, w1 = os.pipe()
    result_fd = os.dup(1)
    os.dup2(r0, 0)
    os.close(r0)
    os.dup2(w1, 1)
    os.close(w1)

    from audit.keys import generate_signing_key

    (work / "keys").mkdir()
    generate_signing_key(work / "keys" / "audit.key")
    config = arg["config"]  # bench.audit_feed_rounds.worker_config (the parent's tree)
    warm, n, rate = int(arg["warmup"]), int(arg["events"]), float(arg["rate"])
    spans = bool(arg.get("spans", True))
    warm_frames = _frames(make_rows(warm), 1, spans)
    frames = _frames(make_rows(n, warm), warm + 1, spans)
    state: dict[str, Any] = {"ack": 0, "ready": threading.Event(), "metrics": b"", "closed": threading.Event()}
    out: dict[str, Any] = {}
    main_ident = threading.get_ident()
    main_tid = threading.get_native_id()
    bench_tids: dict[int, str] = {}
    import gc

    gcs = {"on": False, "t0": 0.0, "s": 0.0, "n": [0, 0, 0]}

    def gccb(phase: str, info: dict) -> None:  # time in the cyclic GC (worker thread) inside the window
        if threading.get_ident() != main_ident or not gcs["on"]:
            return
        if phase == "start":
            gcs["t0"] = time.thread_time()
        else:
            gcs["s"] += time.thread_time() - gcs["t0"]
            gcs["n"][info["generation"]] += 1

    gc.callbacks.append(gccb)

    def drain() -> None:
        _name_thread("bench-drain")
        bench_tids[threading.get_native_id()] = "bench_drain"
        buf = b""
        while True:
            data = os.read(r1, 1 << 16)
            if not data:
                break
            lines = (buf + data).split(b"\n")
            buf = lines.pop()
            for line in lines:
                f = orjson.loads(line)
                t = f.get("t")
                if t == "status":
                    state["ack"] = f["ack"]
                    state["dropped"] = f["dropped"]
                elif t == "ready":
                    state["ready"].set()
                elif t == "metrics":
                    state["metrics"] = f["text"]
                elif t == "error":
                    out["error"] = f
                    state["ready"].set()
                elif t == "closed":
                    state["closed"].set()

    def feed(batch: list[bytes]) -> None:
        t0 = time.monotonic()
        for i, fr in enumerate(batch):
            os.write(w0, fr)
            delay = t0 + (i + 1) / rate - time.monotonic()
            if delay > 0:
                time.sleep(delay)

    def wait_ack(seq: int, timeout: float) -> bool:
        end = time.monotonic() + timeout
        while state["ack"] < seq and time.monotonic() < end:
            time.sleep(0.01)
        return state["ack"] >= seq

    def feeder() -> None:
        _name_thread("bench-feeder")
        bench_tids[threading.get_native_id()] = "bench_feeder"
        me = threading.get_ident()
        drainer_ident = drainer.ident
        try:
            os.write(w0, orjson.dumps(config) + b"\n")
            state["ready"].wait(60)
            if "error" in out:
                return
            feed(warm_frames)
            wait_ack(warm, 30)
            time.sleep(1.2)  # the metrics report and the OTLP/span lingers of the warm-up
            p0, m0, f0, d0 = time.process_time(), _thread_cpu(main_ident), _thread_cpu(me), _thread_cpu(drainer_ident)
            ru0 = resource.getrusage(resource.RUSAGE_SELF)
            t0 = _tasks()
            split0 = dict(split_acc)
            spy = None
            if arg.get("spy"):  # py-spy samples this process from outside during the window (session 29)
                spy = subprocess.Popen([arg["spy_bin"], "record", "--pid", str(os.getpid()), "--rate",
                                        str(arg.get("spy_rate", 1000)), "--duration", str(int(n / rate + float(arg["tail"]) + 1)),
                                        "--format", "raw", "--threads", "--nonblocking", "--gil", "--output", arg["spy"]],
                                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            w_start = time.monotonic()
            gcs["on"] = True
            feed(frames)
            fed_s = time.monotonic() - w_start
            time.sleep(max(0.0, w_start + n / rate + float(arg["tail"]) - time.monotonic()))
            p1, m1, f1, d1 = time.process_time(), _thread_cpu(main_ident), _thread_cpu(me), _thread_cpu(drainer_ident)
            ru1 = resource.getrusage(resource.RUSAGE_SELF)
            t1 = _tasks()
            gcs["on"] = False
            # per thread (session 29): CPU, run-queue wait and context switches per event, by role
            out["threads"] = thread_split(t0, t1, main_tid, bench_tids, n)
            if split_acc:
                out["split"] = split_exclusive({k: v - split0.get(k, 0) if not k.startswith("#") else v
                                                for k, v in split_acc.items()},
                                               int((m1 - m0) * 1e9), n)
            if spy is not None:
                spy.wait(60)
                out["main_tid"] = main_tid
            out.update({
                "gc_us": round(gcs["s"] * 1e6 / n, 2), "gc_n": gcs["n"],
                "acked_in_window": state["ack"] >= warm + n,
                "worker_us": round(((p1 - p0) - (f1 - f0) - (d1 - d0)) * 1e6 / n, 2),
                "main_thread_us": round((m1 - m0) * 1e6 / n, 2),
                "feeder_us": round((f1 - f0) * 1e6 / n, 2),
                "fed_s": round(fed_s, 3),
                # the whole process (the feeder and drain threads too: their system time is their writes
                # and reads of the pipes): system CPU and minor page faults per event (session 28)
                "process_sys_us": round((ru1.ru_stime - ru0.ru_stime) * 1e6 / n, 2),
                "minflt_per_event": round((ru1.ru_minflt - ru0.ru_minflt) / n, 3),
                "maxrss_mib": round(ru1.ru_maxrss / 1024, 1),  # peak resident size (the bench's frames included)
            })
            out["all_acked"] = wait_ack(warm + n, 30)
            time.sleep(1.1)
            slow = [ln for ln in str(state["metrics"]).splitlines()
                    if ln.startswith("prefixgate_audit_slow_sends_total{") and not ln.endswith(" 0.0")]
            out["slow_sends"] = {ln.split('"')[1]: float(ln.rsplit(" ", 1)[1]) for ln in slow}
            out["dropped"] = state.get("dropped")
        finally:
            os.write(w0, b'{"t":"close","timeout":10}\n')
            os.close(w0)

    drainer = threading.Thread(target=drain, daemon=True)
    drainer.start()
    threading.Thread(target=feeder, daemon=True).start()
    from audit import worker

    if arg.get("read_interval") is not None:  # session 29: the worker's pipe read interval (seconds)
        worker.READ_INTERVAL_S = float(arg["read_interval"])
    split_acc: dict[str, int] = {}
    if arg.get("split"):
        _install_split(split_acc)
    prof = None
    if arg.get("profile"):
        import cProfile

        prof = cProfile.Profile(time.thread_time_ns, 1e-9)
        prof.enable()
    rc = worker.main()
    if prof is not None:
        prof.disable()
        prof.dump_stats(arg["profile"])
    state["closed"].wait(5)
    out["rc"] = rc
    os.write(result_fd, json.dumps(out).encode() + b"\n")
    return out


def _run(tree: Path, ports: tuple[int, int], args: Any, profile: str | None,
         spy: str | None = None) -> dict[str, Any]:
    from bench.audit_feed_rounds import worker_config

    with tempfile.TemporaryDirectory(prefix="pg-aow-") as work:
        config = worker_config(Path(work), Path(work) / "keys" / "audit.key", ports, spans=True)
        if args.sinks == "overhead":  # bench.overhead's PrefixGate (sim.demo.gateway_config): chain, OCSF, spill
            config = {"jsonl": config["jsonl"] | {"checkpoint_s": 10}, "ocsf": config["ocsf"],
                      "spill": config["spill"]}
        arg = {"work": work, "config": config, "rate": args.rate,
               "events": args.events, "warmup": args.warmup, "tail": args.tail, "profile": profile,
               "spans": args.sinks == "all"}
        arg["split"] = bool(args.split)
        arg["read_interval"] = args.read_interval
        for section in args.without:  # session 29: one sink (or the spans) left out, to see its whole in-situ cost
            config.pop(section, None)
            if section == "spans":
                arg["spans"] = False
        if spy:
            import shutil

            arg |= {"spy": spy, "spy_bin": os.environ.get("PG_PYSPY") or shutil.which("py-spy") or "py-spy"}
        res = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--child", json.dumps(arg)],
                             cwd=str(tree), env=dict(os.environ, PYTHONPATH=str(tree)), capture_output=True,
                             timeout=600)
        lines = res.stdout.decode().strip().splitlines()
        if res.returncode or not lines:
            raise SystemExit(f"{tree}: rc {res.returncode}\n{res.stderr.decode()[-3000:]}")
        return json.loads(lines[-1])


def main(argv: list[str] | None = None) -> int:
    """CLI (module doc); returns 0."""
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--child"]:
        _child(json.loads(argv[1]))
        return 0
    import click

    from bench.audit_feed_rounds import alternate_rounds, feed_trees, paired_medians
    from sim.click_options import ClickOptions

    ap = ClickOptions(description=__doc__.splitlines()[0])
    ap.option("--baseline", type=click.Path(path_type=Path, file_okay=False), default=None)
    ap.option("--same", is_flag=True, help="A/A: this tree twice per round")
    ap.option("--rate", type=float, default=1000.0, help="answers per second")
    ap.option("--events", type=int, default=6000, help="events in each measured window")
    ap.option("--warmup", type=int, default=500)
    ap.option("--tail", type=float, default=1.0, help="seconds after the feed inside the window")
    ap.option("--rounds", type=int, default=6)
    ap.option("--sinks", type=click.Choice(["all", "overhead"]), default="all",
              help="all: bench.audit_overhead's \"on\" sinks and spans; overhead: bench.overhead's (JSONL chain, "
                   "OCSF file, spill)")
    ap.option("--without", multiple=True, type=click.Choice(["ocsf", "syslog", "otlp", "spans"]),
              help="leave this sink (or the request spans) out of the worker's config (repeatable; session 29: "
                   "the difference to a run with it is its whole cost inside the worker, delivery included)")
    ap.option("--read-interval", type=float, default=None,
              help="seconds between the worker's pipe reads (audit.worker_stdin.READ_INTERVAL_S; default: the tree's)")
    ap.option("--split", is_flag=True, help="time the worker's tasks and per-event calls in thread CPU "
              "(SPLIT_POINTS; session 29): the main thread's CPU per event by part in each result's \"split\"")
    ap.option("--changed", default="", help="with --split: comma-separated parts a change touched (kept out of "
              "the drift yardstick of split_differences), e.g. emit,delivery_loop,send_syslog")
    ap.option("--profile", type=click.Path(path_type=Path, file_okay=False), default=None)
    ap.option("--spy", type=click.Path(path_type=Path, file_okay=False), default=None,
              help="py-spy (PG_PYSPY or on PATH) samples each run's window; raw stacks there, the main "
                   "thread's split by part in the result (bench.audit_worker_split)")
    ap.option("--name", default="audit_overhead_worker")
    ap.option("--out", type=click.Path(path_type=Path), default=RESULTS)
    args = ap.parse(argv)
    trees = feed_trees(REPO, args.baseline, args.same)

    def run(name: str, tree: Path, ports: tuple[int, int], i: int) -> dict[str, Any]:
        prof = None
        if args.profile:
            args.profile.mkdir(parents=True, exist_ok=True)
            prof = str(args.profile.resolve() / f"{name}-{i}.prof")
        spy = None
        if args.spy:
            args.spy.mkdir(parents=True, exist_ok=True)
            spy = str(args.spy.resolve() / f"{name}-{i}.txt")
        res = _run(tree, ports, args, prof, spy)
        if spy:
            from bench.audit_worker_split import spy_split

            res["spy_split"] = spy_split(Path(spy), int(res.get("main_tid", 0)))
        return res

    rows = alternate_rounds(trees, args.rounds, run)
    names = list(trees)
    med, diff = paired_medians(rows, names, ("worker_us", "main_thread_us"), args.rounds, digits=2)
    lower = {t: sum(1 for i in range(args.rounds)
                    if next(r["worker_us"] for r in rows if r["tree"] == names[0] and r["round"] == i)
                    < next(r["worker_us"] for r in rows if r["tree"] == t and r["round"] == i)) for t in names[1:]}
    result = {"bench": "audit_overhead_worker", "sinks": args.sinks, "without": list(args.without),
              "read_interval": args.read_interval, "split": bool(args.split), "rate": args.rate, "events": args.events, "tail_s": args.tail,
              "baseline": str(args.baseline) if args.baseline else None, "median": med,
              "median_round_difference_vs_this": diff, "rounds_this_lower": lower, "runs": rows,
              "load_end": os.getloadavg(), "cpus": os.cpu_count()}
    if args.split:
        result["split_differences"] = split_differences(rows, names, set(args.changed.split(",")) if args.changed
                                                        else set())
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"{args.name}.json").write_text(json.dumps(result, indent=2) + "\n")
    md = [f"# Audit worker CPU per event, fed as bench.audit_overhead's \"on\" gateway ({args.rate:g}/s, "
          f"{args.events} events + {args.tail:g} s per window, {args.rounds} rounds, sinks {args.sinks})", "",
          f"Load average at the end: {tuple(round(x, 1) for x in os.getloadavg())}.", "",
          "| tree | worker µs/event, all threads (median) | event-loop thread µs/event |", "|---|---:|---:|",
          *[f"| {t} | {v['worker_us']} | {v['main_thread_us']} |" for t, v in med.items()], "",
          *[f"Median per-round difference {t} − {names[0]}: worker {v['worker_us']:+.2f}, main thread "
            f"{v['main_thread_us']:+.2f} µs/event; {names[0]} lower in {lower[t]} of {args.rounds} rounds."
            for t, v in diff.items()], "",
          "| round | tree | worker µs | main thread µs | process system µs | minor faults/event | acked in window "
          "| dropped | slow sends |",
          "|---|---|---:|---:|---:|---:|---|---|---|",
          *[f"| {r['round']} | {r['tree']} | {r['worker_us']} | {r['main_thread_us']} | {r.get('process_sys_us', '')} "
            f"| {r.get('minflt_per_event', '')} | {r['acked_in_window']} "
            f"| {r['dropped']} | {r['slow_sends'] or ''} |" for r in rows], ""]
    if args.split:  # session 29: the loop thread's CPU by part, per tree, and the drift-corrected differences
        import statistics

        parts = list(rows[0]["split"])
        sd = result["split_differences"]
        md += ["| part (µs/event, loop thread) | " + " | ".join(names) + " | "
               + " | ".join(f"{names[0]} − {t}, drift out" for t in names[1:]) + " |",
               "|---|" + "---:|" * (2 * len(names) - 1),
               *[f"| {k} | " + " | ".join(f"{statistics.median(r['split'][k] for r in rows if r['tree'] == t):.2f}"
                                          for t in names)
                 + " | " + " | ".join(f"{sd[t][k]['median']:+.2f}" for t in names[1:]) + " |" for k in parts], ""]
    (args.out / f"{args.name}.md").write_text("\n".join(md))
    print("\n".join(md))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
