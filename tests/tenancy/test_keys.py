from __future__ import annotations

import os
import shutil

import pytest

from tenancy.keys import (
    KeyRing,
    KeyRingError,
    TenantKey,
    derive_prefix_key,
    key_id,
    load_master_secret,
)
from tenancy.prefix import block_hash_chain

MASTER = bytes(range(32)) + b"-prefixgate-test-master"
MASTER2 = b"another-master-secret-0123456789abcdef"


class FakeClock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def test_hkdf_derivation_is_deterministic_and_distinct() -> None:
    a1 = derive_prefix_key(MASTER, "acme", 1)
    assert a1 == derive_prefix_key(MASTER, "acme", 1)
    assert len(a1) == 32
    keys = {
        a1,
        derive_prefix_key(MASTER, "acme", 2),
        derive_prefix_key(MASTER, "beta", 1),
        derive_prefix_key(MASTER2, "acme", 1),
    }
    assert len(keys) == 4
    # Two rings from the same master agree (restart gives the same keys).
    assert KeyRing(MASTER).current("acme").key == KeyRing(MASTER).current("acme").key == a1


def test_version_must_be_positive() -> None:
    with pytest.raises(ValueError):
        derive_prefix_key(MASTER, "acme", 0)


def test_kid_reveals_nothing_and_repr_hides_key() -> None:
    ring = KeyRing(MASTER)
    tk = ring.current("acme")
    assert tk.kid.startswith("t:acme:v1:")
    assert tk.key.hex() not in tk.kid
    assert tk.key.hex()[:12] not in tk.kid
    assert tk.key.hex() not in repr(tk) and str(tk.key) not in repr(tk)
    assert key_id("acme", 1, tk.key) == tk.kid
    assert ring.current("beta").kid != tk.kid


def test_rotation_grace_with_injected_clock() -> None:
    clock = FakeClock()
    ring = KeyRing(MASTER, grace_s=60, clock=clock)
    tokens = list(range(64))
    before = ring.prefix_chain("acme", tokens, 16)
    assert before.previous == ()
    new = ring.rotate_tenant("acme")
    assert new.version == 2 and new.kid != before.kid
    during = ring.prefix_chain("acme", tokens, 16)
    assert during.kid == new.kid
    assert during.current != before.current
    assert [kid for kid, _ in during.previous] == [before.kid]
    assert during.previous[0][1] == before.current  # old chain still recognised
    assert [k.version for k in ring.lookup_keys("acme")] == [2, 1]
    clock.t += 59.9
    assert len(ring.lookup_keys("acme")) == 2
    clock.t += 0.2
    assert [k.version for k in ring.lookup_keys("acme")] == [2]
    assert ring.prefix_chain("acme", tokens, 16).previous == ()
    # Other tenants are untouched by acme's rotation.
    assert ring.current("beta").version == 1


def test_two_rotations_keep_both_in_grace_newest_first() -> None:
    clock = FakeClock()
    ring = KeyRing(MASTER, grace_s=100, clock=clock)
    ring.rotate_tenant("acme")
    clock.t += 10
    ring.rotate_tenant("acme")
    assert [k.version for k in ring.lookup_keys("acme")] == [3, 2, 1]
    clock.t += 95
    assert [k.version for k in ring.lookup_keys("acme")] == [3, 2]


def test_chain_matches_block_hash_chain_with_kid() -> None:
    ring = KeyRing(MASTER)
    tokens = list(range(50))
    tk = ring.current("acme")
    chains = ring.prefix_chain("acme", tokens, 16)
    assert list(chains.current) == block_hash_chain(tk.key, tokens, 16, key_id=tk.kid)
    assert len(chains.current) == 3


def test_identical_prompts_of_two_tenants_are_disjoint() -> None:
    ring = KeyRing(MASTER)
    tokens = [7] * 160
    a = ring.prefix_chain("acme", tokens, 16).current
    b = ring.prefix_chain("beta", tokens, 16).current
    assert len(a) == len(b) == 10
    assert set(a).isdisjoint(b)


def test_master_rotation_rederives_and_keeps_grace() -> None:
    clock = FakeClock()
    ring = KeyRing(MASTER, grace_s=30, clock=clock)
    old = ring.current("acme")
    old_salt = ring.cache_salt("acme")
    assert ring.rotate_master(MASTER2) == 2
    new = ring.current("acme")
    assert new.key != old.key and new.kid != old.kid
    assert new.key == KeyRing(MASTER2).current("acme").key
    assert [k.kid for k in ring.lookup_keys("acme")] == [new.kid, old.kid]
    assert ring.cache_salt("acme") != old_salt
    clock.t += 31
    assert [k.kid for k in ring.lookup_keys("acme")] == [new.kid]


