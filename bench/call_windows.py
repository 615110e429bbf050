"""Python and C calls per window of a served sequential request, this tree vs others (not a test).

``python -m bench.call_windows [--baseline DIR ...] [--requests 8] [--name NAME]``

Issue 14, session 30 (helper cut30). :mod:`bench.critical_path` times the gateway's two windows on a sequential
client's path in thread CPU, where two identical trees differ by 4-10 µs; :mod:`bench.pre_path` counts the calls
of the ``pre`` window in process, without the server, the sockets or the answer. This bench counts, in a serving
``prefixgate serve`` (the configuration of :mod:`bench.overhead`: JWT-SVID, HMAC chain, embedded OPA, JSONL + OCSF
audit in the worker process; one simulated replica that answers at once), every ``call`` and ``c_call`` profile
event (``sys.setprofile``) of ``--requests`` sequential requests on one keep-alive connection, and splits each
request (from the guarded protocol's ``data_received`` of its head to the next one's) into:

* ``pre``: the request's bytes read -> ``UpstreamConnection.send`` called (the upstream write);
* ``wait`` (session 31): after the upstream write, before the replica's answer is read (since session 30 flow
  control's charge, ``PendingRelease.commit``, runs there), less ``run_prep``'s events;
* ``answer``: the replica's answer read (``UpstreamConnection.data_received``) -> the answer's last write
  (``CoalescingTransport.flush``), less the replica-wait work when it ran there (``Held.run_prep``: a loop
  callback, counted as ``prep`` wherever it ran; since session 31 ``Held.run_prep_logged`` in the write's step);
* ``tail``: after the last write (the deferred ends), up to the next request's bytes.

Counts read no clock: a cut that removes calls from a window shows here whatever the machine's load (two exports
of one tree differ by at most 1-2 events per window: periodic work, e.g. a trust-bundle check or a ``getpid``). Each tree is served in its own child (``PYTHONPATH`` = the tree), one after the other; reported
per tree and window: the median over the requests (the first request after the profile starts is dropped).
Session 31: the mean count per request of each call (``kind file:function``) per window, and for each
``--baseline`` the calls whose count differs by 0.5 or more (which calls a difference is made of).
Results: ``bench/results/<name>.{json,md}``.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import click

from sim.click_options import ClickOptions

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "bench" / "results"
WINDOWS = ("pre_py", "pre_c", "wait", "answer_py", "answer_c", "prep", "tail", "total")

_CHILD = r'''
import json, signal, sys
events = []
def prof(frame, event, arg):
    if event == "call":
        co = frame.f_code
        events.append(("py", co.co_filename.rsplit("/", 1)[-1], co.co_name, frame.f_back.f_code.co_name if frame.f_back else ""))
    elif event == "c_call":
        events.append(("c", "", getattr(arg, "__qualname__", "?"), frame.f_code.co_name))
def start(*_):
    sys.setprofile(prof)
def stop(*_):
    sys.setprofile(None)
    with open(OUT + ".tmp", "w") as f:
        json.dump(events, f)
    import os
    os.replace(OUT + ".tmp", OUT)
signal.signal(signal.SIGUSR1, start)
signal.signal(signal.SIGUSR2, stop)
from gateway.config import load_config
from gateway.server import run_serving, serve
run_serving(serve(load_config(CONFIG), config_path=CONFIG))
'''


def _is(e: list[str], kind: str, file: str, name: str) -> bool:
    return e[0] == kind and e[1] == file and e[2] == name


def _bounds(seg: list[list[str]]) -> tuple[int, int, int, int, int] | None:
    """One request's segment's marks: (upstream write, answer read, last write, ``run_prep``'s first event or
    -1, its events); None without a write, an answer read or a last flush (an error)."""
    try:
        up = next(i for i, e in enumerate(seg) if _is(e, "py", "upstream_conn.py", "send"))
        ans = next(i for i, e in enumerate(seg) if i > up and _is(e, "py", "upstream_conn.py", "data_received"))
        last = next(i for i, e in enumerate(seg) if i > ans and _is(e, "py", "coalesce.py", "flush"))
    except StopIteration:
        return None
    for i, e in enumerate(seg):  # a loop callback; since session 31 a call in the write's step
        if (_is(e, "py", "held.py", "run_prep") and e[3] in ("run", "")) or (
                _is(e, "py", "held.py", "run_prep_logged") and e[3] == "_route_and_proxy"):
            stop = "run" if e[2] == "run_prep" else "_route_and_proxy"
            j = i + 1
            while j < len(seg) and seg[j][3] != stop:
                j += 1
            return up, ans, last, i, j - i
    return up, ans, last, -1, 0


def _segments(events: list[list[str]]) -> list[tuple[list[list[str]], tuple[int, int, int, int, int]]]:
    """The requests' segments (between two head reads) with their :func:`_bounds`; errors left out."""
    heads = [i for i, e in enumerate(events) if _is(e, "py", "http_guard.py", "data_received")]
    out = []
    for a, b in zip(heads, heads[1:]):
        seg = events[a:b]
        if (marks := _bounds(seg)) is not None:
            out.append((seg, marks))
    return out


