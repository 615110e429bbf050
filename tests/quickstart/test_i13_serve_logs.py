"""Issue 13: ``prefixgate serve`` says where it listens, what it runs and when it is ready,
drains and exits (before the fix it printed nothing at all).

Runs the real CLI in a subprocess on a ``prefixgate-sim init`` config, in
front of ``prefixgate-sim replicas``, then sends SIGTERM.
"""

from __future__ import annotations

import re
import signal
from pathlib import Path

import httpx

from tests.support.serve_cli import ready_quickstart


def test_serve_logs_listeners_summary_ready_drain_and_exit(tmp_path: Path) -> None:
    with ready_quickstart(tmp_path) as run:
        port, admin_port, gw, glog = run.port, run.admin_port, run.gw, run.glog
        text = glog.read_text()
        assert f"listening: public http://127.0.0.1:{port}" in text, text
        assert f"listening: admin http://127.0.0.1:{admin_port}" in text, text
        from rego import policy_dir

        ready = re.search(r"ready: policy (\w+) \(dir (.+?)\), (\d+) tenants, (\d+) trust domains, (\d+) replicas", text)
        assert ready, text
        assert ready.groups() == ("embedded", str(policy_dir()), "2", "1", "1")
        assert httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=10).status_code == 200
        gw.send_signal(signal.SIGTERM)
        assert gw.wait(timeout=60) == 0
        text = glog.read_text()
        assert "draining: listeners closed" in text and "stopped: audit flushed, exiting" in text, text
        assert text.index("ready: ") < text.index("draining: ") < text.index("stopped: ")
