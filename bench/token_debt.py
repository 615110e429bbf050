"""Benchmark (review R3-2): what a refused huge prompt of a tenant in prompt-token debt costs.

``python -m bench.token_debt [--flood-s S] [--flood-rps R] [--out STEM]``

Two arms each: ``before`` (admission does not read the prompt-token bucket before tokenizing:
``Admission.prompt_room`` patched to answer ``None``, the code before the fix) and ``after``.

1. **CPU per refused request**, in process (no sockets, the public ASGI app as in
   ``bench.refusal_cost``): tenant ``f`` (``prompt_tokens_per_s`` 100, burst 100) is put deep
   in debt, then sends completion requests of about 1 MiB (``"a " x 520000``: 520000 tokens).
   Each is answered 429 ``token_rate_limited``. Reported: process CPU ms per refusal, the best of
   ``--rounds`` rounds. What remains after the fix is reading, ``json.loads`` and validating the
   1 MiB body.
2. **Another tenant's latency under the flood**, loopback: one simulated replica
   (``sim.cluster``, its own process), the gateway in a child process, the clients here. Tenant
   ``f`` (in debt) sends one 1 MiB request every ``1/R`` s for ``S`` s; tenant ``b`` sends one
   20-word request (``max_tokens`` 4) every 0.2 s. Reported: ``b``'s end-to-end p50/p90, ``f``'s
   statuses, the gateway process CPU seconds (``/proc``).

Bounded: about ``2 x (S + 10)`` s plus part 1. A benchmark, not a test; the machine may be shared.
"""

from __future__ import annotations

import asyncio
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

from bench.fairness import ROOT, TD, _config
from bench.harness import asgi_post_best_cpu_ns
from sim.click_options import ClickOptions
from sim.spiffe_issuer import DemoIssuer

HUGE = "a " * 520_000
F_LIMITS = {"prompt_tokens_per_s": 100, "prompt_tokens_burst": 100}


def _doc(tmp: Path, url: str, issuer: DemoIssuer) -> dict[str, Any]:
    doc = _config(tmp, url, issuer, {"enabled": False, "shed_loop_lag_s": None}, {})
    for t in doc["tenancy"]["tenants"]:
        if t["id"] == "f":
            t.update(F_LIMITS)
    return doc


def _build(cfg_file: Path, arm: str) -> Any:
    from gateway.auditing import AuditHub
    from gateway.build import build
    from gateway.config import load_config

    gw = build(load_config(cfg_file), audit=AuditHub(None))
    if arm == "before":
        gw.admission.prompt_room = lambda tenant: None  # type: ignore[method-assign]
    return gw


def _in_debt(gw: Any) -> None:
    """Tenant ``f``'s prompt bucket: a reservation of 10^7 tokens never settled (deep debt)."""
    tenant = gw.admission.registry.resolve(f"spiffe://{TD}/f/app")
    gw.admission.ledger.reserve(tenant, 10**7, 0)


async def cpu_per_refusal(arm: str, requests: int, rounds: int) -> dict[str, Any]:
    """Part 1: statuses and best process CPU ms per refused 1 MiB request."""
    from gateway.app import build_public_app

    tmp = Path(tempfile.mkdtemp(prefix="pg-tokdebt-"))
    issuer = DemoIssuer(TD)
    (tmp / "gw.yaml").write_text(yaml.safe_dump(_doc(tmp, "http://127.0.0.1:9", issuer)))
    gw = _build(tmp / "gw.yaml", arm)
    await gw.start()
    _in_debt(gw)
    app = build_public_app(gw, manage_lifecycle=False)
    token = issuer.mint(f"spiffe://{TD}/f/app", "prefixgate", ttl_s=600)
    body = json.dumps({"model": "sim-model", "prompt": HUGE, "max_tokens": 8}).encode()
    statuses, ns = await asgi_post_best_cpu_ns(app, body, token, warm=1, requests=requests, rounds=rounds)
    await gw.stop()
    return {"statuses": statuses, "cpu_ms_per_refusal": round(ns / 1e6, 2)}