def _parts(seg: list[list[str]], marks: tuple[int, int, int, int, int]) -> dict[str, list[list[str]]]:
    """The events of each window of one request: ``pre``, ``wait`` (after the write, before the answer read:
    session 31, where flow control's charge runs since session 30), ``answer``, ``prep``, ``tail`` (the
    ``run_prep`` events only in ``prep``)."""
    up, ans, last, prep_at, prep = marks
    in_prep = set(range(prep_at, prep_at + prep)) if prep_at >= 0 else set()
    pick = lambda lo, hi: [seg[i] for i in range(lo, hi) if i not in in_prep]  # noqa: E731
    return {"pre": seg[:up + 1], "wait": pick(up + 1, ans), "answer": pick(ans, last + 1),
            "prep": [seg[i] for i in sorted(in_prep)], "tail": pick(last + 1, len(seg))}


def split_windows(events: list[list[str]]) -> list[dict[str, int]]:
    """Per request (between two head reads), the counts of :data:`WINDOWS` (module doc). Requests without an
    upstream write or a last flush (an error) are left out."""
    rows = []
    for seg, marks in _segments(events):
        p = _parts(seg, marks)
        rows.append({"pre_py": sum(e[0] == "py" for e in p["pre"]), "pre_c": sum(e[0] == "c" for e in p["pre"]),
                     "wait": len(p["wait"]), "answer_py": sum(e[0] == "py" for e in p["answer"]),
                     "answer_c": sum(e[0] == "c" for e in p["answer"]), "prep": len(p["prep"]),
                     "tail": len(p["tail"]), "total": len(seg)})
    return rows


def window_names(events: list[list[str]]) -> dict[str, dict[str, float]]:
    """Per window, the mean events per request of each ``kind file:function`` (session 31: which calls a
    difference between trees is made of); the first request is left out, as in :func:`split_windows`."""
    segs = _segments(events)[1:]
    out: dict[str, dict[str, float]] = {}
    for seg, marks in segs:
        for w, evs in _parts(seg, marks).items():
            d = out.setdefault(w, {})
            for e in evs:
                k = f"{e[0]} {e[1]}:{e[2]}"
                d[k] = d.get(k, 0.0) + 1.0 / len(segs)
    return out


def names_diff(a: dict[str, dict[str, float]], b: dict[str, dict[str, float]]) -> list[tuple[str, str, float, float]]:
    """(window, call, mean in ``a``, mean in ``b``) for every call whose mean count per request differs by
    0.5 or more between the two :func:`window_names` results."""
    rows = []
    for w in sorted(set(a) | set(b)):
        x, y = a.get(w, {}), b.get(w, {})
        rows += [(w, k, x.get(k, 0.0), y.get(k, 0.0)) for k in sorted(set(x) | set(y))
                 if abs(x.get(k, 0.0) - y.get(k, 0.0)) >= 0.5]
    return rows


