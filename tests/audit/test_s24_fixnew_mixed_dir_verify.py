"""``audit verify DIR`` where DIR holds log files and ``worker-*/`` chains (S24-newcomer-3, session 24).

One ``jsonl.dir`` used first by one ``serve`` (log files in DIR itself), then by
``serve --workers 2`` (``DIR/worker-0``, ``DIR/worker-1``). Before the fix DIR
read as its own files' chain only: an event edited in ``worker-1`` still gave
``-> OK``, exit 0. Now every chain under DIR is verified and reported.
"""
from __future__ import annotations

from pathlib import Path

from click.testing import CliRunner

from audit.cli import audit_group
from audit.config import build_audit
from audit.event import AuditEvent, Kind, Outcome
from audit.verify_instances import chain_groups
from tests.audit.test_s2_verify_instances import _rewrite_event, _write_chain


async def _mixed_dir(tmp_path: Path) -> tuple[Path, Path]:
    """DIR with a one-process chain (3 events, no instance) and worker-0/worker-1 chains; returns (DIR, key.pub)."""
    key = tmp_path / "audit.key"
    assert CliRunner().invoke(audit_group, ["keygen", str(key)]).exit_code == 0
    root = tmp_path / "jsonl"
    alog = build_audit({
        "jsonl": {"dir": str(root), "signing_key_file": str(key), "checkpoint_s": 3600},
        "spill": {"dir": str(tmp_path / "spill" / "one"), "max_bytes": 1 << 20},
    })
    await alog.start()
    for i in range(3):
        alog.emit(AuditEvent(kind=Kind.INFERENCE, outcome=Outcome.ALLOWED, request_id=f"one-r{i}"))
    assert await alog.drain(5)
    await alog.close()
    await _write_chain(root, key, 0, 4)
    await _write_chain(root, key, 1, 5)
    return root, Path(str(key) + ".pub")


def _verify(*args: str) -> tuple[int, str]:
    res = CliRunner().invoke(audit_group, ["verify", *args])
    return res.exit_code, res.output


async def test_a_directory_with_its_own_files_and_worker_chains_verifies_all_three(tmp_path) -> None:
    root, pub = await _mixed_dir(tmp_path)
    code, out = _verify(str(root), "--public-key", str(pub))
    assert code == 0, out
    for label in (root, root / "worker-0", root / "worker-1"):
        assert f"chain {label} instance=" in out, out
    assert "combined: chains=3 ok=3 failed=0" in out and out.rstrip().endswith("-> OK"), out


async def test_an_edited_worker_record_under_a_directory_with_its_own_files_fails(tmp_path) -> None:
    root, pub = await _mixed_dir(tmp_path)
    _rewrite_event(root / "worker-1", lambda body: body.update(outcome="denied"))
    code, out = _verify(str(root), "--public-key", str(pub))
    # before: "files=1 records=... -> OK", exit 0 (the worker-* chains unread)
    assert code == 1, out
    assert f"chain {root / 'worker-1'} instance=" in out and "modified" in out, out
    assert "combined: chains=3 ok=2 failed=1" in out and out.rstrip().endswith("-> FAILED"), out


async def test_a_chain_named_twice_is_verified_once(tmp_path) -> None:
    root, pub = await _mixed_dir(tmp_path)
    # the workaround the docs gave before the fix: name every chain
    code, out = _verify(str(root), str(root / "worker-0"), str(root / "worker-1"), "--public-key", str(pub))
    assert code == 0 and "combined: chains=3 ok=3 failed=0" in out and "duplicate_instance" not in out, out
    assert [label for label, _ in chain_groups([root, root / "worker-1"])] == [
        str(root), str(root / "worker-0"), str(root / "worker-1")]


async def test_anchors_on_a_mixed_directory_are_refused_naming_every_chain(tmp_path) -> None:
    root, pub = await _mixed_dir(tmp_path)
    code, out = _verify(str(root), "--public-key", str(pub), "--anchors", str(tmp_path / "ocsf.jsonl"))
    assert code == 2 and "--anchors" in out, out
    assert str(root / "worker-0") in out and str(root / "worker-1") in out, out