async def _serve(cfg_file: str, ready_file: str, arm: str) -> None:
    """Child process: one gateway (``arm``) with ``f`` in debt, until SIGTERM."""
    from bench.harness import serve_public, serve_until_sigterm

    gw = _build(Path(cfg_file), arm)
    await gw.start()
    _in_debt(gw)
    server, task, port = await serve_public(gw)
    Path(ready_file).write_text(json.dumps({"port": port, "pid": os.getpid()}))
    await serve_until_sigterm(server, task)
    await gw.stop()


def _cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _pct(values: list[float], q: float) -> float | None:
    s = sorted(values)
    return round(s[min(len(s) - 1, int(q * len(s)))] * 1000.0, 1) if s else None


async def flood(arm: str, replica_url: str, seconds: float, rps: float) -> dict[str, Any]:
    """Part 2: ``b``'s latency while ``f`` floods (see module doc)."""
    import aiohttp

    tmp = Path(tempfile.mkdtemp(prefix="pg-tokdebt-"))
    issuer = DemoIssuer(TD)
    cfg_file, ready = tmp / "gw.yaml", tmp / "ready.json"
    cfg_file.write_text(yaml.safe_dump(_doc(tmp, replica_url, issuer)))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p))
    with open(tmp / "gw.log", "ab") as log:
        proc = subprocess.Popen([sys.executable, "-m", "bench.token_debt", "--serve", str(cfg_file), "--ready-file",
                                 str(ready), "--arm", arm], cwd=str(ROOT), env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 60
        while not ready.exists():
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError((tmp / "gw.log").read_text()[-2000:])
            await asyncio.sleep(0.05)
        url = f"http://127.0.0.1:{json.loads(ready.read_text())['port']}"
        tok_f = issuer.mint(f"spiffe://{TD}/f/app", "prefixgate", ttl_s=600)
        tok_b = issuer.mint(f"spiffe://{TD}/b/app", "prefixgate", ttl_s=600)
        huge = json.dumps({"model": "sim-model", "prompt": HUGE, "max_tokens": 8}).encode()
        timeout = aiohttp.ClientTimeout(total=15)
        lat: list[float] = []
        st_b: list[int] = []
        st_f: list[int] = []
        async with aiohttp.ClientSession(timeout=timeout) as s:
            async def one_b(i: int) -> None:
                body = {"model": "sim-model", "prompt": " ".join(f"b{i}x{k}" for k in range(20)), "max_tokens": 4}
                t0 = time.perf_counter()
                try:
                    async with s.post(url + "/v1/completions", json=body,
                                      headers={"Authorization": f"Bearer {tok_b}"}) as r:
                        await r.read()
                        st_b.append(r.status)
                        if r.status == 200:
                            lat.append(time.perf_counter() - t0)
                except (aiohttp.ClientError, asyncio.TimeoutError):
                    st_b.append(599)

            async def one_f() -> None:
                try:
                    async with s.post(url + "/v1/completions", data=huge, headers={
                            "Authorization": f"Bearer {tok_f}", "Content-Type": "application/json"}) as r:
                        await r.read()
                        st_f.append(r.status)
                except (aiohttp.ClientError, asyncio.TimeoutError):
                    st_f.append(599)

            for i in range(3):  # warm (b alone)
                await one_b(-1 - i)
            lat.clear()
            st_b.clear()
            cpu0 = _cpu_s(proc.pid)
            t_start = time.perf_counter()
            tasks: list[asyncio.Task[None]] = []
            nf = nb = 0
            while (now := time.perf_counter() - t_start) < seconds:
                if nf < now * rps:
                    tasks.append(asyncio.create_task(one_f()))
                    nf += 1
                if nb < now * 5:
                    tasks.append(asyncio.create_task(one_b(nb)))
                    nb += 1
                await asyncio.sleep(0.005)
            await asyncio.gather(*tasks)
            cpu = _cpu_s(proc.pid) - cpu0
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
    return {"b_p50_ms": _pct(lat, 0.5), "b_p90_ms": _pct(lat, 0.9), "b_ok": len(lat), "b_sent": len(st_b),
            "b_statuses": {str(k): st_b.count(k) for k in sorted(set(st_b))},
            "f_statuses": {str(k): st_f.count(k) for k in sorted(set(st_f))},
            "gateway_cpu_s": round(cpu, 2), "seconds": seconds, "f_rps": rps}


async def run(args: Any) -> dict[str, Any]:
    from sim.cluster import spawn_cluster

    out: dict[str, Any] = {"python": platform.python_version(), "loadavg_start": os.getloadavg(),
                           "cpu": {}, "flood": {}}
    for arm in ("before", "after"):
        out["cpu"][arm] = await cpu_per_refusal(arm, args.requests if arm == "before" else 10 * args.requests,
                                                args.rounds)
    with spawn_cluster(1, time_scale=100.0) as cp:
        for arm in ("before", "after"):
            out["flood"][arm] = await flood(arm, cp.urls[0], args.flood_s, args.flood_rps)
        out["flood"]["b_alone"] = await flood("after", cp.urls[0], args.flood_s, 0.0)
    out["loadavg_end"] = os.getloadavg()
    return out


def _markdown(doc: dict[str, Any]) -> str:
    c, f = doc["cpu"], doc["flood"]
    lines = ["# Token debt (review R3-2): a refused 1 MiB prompt of a tenant in prompt-token debt", "",
             f"`python -m bench.token_debt` · Python {doc['python']} · load "
             f"{', '.join(f'{x:.1f}' for x in doc['loadavg_start'])} → {', '.join(f'{x:.1f}' for x in doc['loadavg_end'])}"
             " (2 shared cores: noisy)", "",
             "## Gateway CPU per refused request (in process, best round)", "",
             "| arm | statuses | CPU ms / refusal |", "|---|---|---|"]
    for arm in ("before", "after"):
        lines.append(f"| {arm} | {c[arm]['statuses']} | {c[arm]['cpu_ms_per_refusal']} |")
    lines += ["", f"## Tenant b's latency while f floods ({f['after']['f_rps']} req/s of 1 MiB for "
              f"{f['after']['seconds']} s, loopback)", "",
              "| arm | b p50 ms | b p90 ms | b ok / sent | b statuses | f statuses | gateway CPU s |",
              "|---|---|---|---|---|---|---|"]
    for arm in ("b_alone", "before", "after"):
        r = f[arm]
        lines.append(f"| {arm} | {r['b_p50_ms']} | {r['b_p90_ms']} | {r['b_ok']} / {r['b_sent']} | {r['b_statuses']} "
                     f"| {r['f_statuses']} | {r['gateway_cpu_s']} |")
    lines += ["", "Before: every refused request was tokenized in full first (`check_prompt` after `prompt_tokens`). "
              "After: the bucket's room is read before tokenizing; the size of a 1 MiB prompt proves more tokens "
              "than the bucket admits, so nothing is tokenized. What a refusal still costs is the body: reading, "
              "`json.loads`, validation and the UTF-8 size of 1 MiB (O(body), on the event loop). A tenant with "
              "budget left still costs O(min(max_prompt_tokens, budget)) tokenizing per request."]
    return "\n".join(lines) + "\n"


def main() -> None:
    """Run both parts and write ``<out>.json`` and ``.md``."""
    ap = ClickOptions(description=(__doc__ or "").splitlines()[0])
    ap.option("--requests", type=int, default=5)
    ap.option("--rounds", type=int, default=3)
    ap.option("--flood-s", type=float, default=5.0)
    ap.option("--flood-rps", type=float, default=8.0)
    ap.option("--out", default=str(ROOT / "bench" / "results" / "token_debt-s3"))
    ap.option("--serve", hidden=True)
    ap.option("--ready-file", hidden=True)
    ap.option("--arm", default="after", hidden=True)
    args = ap.parse()
    if args.serve:
        asyncio.run(_serve(args.serve, args.ready_file, args.arm))
        return
    doc = asyncio.run(run(args))
    from bench.harness import write_json_and_markdown

    write_json_and_markdown(args.out, doc, _markdown(doc))


if __name__ == "__main__":
    main()
