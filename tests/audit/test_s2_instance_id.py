"""Every audit event of a worker carries its instance id (``audit.instance``, issue 16).

``prefixgate serve --workers N`` gives each worker its own audit chain (its
own ``jsonl.dir``) and sets ``audit.instance``; the audit log stamps it on
every event it emits, checkpoints included, and the chain still verifies.
"""
from __future__ import annotations

import json

from click.testing import CliRunner

from audit.cli import audit_group
from audit.config import build_audit
from audit.event import AuditEvent, Kind, Outcome
from audit.jsonl import list_log_files


async def test_every_event_of_a_worker_names_its_instance_and_the_chain_verifies(tmp_path) -> None:
    runner = CliRunner()
    assert runner.invoke(audit_group, ["keygen", str(tmp_path / "audit.key")]).exit_code == 0
    alog = build_audit({
        "instance": "host-a/w1",
        "jsonl": {"dir": str(tmp_path / "log"), "signing_key_file": str(tmp_path / "audit.key"), "checkpoint_s": 3600},
        "spill": {"dir": str(tmp_path / "spill"), "max_bytes": 1 << 20},
    })
    await alog.start()
    for i in range(3):
        alog.emit(AuditEvent(kind=Kind.INFERENCE, outcome=Outcome.ALLOWED, request_id=f"r{i}"))
    assert await alog.drain(5)
    await alog.close()
    files = list_log_files(tmp_path / "log")
    lines = [json.loads(x) for f in files for x in f.read_text().splitlines()]
    events = [x["body"] for x in lines if "kind" in x.get("body", {})]
    assert len(events) == 3
    assert {e.get("instance") for e in events} == {"host-a/w1"}, events
    assert AuditEvent.from_dict(events[0]).instance == "host-a/w1"
    res = runner.invoke(audit_group, ["verify", *map(str, files), "--public-key", str(tmp_path / "audit.key.pub")])
    assert res.exit_code == 0 and "OK" in res.output, res.output
