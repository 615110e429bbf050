"""Audit overhead benchmark (not a test): ``python -m bench.audit_sinks [--events N] [--out FILE]``.

Measures the request-path cost of ``AuditLog.emit`` (µs per event) and the
end-to-end time to deliver N events, (a) with no sinks' work (null sink) and
(b) with the JSONL chain + OCSF file + rsyslog CEF/TCP sinks (rsyslog only
if installed). Results are written as JSON to ``--out``.
Slow outage run: ``PREFIXGATE_AUDIT_OUTAGE_S=60 python -m pytest
tests/audit/test_syslog_rsyslog.py -k killed``.
"""
from __future__ import annotations

import asyncio
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

import click
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from audit.event import AuditEvent, Identity, Kind, Outcome, PolicyInfo, RouteInfo
from audit.jsonl import JsonlChainSink
from audit.log import AuditLog
from audit.ocsf import OcsfFileSink
from audit.syslog import SyslogSink


class _NullSink:
    name = "null"

    async def open(self) -> None: ...
    async def send(self, events: list[AuditEvent]) -> None: ...
    async def close(self) -> None: ...


def _event(i: int) -> AuditEvent:
    return AuditEvent(kind=Kind.INFERENCE, outcome=Outcome.ALLOWED, request_id=f"req-{i}", tenant="acme",
                      identity=Identity("spiffe://example.org/ns/a/sa/w", "example.org"),
                      policy=PolicyInfo("0d6f3c1e-7f7a-4b1c-9a51-3c1e7f7a4b1c", "ok"), endpoint="/v1/chat/completions",
                      model="sim", prompt_tokens=1024, output_tokens=64, route=RouteInfo("r1", "default", "prefix", 1024, 768, None, 3),
                      prefix_fingerprint="a1b2c3d4e5f60718a1b2c3d4e5f60718", client_address="10.0.0.7")


async def _run(sinks, tmp: Path, n: int) -> dict[str, float]:
    alog = AuditLog(sinks, tmp / "spill", queue_size=n + 10)
    await alog.start()
    events = [_event(i) for i in range(n)]
    t0 = time.perf_counter()
    for i, ev in enumerate(events):
        alog.emit(ev)
        if i % 200 == 0:
            await asyncio.sleep(0)
    emit_s = time.perf_counter() - t0
    await alog.drain(120)
    total_s = time.perf_counter() - t0
    await alog.close()
    return {"emit_us_per_event": emit_s / n * 1e6, "deliver_us_per_event": total_s / n * 1e6, "dropped": alog.dropped}


async def _main(n: int) -> dict[str, object]:
    out: dict[str, object] = {"events": n, "python": sys.version.split()[0]}
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        out["null_sink"] = await _run([_NullSink()], tmp / "a", n)
        sinks = [JsonlChainSink(tmp / "log", Ed25519PrivateKey.generate(), checkpoint_s=5), OcsfFileSink(str(tmp / "ocsf.jsonl"))]
        rs = None
        if shutil.which("rsyslogd"):
            sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "audit"))
            from rsyslog_helper import Rsyslog

            (tmp / "rs").mkdir()
            rs = Rsyslog(tmp / "rs")
            rs.start()
            sinks.append(SyslogSink("127.0.0.1", rs.port))
        try:
            out["all_sinks"] = await _run(sinks, tmp / "b", n)
            out["sinks"] = [s.name for s in sinks]
        finally:
            if rs is not None:
                rs.stop()
    return out


@click.command()
@click.option("--events", default=20_000, show_default=True)
@click.option("--out", default="bench/results/audit_sinks.json", show_default=True)
def main(events: int, out: str) -> None:
    """Run the audit overhead benchmark and write JSON results."""
    result = asyncio.run(_main(events))
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    Path(out).write_text(json.dumps(result, indent=2))
    click.echo(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
