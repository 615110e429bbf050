"""R11-1: ``prefixgate keys rotate-*`` against a running gateway's state file is refused (exit 3, the
admin route named, the file unchanged), and no writer of the state file ever lowers a key version, salt
epoch or master generation it finds there (a stale in-memory view merges forward, never overwrites).

Before the fix the CLI exited 0 with the new epoch, the running gateway never used it, and its next
write of the file (any admin rotation) put the old epoch back.
"""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tenancy.keys import KeyRing, KeyStateInUse
from tenancy.state import KeyState, TenantState, load_state, save_state
from tenancy.state_lock import StateInUse, gateway_running, hold_shared, take_exclusive
from tests.conftest import Stack
from tests.support.serve_cli import ENV, ROOT

MASTER = b"s11-cli-rotation-lock-master-0123456789abcdef"


def keys_cli(*args: str) -> subprocess.CompletedProcess[str]:
    """``prefixgate keys ...`` as its own process (another process than the gateway's)."""
    return subprocess.run([sys.executable, "-m", "gateway.cli", "keys", *args], cwd=str(ROOT), env=ENV,
                          capture_output=True, text=True, timeout=60)


def _file_bytes(path: Path) -> bytes | None:
    return path.read_bytes() if path.exists() else None


async def test_keys_writes_refused_while_a_gateway_runs_and_the_admin_route_works(stack: Stack) -> None:
    cfg = str(stack.tmp / "gateway.yaml")
    state = stack.tmp / "keystate.json"
    admin = await stack.client.post(f"{stack.admin_url}/admin/tenants/tenant-b/rotate-salt",
                                    headers=stack.operator_auth())
    assert admin.status_code == 200, admin.text  # the file exists and holds the gateway's numbers
    before = _file_bytes(state)
    salt_a = stack.components.keyring.cache_salt("tenant-a")
    for command, route in (("rotate-salt", "rotate-salt"), ("rotate-tenant", "rotate-key")):
        res = keys_cli(command, "--config", cfg, "tenant-a")
        assert res.returncode == 3, (command, res.returncode, res.stdout, res.stderr)
        assert f"POST /admin/tenants/tenant-a/{route}" in res.stderr
        assert "running gateway" in res.stderr and res.stdout == ""
        assert _file_bytes(state) == before  # nothing written
    assert stack.components.keyring.cache_salt("tenant-a") == salt_a
    shown = keys_cli("show", "--config", cfg)  # reading stays allowed, and says a gateway holds the file
    assert shown.returncode == 0, shown.stderr
    doc = json.loads(shown.stdout)
    assert doc["gateway_running"] is True
    assert {t["tenant_id"]: t["salt_epoch"] for t in doc["tenants"]}["tenant-b"] == 1
    # the route the refusal names does the rotation on the running gateway (and persists it)
    admin = await stack.client.post(f"{stack.admin_url}/admin/tenants/tenant-a/rotate-salt",
                                    headers=stack.operator_auth())
    assert admin.status_code == 200 and admin.json()["salt_epoch"] == 1
    assert stack.components.keyring.cache_salt("tenant-a") != salt_a
    assert load_state(str(state)).tenants["tenant-a"].salt_epoch == 1


async def test_a_running_gateway_never_lowers_an_epoch_it_finds_in_the_file(stack: Stack) -> None:
    # a writer that bypasses the lock (an editor, a restored backup, a second gateway on the same
    # file) raised tenant-a's numbers; the gateway's next write (an admin rotation of another tenant)
    # keeps them and the gateway adopts them (the old key in grace), the master generation stays put
    state = str(stack.tmp / "keystate.json")
    ring = stack.components.keyring
    old_kid, old_salt = ring.current("tenant-a").kid, ring.cache_salt("tenant-a")
    save_state(state, KeyState(tenants={"tenant-a": TenantState(key_version=3, salt_epoch=5)}, master_generation=7))
    admin = await stack.client.post(f"{stack.admin_url}/admin/tenants/tenant-b/rotate-salt",
                                    headers=stack.operator_auth())
    assert admin.status_code == 200, admin.text
    on_disk = load_state(state)
    assert on_disk.tenants["tenant-a"] == TenantState(3, 5) and on_disk.tenants["tenant-b"].salt_epoch == 1
    assert on_disk.master_generation == 7 and ring.master_generation == 1  # adopting a master needs its secret
    assert ring.key_version("tenant-a") == 3 and ring.salt_epoch("tenant-a") == 5
    assert ring.cache_salt("tenant-a") != old_salt
    assert old_kid in [k.kid for k in ring.lookup_keys("tenant-a")]  # grace, as for any rotation
    admin = await stack.client.post(f"{stack.admin_url}/admin/tenants/tenant-a/rotate-salt",
                                    headers=stack.operator_auth())
    assert admin.json()["salt_epoch"] == 6  # never an epoch used before


def test_a_stale_ring_merges_forward_instead_of_overwriting(tmp_path: Path) -> None:
    path = str(tmp_path / "keystate.json")
    stale = KeyRing(MASTER, state_path=path)
    save_state(path, KeyState(tenants={"acme": TenantState(2, 4), "beta": TenantState(1, 1)}, master_generation=3))
    assert stale.rotate_salt("beta") == 2  # on top of the file's 1, not of its own 0
    assert stale.rotate_tenant("gamma").version == 2
    assert stale.adopt("delta", 1, 1) is True
    doc = load_state(path)
    assert doc.tenants == {"acme": TenantState(2, 4), "beta": TenantState(1, 2), "gamma": TenantState(2, 0),
                           "delta": TenantState(1, 1)}
    assert doc.master_generation == 3 and stale.master_generation == 1
    # a master rotation gets a generation never used before (above the file's), and keeps the rest
    assert stale.rotate_master(b"s11-another-master-secret-0123456789abcdefgh") == 4
    assert load_state(path).tenants["acme"] == TenantState(2, 4)


