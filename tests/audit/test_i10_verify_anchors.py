"""Issue 10, finding 9: a truncated audit file must not verify as OK.

The JSONL chain is written by a real AuditLog together with the OCSF file sink
and a CEF/syslog sink (raw octet-counting receiver writing what it receives to
a file); both carry the checkpoint copies (``kind=checkpoint`` events, keyed by
``head_seq`` and ``head``). ``prefixgate audit verify --anchors`` reads them
back: a chain file cut after an internal checkpoint but before a later,
externally copied checkpoint is ``truncated`` (exit 1); event records after
the last anchored checkpoint are ``unanchored`` (exit 3), never plain OK.
"""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from click.testing import CliRunner
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

sys.path.insert(0, os.path.dirname(__file__))
from octet_receiver import OctetReceiver  # noqa: E402

from audit.chain import sign_checkpoint  # noqa: E402
from audit.cli import EXIT_UNANCHORED, audit_group  # noqa: E402
from audit.event import AuditEvent, Kind, Outcome  # noqa: E402
from audit.jsonl import JsonlChainSink, list_log_files  # noqa: E402
from audit.keys import generate_signing_key, load_public_key, load_signing_key  # noqa: E402
from audit.log import AuditLog  # noqa: E402
from audit.ocsf import OcsfFileSink  # noqa: E402
from audit.syslog import SyslogSink  # noqa: E402
from audit.verify import verify_files  # noqa: E402
from audit.verify_anchors import load_anchors  # noqa: E402
from tests.support.waiting import wait_for


def _ev(i: int) -> AuditEvent:
    return AuditEvent(kind=Kind.INFERENCE, outcome=Outcome.ALLOWED, request_id=f"r{i}", tenant="tenant-a")


_until = wait_for


async def _write_trail(tmp: Path) -> dict[str, Path]:
    """30 events in three batches with a checkpoint after each batch, then
    close (final checkpoint); every checkpoint is copied to OCSF and CEF."""
    key_file = tmp / "keys" / "audit.key"
    key_file.parent.mkdir()
    generate_signing_key(key_file)
    receiver = OctetReceiver(out=tmp / "syslog-received.log")
    await receiver.start()
    jsonl = JsonlChainSink(tmp / "audit", load_signing_key(key_file), checkpoint_s=3600, fsync=False)
    alog = AuditLog([jsonl, OcsfFileSink(str(tmp / "ocsf.jsonl")),
                     SyslogSink("127.0.0.1", receiver.port, "tcp")], tmp / "spill")
    await alog.start()
    for b in range(3):
        for i in range(10):
            alog.emit(_ev(b * 10 + i))
        assert await alog.drain(10)
        jsonl.checkpoint()  # forwarded to the OCSF and syslog sinks
        assert await alog.drain(10)
    await alog.close()
    await _until(lambda: len(receiver.frames) >= 30 + 4)
    await receiver.stop()
    assert receiver.errors == []
    return {"key": key_file, "pub": Path(str(key_file) + ".pub"), "dir": tmp / "audit",
            "ocsf": tmp / "ocsf.jsonl", "syslog": tmp / "syslog-received.log"}


def _cli(*args: str) -> tuple[int, str]:
    res = CliRunner().invoke(audit_group, ["verify", *args])
    return res.exit_code, res.output


def _checkpoint_lines(path: Path) -> list[int]:
    return [i for i, line in enumerate(path.read_text().splitlines()) if '"type":"checkpoint"' in line]


async def test_intact_log_with_anchors_is_ok(tmp_path: Path) -> None:
    t = await _write_trail(tmp_path)
    for anchor_file in ("ocsf", "syslog"):
        anchors, problems = load_anchors([t[anchor_file]])
        assert problems == [] and len(anchors) == 4, anchor_file  # 3 + the final one, from each sink
        report = verify_files([t["dir"]], load_public_key(t["pub"]), anchors=anchors)
        assert report.ok and report.status == "OK", report.problems
        assert report.anchors_matched == 4 and report.unanchored_records == 0
    code, out = _cli(str(t["dir"]), "--public-key", str(t["pub"]), "--anchors", str(t["ocsf"]),
                     "--anchors", str(t["syslog"]))
    assert code == 0, out
    assert "-> OK" in out and "unanchored_records=0" in out


