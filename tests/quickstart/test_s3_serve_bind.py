"""Review R3-12: ``prefixgate serve`` on a listening address already taken names the
listener (public/admin), its config section and host:port (before: only "Address
already in use"). Real CLI in a subprocess, ephemeral ports only (one we hold ourselves).
"""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

import pytest

from sim.quickstart import init_gateway_dir
from tests.support.serve_cli import ENV, quickstart_ports


@pytest.mark.parametrize("taken", ["public", "admin"])
def test_address_in_use_names_the_listener_and_address(tmp_path: Path, taken: str) -> None:
    port, admin_port, base = quickstart_ports()
    res = init_gateway_dir(tmp_path / "gw", port=port, admin_port=admin_port, replicas=1, replica_base_port=base)
    busy = socket.socket()
    busy.bind(("127.0.0.1", port if taken == "public" else admin_port))
    busy.listen(1)
    try:
        out = subprocess.run([sys.executable, "-m", "gateway.cli", "serve", "--config", str(res.config)],
                             cwd=str(tmp_path), env=ENV, capture_output=True, text=True, timeout=120)
    finally:
        busy.close()
    assert out.returncode != 0
    section, p = ("listen", port) if taken == "public" else ("admin", admin_port)
    assert (f"Error: cannot start the gateway: {taken} listener ({section}) 127.0.0.1:{p}: "
            "Address already in use") in out.stderr, out.stderr