def test_offline_writes_work_when_no_gateway_holds_the_file_and_say_so(tmp_path: Path) -> None:
    master = tmp_path / "master.key"
    master.write_text(secrets.token_hex(32))
    os.chmod(master, 0o600)
    cfg = tmp_path / "gateway.yaml"
    cfg.write_text(yaml.safe_dump({"tenancy": {
        "master_secret_file": str(master), "master_secret_env": None, "state_file": str(tmp_path / "keystate.json"),
        "tenants": [{"id": "acme", "spiffe_ids": ["spiffe://td.example/acme/"]}]}}))
    ring = KeyRing(master.read_bytes(), state_path=str(tmp_path / "keystate.json"))  # a "gateway"
    assert keys_cli("rotate-salt", "--config", str(cfg), "acme").returncode == 3
    ring.close()  # the gateway stops
    res = keys_cli("rotate-salt", "--config", str(cfg), "acme")
    assert res.returncode == 0, res.stderr
    rec = json.loads(res.stdout)
    assert rec["salt_epoch"] == 1 and rec["offline"] is True and rec["actor"] == "cli"
    assert "not in the audit chain" in res.stderr
    assert load_state(str(tmp_path / "keystate.json")).tenants["acme"].salt_epoch == 1
    # rotate-master only writes the master file (the provisioning step of a running gateway): allowed,
    # and its record says whether a gateway holds the state file
    again = KeyRing(master.read_bytes(), state_path=str(tmp_path / "keystate.json"))
    res = keys_cli("rotate-master", "--config", str(cfg))
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout)["gateway_running"] is True and again.salt_epoch("acme") == 1


def test_gateways_share_the_lock_an_offline_writer_excludes_them(tmp_path: Path) -> None:
    path = str(tmp_path / "keystate.json")
    first = KeyRing(MASTER, state_path=path)
    second = KeyRing(MASTER, state_path=path)  # another gateway / --workers process on the same file
    assert gateway_running(path) is True
    with pytest.raises(KeyStateInUse):
        KeyRing(MASTER, state_path=path, state_lock="exclusive")
    first.close()
    second.close()
    assert gateway_running(path) is False
    offline = take_exclusive(path)
    try:
        with pytest.raises(StateInUse):  # a gateway starting meanwhile waits (here 0.2 s), then refuses
            hold_shared(path, wait_s=0.2)
    finally:
        offline.close()
    hold_shared(path, wait_s=0.2).close()
    reader = KeyRing(MASTER, state_path=path, state_lock=None)
    with pytest.raises(Exception, match="read-only"):
        reader.rotate_salt("acme")


def test_two_spellings_of_one_state_file_share_one_lock(tmp_path: Path) -> None:
    """Review R11c-3: a gateway configured with a symbolic link to the file the CLI names locked
    another ``.lock`` file, so the CLI's rotation landed while it ran."""
    real = tmp_path / "keys" / "keystate.json"
    real.parent.mkdir()
    link = tmp_path / "state-link.json"
    link.symlink_to(real)
    gateway = KeyRing(MASTER, state_path=str(link))
    try:
        assert gateway_running(str(real)) is True
        with pytest.raises(StateInUse):
            take_exclusive(str(real))
    finally:
        gateway.close()
    assert gateway_running(str(real)) is False


def test_the_probe_creates_no_lock_file_and_an_unopenable_one_refuses_a_gateway(tmp_path: Path) -> None:
    """Review R11c-2: ``keys show`` (the probe) run as another user created a lock file the gateway could
    not open, and the gateway then started without any lock; now the probe creates nothing and a lock
    file the gateway cannot open refuses its start."""
    path = str(tmp_path / "keystate.json")
    assert gateway_running(path) is False
    assert not os.path.exists(path + ".lock")
    os.mkdir(path + ".lock")  # a lock "file" the gateway cannot open read-write (as root a mode does not stop it)
    with pytest.raises(KeyStateInUse, match="cannot lock key state"):
        KeyRing(MASTER, state_path=path)


_WRITER = """
import sys
from tenancy.keys import KeyRing
ring = KeyRing(sys.argv[1].encode(), state_path=sys.argv[2])
for _ in range(int(sys.argv[4])):
    ring.rotate_salt(sys.argv[3])
"""


def test_concurrent_gateway_writers_lose_no_rotation(tmp_path: Path) -> None:
    # two processes holding the shared lock write the same file at once (serve --workers): the
    # read-merge-write is serialised, so neither write drops the other's numbers
    path = str(tmp_path / "keystate.json")
    n = 30
    procs = [subprocess.Popen([sys.executable, "-c", _WRITER, MASTER.decode(), path, tid, str(n)], cwd=str(ROOT),
                              env=ENV) for tid in ("acme", "beta")]
    assert [p.wait(timeout=120) for p in procs] == [0, 0]
    doc = load_state(path)
    assert doc.tenants["acme"].salt_epoch == n and doc.tenants["beta"].salt_epoch == n
