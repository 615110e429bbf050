"""Session 22, fixsec (S21-fixnew-1): ``prefixgate audit keygen`` wrote the public key with
``write_bytes``, so a new private key path whose ``.pub`` already existed (the old key moved away, its
``.pub`` left to verify the logs it signed) silently overwrote that ``.pub``. Both files are now created
exclusively: an existing public key is refused with the one-line error of an existing private key, and
nothing is half made (no private key left without its ``.pub``, the old ``.pub`` unchanged)."""
from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from audit.keys import generate_signing_key
from gateway.cli import main


def _keygen(*args: str) -> tuple[int, str]:
    res = CliRunner().invoke(main, ["audit", "keygen", *args])
    assert isinstance(res.exception, SystemExit) or res.exception is None, res.exception
    return res.exit_code, res.output


def test_an_existing_public_key_is_never_overwritten(tmp_path: Path) -> None:
    key, pub = tmp_path / "audit-signing.key", tmp_path / "audit-signing.key.pub"
    assert _keygen(str(key))[0] == 0
    old_pub = pub.read_bytes()
    key.rename(tmp_path / "retired.key")  # the old private key moved away, its .pub left behind
    code, out = _keygen(str(key))
    assert code == 1 and "Traceback" not in out and len(out.strip().splitlines()) == 1
    assert f"Error: {pub} already exists: a signing key is never overwritten" in out
    assert pub.read_bytes() == old_pub  # before the fix: a new public key over the old one
    assert not key.exists()  # no private key without its public key: the command can run again elsewhere


def test_an_existing_explicit_public_key_file_is_refused(tmp_path: Path) -> None:
    pub = tmp_path / "verify.pem"
    pub.write_bytes(b"old public key\n")
    with pytest.raises(FileExistsError) as info:
        generate_signing_key(tmp_path / "new.key", pub)
    assert info.value.filename == str(pub)
    assert pub.read_bytes() == b"old public key\n" and not (tmp_path / "new.key").exists()


def test_both_files_are_written_when_neither_exists(tmp_path: Path) -> None:
    key = tmp_path / "k"
    generate_signing_key(key)
    assert key.stat().st_mode & 0o777 == 0o600
    assert (tmp_path / "k.pub").read_bytes().startswith(b"-----BEGIN PUBLIC KEY-----")
