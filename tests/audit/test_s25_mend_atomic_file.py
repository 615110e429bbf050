"""Session 25 (mend, D1/D2): one atomic-write helper, :func:`audit.atomic_file.write_atomic`, for every
place that replaces a file (policy version snapshots, key state, master secret, SPIFFE bundle and keys,
the simulator's ready file)."""
from __future__ import annotations

import ast
import os
import stat
from pathlib import Path

import pytest

import audit.atomic_file as atomic_file
from audit.atomic_file import write_atomic

ROOT = Path(__file__).resolve().parents[2]


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_writes_the_bytes_with_the_mode_asked_and_leaves_no_temporary_file(tmp_path: Path) -> None:
    target = tmp_path / "f.json"
    write_atomic(target, b"one", mode=0o640)
    assert target.read_bytes() == b"one"
    assert _mode(target) == 0o640
    write_atomic(target, b"two")
    assert target.read_bytes() == b"two"
    assert _mode(target) == atomic_file.DEFAULT_MODE == 0o600
    assert sorted(p.name for p in tmp_path.iterdir()) == ["f.json"]


def test_mode_is_set_before_any_data_and_before_the_rename(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """At the moment of the rename (and of every write) the temporary file already has the narrow mode:
    no window in which the secret is readable with a wider one (umask 022 would give 0644)."""
    target = tmp_path / "secret"
    target.write_bytes(b"old")
    target.chmod(0o644)
    seen: list[tuple[str, int]] = []
    real_replace, real_fsync = os.replace, os.fsync

    def spy_replace(src: str, dst: object) -> None:
        seen.append(("replace", _mode(Path(src))))
        real_replace(src, dst)

    def spy_fsync(fd: int) -> None:
        if stat.S_ISREG(os.fstat(fd).st_mode):
            seen.append(("fsync", stat.S_IMODE(os.fstat(fd).st_mode)))
        real_fsync(fd)

    monkeypatch.setattr(atomic_file.os, "replace", spy_replace)
    monkeypatch.setattr(atomic_file.os, "fsync", spy_fsync)
    old_umask = os.umask(0o022)
    try:
        write_atomic(target, b"new", mode=0o600)
    finally:
        os.umask(old_umask)
    assert seen == [("fsync", 0o600), ("replace", 0o600)]
    assert _mode(target) == 0o600 and target.read_bytes() == b"new"


def test_a_failed_write_leaves_the_old_file_intact_and_no_temporary_file(tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    target = tmp_path / "state.json"
    target.write_bytes(b"old content")

    def failing_fsync(fd: int) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(atomic_file.os, "fsync", failing_fsync)
    with pytest.raises(OSError, match="No space left"):
        write_atomic(target, b"new content")
    assert target.read_bytes() == b"old content"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["state.json"]


def test_a_failed_rename_removes_the_temporary_file(tmp_path: Path) -> None:
    target = tmp_path / "d"
    target.mkdir()  # a directory in the way: rename(2) of a file onto it fails
    (target / "x").write_text("keep")
    with pytest.raises(OSError):
        write_atomic(target, b"data")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["d"]
    assert (target / "x").read_text() == "keep"


def test_the_directory_is_synced_after_the_rename_unless_asked_not_to(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[str] = []
    real_replace, real_fsync = os.replace, os.fsync

    def spy_replace(src: str, dst: object) -> None:
        calls.append("replace")
        real_replace(src, dst)

    def spy_fsync(fd: int) -> None:
        calls.append("fsync-dir" if stat.S_ISDIR(os.fstat(fd).st_mode) else "fsync-file")
        real_fsync(fd)

    monkeypatch.setattr(atomic_file.os, "replace", spy_replace)
    monkeypatch.setattr(atomic_file.os, "fsync", spy_fsync)
    write_atomic(tmp_path / "a", b"x")
    assert calls == ["fsync-file", "replace", "fsync-dir"]
    calls.clear()
    write_atomic(tmp_path / "b", b"x", fsync_dir=False)
    assert calls == ["fsync-file", "replace"]


def test_no_copy_of_the_pattern_is_left_in_the_shipped_packages() -> None:
    """The former copies are gone: no module of the shipped packages but audit/atomic_file.py calls
    ``tempfile.mkstemp`` next to ``os.replace`` (policy/store_disk.py stages several files of one change
    under names of its own and renames them together: a transaction, not this pattern)."""
    offenders = []
    for pkg in ("gateway", "routing", "tenancy", "policy", "audit", "sim"):
        for path in sorted((ROOT / pkg).rglob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            if rel in ("audit/atomic_file.py", "policy/store_disk.py"):
                continue
            calls = {ast.unparse(n.func) for n in ast.walk(ast.parse(path.read_text("utf-8")))
                     if isinstance(n, ast.Call)}
            if "os.replace" in calls and ({"tempfile.mkstemp", "os.fchmod", "os.fsync"} & calls):
                offenders.append(rel)
    assert offenders == []


def test_save_state_and_the_demo_signing_keys_are_0600_even_over_a_wider_file(tmp_path: Path) -> None:
    from sim.spiffe_issuer import DemoIssuer, save_trust_domain
    from tenancy.state import KeyState, load_state, save_state

    state_path = tmp_path / "keystate.json"
    state_path.write_text("{}")
    state_path.chmod(0o644)
    save_state(str(state_path), KeyState(tenants={}, master_generation=3, registry_version=0))
    assert _mode(state_path) == 0o600
    assert load_state(str(state_path)).master_generation == 3

    issuer = DemoIssuer("example.org")
    keys = tmp_path / "td" / "keys"
    keys.mkdir(parents=True)
    pem = keys / f"{issuer.kid}.pem"
    pem.write_text("placeholder")
    pem.chmod(0o644)  # a key file left readable by an earlier tool: O_CREAT's mode would keep it 0644
    save_trust_domain(issuer, tmp_path / "td")
    assert _mode(pem) == 0o600
    assert pem.read_text().startswith("-----BEGIN PRIVATE KEY-----")
