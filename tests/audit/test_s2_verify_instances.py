"""``prefixgate audit verify`` over several instances' chains at once (issue 16).

Two real chains are written by two audit logs (``audit.instance`` host-a/w0 and
host-a/w1, as ``serve --workers 2`` configures them) under ``<dir>/worker-0``
and ``<dir>/worker-1``. Verified together they are two chains, each OK; a
record modified in one makes that chain (and the combined result) fail while
the other still reads OK; an event of the other instance spliced into a chain
and two chains naming one instance are reported.
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

from click.testing import CliRunner

from audit.cli import audit_group
from audit.config import build_audit
from audit.event import AuditEvent, Kind, Outcome
from audit.jsonl import list_log_files
from audit.keys import load_public_key
from audit.verify_instances import verify_instances


async def _write_chain(root: Path, key: Path, index: int, events: int) -> Path:
    """Write worker ``index``'s chain under ``root/worker-<index>`` and return that directory."""
    alog = build_audit({
        "instance": f"host-a/w{index}",
        "jsonl": {"dir": str(root / f"worker-{index}"), "signing_key_file": str(key), "checkpoint_s": 3600},
        "spill": {"dir": str(root / "spill" / f"worker-{index}"), "max_bytes": 1 << 20},
    })
    await alog.start()
    for i in range(events):
        alog.emit(AuditEvent(kind=Kind.INFERENCE, outcome=Outcome.ALLOWED, request_id=f"w{index}-r{i}"))
    assert await alog.drain(5)
    await alog.close()
    return root / f"worker-{index}"


async def _two_chains(tmp_path: Path) -> tuple[Path, Path, Path, Path]:
    runner = CliRunner()
    key = tmp_path / "audit.key"
    assert runner.invoke(audit_group, ["keygen", str(key)]).exit_code == 0
    root = tmp_path / "audit"
    w0 = await _write_chain(root, key, 0, 4)
    w1 = await _write_chain(root, key, 1, 5)
    return root, w0, w1, Path(str(key) + ".pub")


def _verify(*args: str) -> tuple[int, str]:
    res = CliRunner().invoke(audit_group, ["verify", *args])
    return res.exit_code, res.output


def _rewrite_event(chain_dir: Path, change) -> None:
    """Apply ``change(body)`` to the first event record of the chain's first file (hash left as it was)."""
    f = list_log_files(chain_dir)[0]
    lines = f.read_text().splitlines()
    for i, line in enumerate(lines):
        rec = json.loads(line)
        if rec["type"] == "event":
            change(rec["body"])
            lines[i] = json.dumps(rec, separators=(",", ":"))
            break
    f.write_text("\n".join(lines) + "\n")


async def test_two_instances_chains_verify_each_on_its_own_from_the_parent_or_each_directory(tmp_path) -> None:
    root, w0, w1, pub = await _two_chains(tmp_path)
    for args in ([str(root)], [str(w0), str(w1)]):
        code, out = _verify(*args, "--public-key", str(pub))
        assert code == 0, out
        assert f"chain {w0} instance=host-a/w0:" in out and f"chain {w1} instance=host-a/w1:" in out, out
        assert "combined: chains=2 ok=2 failed=0" in out and out.rstrip().endswith("-> OK"), out
    # one directory alone is still one chain with the single-chain report
    code, out = _verify(str(w1), "--public-key", str(pub))
    assert code == 0 and "combined" not in out and "-> OK" in out, out


async def test_a_tampered_chain_fails_alone_and_the_combined_result_fails(tmp_path) -> None:
    root, w0, w1, pub = await _two_chains(tmp_path)
    _rewrite_event(w1, lambda body: body.update(request_id="forged"))
    code, out = _verify(str(root), "--public-key", str(pub))
    assert code == 1, out
    lines = out.splitlines()
    w0_at, w1_at = lines.index(f"chain {w0} instance=host-a/w0:"), lines.index(f"chain {w1} instance=host-a/w1:")
    assert lines[w0_at + 1].endswith("-> OK"), out
    assert lines[w1_at + 1].endswith("-> FAILED") and "modified at" in lines[w1_at + 2], out
    assert "combined: chains=2 ok=1 failed=1" in out and out.rstrip().endswith("-> FAILED"), out
    result = verify_instances([root], load_public_key(pub))
    assert [c.report.status for c in result.chains] == ["OK", "FAILED"]


async def test_an_event_naming_another_instance_and_a_copied_chain_are_reported(tmp_path) -> None:
    root, w0, _, pub = await _two_chains(tmp_path)
    shutil.copytree(w0, root / "worker-9")  # the same chain (same instance) twice
    result = verify_instances([root], load_public_key(pub))
    assert [p.kind for p in result.problems] == ["duplicate_instance"], result.problems
    assert result.status == "FAILED"
    shutil.rmtree(root / "worker-9")
    _rewrite_event(w0, lambda body: body.update(instance="host-a/w1"))
    result = verify_instances([root], load_public_key(pub))
    kinds = [p.kind for p in result.chains[0].report.problems]
    assert "instance_mismatch" in kinds and "modified" in kinds, kinds
    code, out = _verify(str(root), "--public-key", str(pub))
    assert code == 1 and "instance_mismatch" in out, out


async def test_anchors_need_a_single_chain(tmp_path) -> None:
    root, _, _, pub = await _two_chains(tmp_path)
    code, out = _verify(str(root), "--public-key", str(pub), "--anchors", str(tmp_path))
    assert code == 2 and "--anchors" in out, out


async def test_a_directory_without_log_files_does_not_verify(tmp_path) -> None:
    # before: "files=0 records=0 -> OK", exit 0 (e.g. the parent of worker-*/ before chains were grouped)
    runner = CliRunner()
    assert runner.invoke(audit_group, ["keygen", str(tmp_path / "audit.key")]).exit_code == 0
    (tmp_path / "empty").mkdir()
    code, out = _verify(str(tmp_path / "empty"), "--public-key", str(tmp_path / "audit.key.pub"))
    assert code == 1 and "no audit log files found" in out, out
