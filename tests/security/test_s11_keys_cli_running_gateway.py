"""R11-1 with the real thing: ``prefixgate serve`` as its own process (the quickstart's directory),
``prefixgate keys rotate-salt`` / ``rotate-tenant`` as another. While the gateway runs they refuse
(exit 3, the admin route named, the state file unchanged); once it has stopped they apply (exit 0,
``offline: true``). Before the fix they exited 0 and the running gateway ignored, then undid, them.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.support.serve_cli import ENV, ROOT, ready_quickstart, stop


def keys_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "gateway.cli", "keys", *args], cwd=str(ROOT), env=ENV,
                          capture_output=True, text=True, timeout=60)


def test_keys_rotation_refused_while_serve_runs_applied_once_it_stopped(tmp_path: Path) -> None:
    cfg = str(tmp_path / "gw" / "gateway.yaml")
    state = tmp_path / "gw" / "keystate.json"
    with ready_quickstart(tmp_path) as run:
        before = state.read_bytes() if state.exists() else None
        for command, route in (("rotate-salt", "rotate-salt"), ("rotate-tenant", "rotate-key")):
            res = keys_cli(command, "--config", cfg, "acme")
            assert res.returncode == 3, (command, res.returncode, res.stdout, res.stderr)
            assert f"POST /admin/tenants/acme/{route}" in res.stderr and res.stdout == ""
        assert (state.read_bytes() if state.exists() else None) == before
        assert json.loads(keys_cli("show", "--config", cfg).stdout)["gateway_running"] is True
        stop(run.gw)
        assert run.gw.returncode == 0
        res = keys_cli("rotate-salt", "--config", cfg, "acme")
        assert res.returncode == 0, res.stderr
        rec = json.loads(res.stdout)
        assert rec["salt_epoch"] == 1 and rec["offline"] is True
        shown = json.loads(keys_cli("show", "--config", cfg).stdout)
        assert shown["gateway_running"] is False
        assert {t["tenant_id"]: t["salt_epoch"] for t in shown["tenants"]}["acme"] == 1