def test_master_rotation_refuses_same_or_short_secret() -> None:
    ring = KeyRing(MASTER)
    with pytest.raises(KeyRingError):
        ring.rotate_master(MASTER)
    with pytest.raises(KeyRingError):
        ring.rotate_master(b"short")
    assert ring.master_generation == 1


def test_short_master_refused() -> None:
    with pytest.raises(KeyRingError):
        KeyRing(b"x" * 31)


def test_state_file_persists_versions_not_keys(tmp_path) -> None:
    path = str(tmp_path / "keystate.json")
    ring = KeyRing(MASTER, state_path=path)
    ring.rotate_tenant("acme")
    ring.rotate_salt("beta")
    text = open(path, encoding="utf-8").read()
    assert ring.current("acme").key.hex() not in text
    assert MASTER.hex() not in text and "prefixgate-test-master" not in text
    assert os.stat(path).st_mode & 0o077 == 0
    restarted = KeyRing(MASTER, state_path=path)
    assert restarted.current("acme").version == 2
    assert restarted.current("acme").kid == ring.current("acme").kid
    assert restarted.salt_epoch("beta") == 1
    assert restarted.cache_salt("beta") == ring.cache_salt("beta")


def test_corrupt_state_file_fails_closed(tmp_path) -> None:
    path = tmp_path / "keystate.json"
    path.write_text('{"format": 1, "tenants": {"acme": {"key_version": 0, "salt_epoch": 0}}}')
    with pytest.raises(KeyRingError, match="key_version"):
        KeyRing(MASTER, state_path=str(path))
    path.write_text("not json")
    with pytest.raises(KeyRingError):
        KeyRing(MASTER, state_path=str(path))


def test_unwritable_state_does_not_apply_rotation(tmp_path) -> None:
    (tmp_path / "gone-dir").mkdir()
    path = str(tmp_path / "gone-dir" / "keystate.json")
    ring = KeyRing(MASTER, state_path=path)  # a missing directory is refused here since S21-newcomer-2
    shutil.rmtree(tmp_path / "gone-dir")
    with pytest.raises(KeyRingError):
        ring.rotate_tenant("acme")
    assert ring.current("acme").version == 1


# -- master secret loading ------------------------------------------------

SECRET = b"s3cr3t-" + b"A" * 40


def _write(path, data: bytes, mode: int) -> str:
    path.write_bytes(data)
    os.chmod(path, mode)
    return str(path)


def test_secret_from_file_strips_one_newline(tmp_path) -> None:
    p = _write(tmp_path / "master", SECRET + b"\n", 0o600)
    assert load_master_secret(p, None) == SECRET


@pytest.mark.parametrize("mode", [0o644, 0o640, 0o604, 0o660])
def test_secret_file_readable_by_others_refused(tmp_path, mode: int) -> None:
    p = _write(tmp_path / "master", SECRET, mode)
    with pytest.raises(KeyRingError, match="group/others") as ei:
        load_master_secret(p, None)
    assert "A" * 40 not in str(ei.value) and "s3cr3t" not in str(ei.value)


def test_secret_file_short_refused_without_leaking(tmp_path) -> None:
    p = _write(tmp_path / "master", b"tiny-secret-value", 0o600)
    with pytest.raises(KeyRingError, match="too short") as ei:
        load_master_secret(p, None)
    assert "tiny-secret-value" not in str(ei.value)


def test_secret_file_missing_and_symlink_refused(tmp_path) -> None:
    with pytest.raises(KeyRingError, match="does not exist"):
        load_master_secret(str(tmp_path / "nope"), None)
    target = _write(tmp_path / "master", SECRET, 0o600)
    link = tmp_path / "link"
    link.symlink_to(target)
    with pytest.raises(KeyRingError):
        load_master_secret(str(link), None)


def test_secret_from_env(monkeypatch) -> None:
    monkeypatch.setenv("PG_TEST_MASTER", SECRET.decode())
    assert load_master_secret(None, "PG_TEST_MASTER") == SECRET
    monkeypatch.setenv("PG_TEST_MASTER", "shortsecret")
    with pytest.raises(KeyRingError, match="too short") as ei:
        load_master_secret(None, "PG_TEST_MASTER")
    assert "shortsecret" not in str(ei.value)
    monkeypatch.delenv("PG_TEST_MASTER")
    with pytest.raises(KeyRingError, match="not set"):
        load_master_secret(None, "PG_TEST_MASTER")


def test_no_source_refused() -> None:
    with pytest.raises(KeyRingError, match="no master secret source"):
        load_master_secret(None, None)


def test_tenant_key_is_frozen() -> None:
    tk = KeyRing(MASTER).current("acme")
    assert isinstance(tk, TenantKey)
    with pytest.raises(AttributeError):
        tk.version = 5  # type: ignore[misc]
