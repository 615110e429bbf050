"""Session 20, fixshared (S20-R1): the key-state file keeps the highest shared tenant-registry version
seen (``registry_version``), with the key versions' rules: absent in older files (0), never lowered by a
write (merged forward with the file, also with another process's write), refused when malformed."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from tenancy.keys import KeyRing, KeyRingError
from tenancy.state import KeyState, load_state, merge_forward, registry_seen, save_state

SECRET = b"s" * 32


def test_an_older_file_without_the_field_reads_as_zero_and_a_write_keeps_its_numbers(tmp_path: Path) -> None:
    path = tmp_path / "keystate.json"
    path.write_text('{"format": 1, "master_generation": 2, "tenants": {"acme": {"key_version": 3, "salt_epoch": 1}}}')
    assert load_state(str(path)).registry_version == 0
    ring = KeyRing(SECRET, state_path=str(path))
    try:
        assert ring.registry_version == 0
        assert ring.adopt_registry_version(4)
        doc = json.loads(path.read_text())
        assert doc["registry_version"] == 4 and doc["master_generation"] == 2
        assert doc["tenants"] == {"acme": {"key_version": 3, "salt_epoch": 1}}
    finally:
        ring.close()


def test_the_registry_version_only_moves_forward(tmp_path: Path) -> None:
    path = str(tmp_path / "keystate.json")
    ring = KeyRing(SECRET, state_path=path)
    other = KeyRing(SECRET, state_path=path)  # a second process (serve --workers) on the same file
    try:
        assert ring.adopt_registry_version(5)
        assert not ring.adopt_registry_version(3) and not ring.adopt_registry_version(5)
        assert ring.registry_version == 5
        other.rotate_tenant("acme")  # its view says 0: the write merges forward with the file
        assert load_state(path).registry_version == 5 and other.registry_version == 5
    finally:
        ring.close()
        other.close()
    assert merge_forward(KeyState(registry_version=7), KeyState(registry_version=2)).registry_version == 7
    assert registry_seen(1)(KeyState(registry_version=4)).registry_version == 4


@pytest.mark.parametrize("bad", [-1, "3", True, 1.5])
def test_a_malformed_registry_version_is_refused(tmp_path: Path, bad: object) -> None:
    path = tmp_path / "keystate.json"
    path.write_text(json.dumps({"format": 1, "tenants": {}, "registry_version": bad}))
    with pytest.raises(KeyRingError, match="registry_version"):
        KeyRing(SECRET, state_path=str(path))


def test_save_and_load_round_trip(tmp_path: Path) -> None:
    path = str(tmp_path / "keystate.json")
    save_state(path, KeyState(registry_version=9))
    assert load_state(path).registry_version == 9
