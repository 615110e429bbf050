from __future__ import annotations

import pytest
from click.testing import CliRunner

from audit.cli import audit_group
from audit.config import AuditConfigError, build_audit
from audit.event import AuditEvent, Kind, Outcome
from audit.jsonl import list_log_files
from audit.keys import generate_signing_key


async def test_build_audit_end_to_end_and_cli_verify(tmp_path):
    keydir = tmp_path / "keys"
    keydir.mkdir()
    runner = CliRunner()
    res = runner.invoke(audit_group, ["keygen", str(keydir / "audit.key")])
    assert res.exit_code == 0, res.output
    cfg = {
        "jsonl": {"dir": str(tmp_path / "log"), "signing_key_file": str(keydir / "audit.key"), "checkpoint_s": 3600},
        "ocsf": {"file": str(tmp_path / "ocsf.jsonl")},
        "spill": {"dir": str(tmp_path / "spill"), "max_bytes": 1 << 20},
    }
    alog = build_audit(cfg)
    await alog.start()
    for i in range(10):
        alog.emit(AuditEvent(kind=Kind.INFERENCE, outcome=Outcome.ALLOWED, request_id=f"r{i}"))
    assert await alog.drain(5)
    await alog.close()
    ocsf_lines = (tmp_path / "ocsf.jsonl").read_text().splitlines()
    assert len(ocsf_lines) == 11  # 10 events + the final checkpoint (off-host copy)
    assert '"Audit checkpoint"' in ocsf_lines[-1]
    files = [str(p) for p in list_log_files(tmp_path / "log")]
    res = runner.invoke(audit_group, ["verify", *files, "--public-key", str(keydir / "audit.key.pub")])
    assert res.exit_code == 0 and "OK" in res.output
    log_file = list_log_files(tmp_path / "log")[0]
    log_file.write_text(log_file.read_text().replace('"r4"', '"r5"'))
    res = runner.invoke(audit_group, ["verify", str(tmp_path / "log"), "--public-key", str(keydir / "audit.key.pub")])
    assert res.exit_code == 1 and "modified" in res.output


def test_key_inside_log_dir_refused(tmp_path):
    (tmp_path / "log").mkdir()
    generate_signing_key(tmp_path / "log" / "k.pem")
    with pytest.raises(AuditConfigError):
        build_audit({"jsonl": {"dir": str(tmp_path / "log"), "signing_key_file": str(tmp_path / "log" / "k.pem")},
                     "spill": {"dir": str(tmp_path / "s")}})