async def count_tree(tree: Path, requests: int, work: Path) -> dict[str, Any]:
    """Serve ``tree``'s gateway under the profile hook and count ``requests`` sequential requests' calls."""
    import yaml

    from bench.harness import start_demo_stack
    from bench.overhead import _Body, _second_config, sequential
    from sim.demo import ClusterSpec
    from sim.procs import stop_process, wait_for_url

    stack = await start_demo_stack(work, ClusterSpec(replicas=1, time_scale=1e6, decode_s_per_token=0.0))
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"} | {"PYTHONPATH": str(tree)}
    try:
        doc = _second_config(stack.gateway_config(["tenant-a"]), stack.paths, "calls")
        cfg, out = work / "gw.yaml", work / "events.json"
        cfg.write_text(yaml.safe_dump(doc, sort_keys=False))
        hdr = {"Content-Type": "application/json", **dict(stack.headers_for(["tenant-a"])("tenant-a"))}
        code = f"CONFIG = {str(cfg)!r}\nOUT = {str(out)!r}\n" + _CHILD
        proc = subprocess.Popen([sys.executable, "-c", code], cwd=tree, env=env, stdout=subprocess.DEVNULL,
                                stderr=(work / "gw.err").open("wb"))
        try:
            base = f"http://127.0.0.1:{doc['listen']['port']}"
            await wait_for_url(base + "/readyz", timeout_s=60.0)
            await sequential(base + "/v1/completions", hdr, 200, _Body(False))
            os.kill(proc.pid, signal.SIGUSR1)
            await asyncio.sleep(0.2)
            seq = await sequential(base + "/v1/completions", hdr, requests + 1, _Body(False))
            await asyncio.sleep(0.2)
            os.kill(proc.pid, signal.SIGUSR2)
            deadline = time.monotonic() + 30
            while not out.exists() and time.monotonic() < deadline:
                await asyncio.sleep(0.1)
            events = json.loads(out.read_text())
            rows = split_windows(events)[1:]
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=30)
    finally:
        stop_process(stack.cluster)
    return {"tree": str(tree), "errors": seq["errors"], "requests": len(rows),
            **{k: statistics.median(r[k] for r in rows) for k in WINDOWS}, "names": window_names(events)}


def to_markdown(docs: list[dict[str, Any]], name: str) -> str:
    """The per-tree table."""
    lines = [f"# Calls per window of a served sequential request (`python -m bench.call_windows`), {name}", "",
             "Profile events (`call` + `c_call`) per request, median over the requests; module doc for the windows.",
             "", "| tree | requests | errors | " + " | ".join(WINDOWS) + " |", "|---|---:|---:|" + "---:|" * len(WINDOWS)]
    lines += [f"| `{d['tree']}` | {d['requests']} | {d['errors']} | " + " | ".join(f"{d[k]:g}" for k in WINDOWS) + " |"
              for d in docs]
    for d in docs[1:]:  # session 31: which calls make a difference (mean events per request, >= 0.5 apart)
        lines += ["", f"Calls whose mean count per request differs, `{docs[0]['tree']}` vs `{d['tree']}`:", "",
                  "| window | call | this | that |", "|---|---|---:|---:|"]
        lines += [f"| {w} | `{k}` | {x:.2f} | {y:.2f} |" for w, k, x, y in names_diff(docs[0]["names"], d["names"])]
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point."""
    ap = ClickOptions(prog="python -m bench.call_windows", description=__doc__.splitlines()[0])
    ap.option("--baseline", multiple=True, type=click.Path(path_type=Path))
    ap.option("--requests", type=int, default=8)
    ap.option("--out", type=click.Path(path_type=Path), default=RESULTS)
    ap.option("--name", default="call_windows")
    args = ap.parse(list(sys.argv[1:] if argv is None else argv))
    docs = [asyncio.run(count_tree(tree.resolve(), args.requests, Path(tempfile.mkdtemp(prefix="pg-calls-"))))
            for tree in (REPO, *args.baseline)]
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"{args.name}.json").write_text(json.dumps(docs, indent=2) + "\n")
    md = to_markdown(docs, args.name)
    (args.out / f"{args.name}.md").write_text(md)
    print(md, end="")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