async def test_file_cut_after_an_internal_checkpoint_is_truncated(tmp_path: Path) -> None:
    t = await _write_trail(tmp_path)
    (log_file,) = list_log_files(t["dir"])
    lines = log_file.read_text().splitlines(keepends=True)
    cut_after = _checkpoint_lines(log_file)[1]  # keep up to the second checkpoint: 10 events and a checkpoint gone
    log_file.write_text("".join(lines[:cut_after + 1]))
    # the hole: the files alone look complete (ends on a signed checkpoint)
    alone = verify_files([t["dir"]], load_public_key(t["pub"]))
    assert alone.ok and alone.unsealed_records == 0
    for anchor_file in ("ocsf", "syslog"):
        code, out = _cli(str(t["dir"]), "--public-key", str(t["pub"]), "--anchors", str(t[anchor_file]))
        assert code == 1, out
        assert "-> FAILED" in out and "truncated" in out
    anchors, _ = load_anchors([t["ocsf"]])
    report = verify_files([t["dir"]], load_public_key(t["pub"]), anchors=anchors)
    assert {p.kind for p in report.problems} == {"truncated"}
    assert len(report.problems) == 2  # the third and the final checkpoint copies


async def test_records_after_the_last_anchored_checkpoint_are_unanchored(tmp_path: Path) -> None:
    t = await _write_trail(tmp_path)
    # the copies of the third and the final checkpoint never reached the OCSF file
    ocsf_lines = t["ocsf"].read_text().splitlines(keepends=True)
    cps = [i for i, line in enumerate(ocsf_lines) if '"head_seq"' in line]
    assert len(cps) == 4
    t["ocsf"].write_text("".join(line for i, line in enumerate(ocsf_lines) if i not in cps[2:]))
    code, out = _cli(str(t["dir"]), "--public-key", str(t["pub"]), "--anchors", str(t["ocsf"]))
    assert code == EXIT_UNANCHORED, out
    assert "-> UNANCHORED" in out and "-> OK" not in out
    assert "unanchored_records=10" in out  # the third batch
    # and after that tail is cut, it is still reported (unanchored, not OK), never silently complete
    (log_file,) = list_log_files(t["dir"])
    lines = log_file.read_text().splitlines(keepends=True)
    log_file.write_text("".join(lines[:_checkpoint_lines(log_file)[1] + 1]))
    code, out = _cli(str(t["dir"]), "--public-key", str(t["pub"]), "--anchors", str(t["ocsf"]))
    assert code == 0 and "unanchored_records=0" in out  # what is left is fully anchored


async def test_forged_and_foreign_anchors(tmp_path: Path) -> None:
    t = await _write_trail(tmp_path)
    anchors, _ = load_anchors([t["ocsf"]])
    # a copy claiming a later head with this key's id but a bad signature: refused, not trusted
    forged = dict(anchors[-1], head_seq=anchors[-1]["head_seq"] + 5, source="forged")
    # a copy from another gateway (another key): ignored
    other = sign_checkpoint(Ed25519PrivateKey.generate(), {"file": "x", "head_seq": 10 ** 6, "head": "0" * 64,
                                                            "time": "2024-01-01T00:00:00.000Z"})
    report = verify_files([t["dir"]], load_public_key(t["pub"]), anchors=[*anchors, forged, dict(other)])
    assert [p.kind for p in report.problems] == ["bad_anchor"]
    assert report.anchors_foreign == 1 and report.anchors_matched == 4


async def test_verify_without_anchors_says_it_did_not_check_them(tmp_path: Path) -> None:
    t = await _write_trail(tmp_path)
    code, out = _cli(str(t["dir"]), "--public-key", str(t["pub"]))
    assert code == 0 and "--anchors" in out
    assert json.loads(t["ocsf"].read_text().splitlines()[0])["metadata"]["uid"]
