"""Session 21, S21-newcomer-1: ``prefixgate audit keygen`` printed a raw Python traceback when the
key's directory did not exist (``FileNotFoundError``) or the key already existed (``FileExistsError``).
Now a one-line click error naming the path and what to do, exit 1, nothing overwritten or left half made."""
from __future__ import annotations

from pathlib import Path

from click.testing import CliRunner

from gateway.cli import main


def _keygen(*args: str) -> tuple[int, str]:
    res = CliRunner().invoke(main, ["audit", "keygen", *args])
    assert isinstance(res.exception, SystemExit) or res.exception is None, res.exception  # before: the OSError
    return res.exit_code, res.output


def test_missing_directory_is_a_one_line_error(tmp_path: Path) -> None:
    missing = tmp_path / "etc" / "prefixgate"
    code, out = _keygen(str(missing / "audit-signing.key"))
    assert code == 1 and "Traceback" not in out
    assert out.strip().splitlines() == [
        f"Error: cannot create {missing / 'audit-signing.key'}: the directory {missing} does not exist; create it "
        f"(e.g. install -d -m 0700 {missing}) or choose another path"]


def test_an_existing_key_is_never_overwritten(tmp_path: Path) -> None:
    key = tmp_path / "audit-signing.key"
    assert _keygen(str(key))[0] == 0
    before = key.read_bytes(), (tmp_path / "audit-signing.key.pub").read_bytes()
    code, out = _keygen(str(key))
    assert code == 1 and len(out.strip().splitlines()) == 1
    assert f"Error: {key} already exists: a signing key is never overwritten" in out
    assert (key.read_bytes(), (tmp_path / "audit-signing.key.pub").read_bytes()) == before


def test_an_unwritable_public_key_leaves_no_private_key(tmp_path: Path) -> None:
    key = tmp_path / "audit-signing.key"
    code, out = _keygen(str(key), "--public-key-file", str(tmp_path / "nope" / "k.pub"))
    assert code == 1 and f"the directory {tmp_path / 'nope'} does not exist" in out
    assert not key.exists()  # the command can be run again as it is
    assert _keygen(str(key))[0] == 0


def test_an_existing_public_key_is_never_overwritten(tmp_path: Path) -> None:
    """Session 22, S22-review-2: the public key was written over whatever stood at its path. The advice above
    ("move the old key away first (keep its .pub to verify the logs it signed)") lost that .pub when the
    operator moved the private key only: the next keygen replaced the anchor of the old logs. Now refused like
    an existing private key, and the private key just made is removed (the command can be run again)."""
    key = tmp_path / "audit-signing.key"
    assert _keygen(str(key))[0] == 0
    old_pub = (tmp_path / "audit-signing.key.pub").read_bytes()
    key.rename(tmp_path / "audit-signing.key.old")
    code, out = _keygen(str(key))
    assert code == 1 and len(out.strip().splitlines()) == 1
    assert f"Error: {tmp_path / 'audit-signing.key.pub'} already exists: a signing key is never overwritten (a public key may verify" in out
    assert (tmp_path / "audit-signing.key.pub").read_bytes() == old_pub and not key.exists()
    code, _ = _keygen(str(key), "--public-key-file", str(tmp_path / "new.pub"))
    assert code == 0 and (tmp_path / "new.pub").read_bytes() != old_pub
