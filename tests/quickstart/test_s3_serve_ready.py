"""Review R3-13: ``prefixgate serve`` logs ``ready:`` after the trust bundle's first
load (before the fix it came first, while ``/readyz`` still had to load the bundle).
Real CLI in a subprocess in front of ``prefixgate-sim replicas``, ephemeral ports only.
"""

from __future__ import annotations

from pathlib import Path

from sim.quickstart import init_gateway_dir
from tests.support.serve_cli import quickstart_ports, start_replicas_and_gateway, stop, wait_logged


def test_ready_is_logged_after_the_first_trust_bundle_load(tmp_path: Path) -> None:
    port, admin_port, base = quickstart_ports()
    res = init_gateway_dir(tmp_path / "gw", port=port, admin_port=admin_port, replicas=1, replica_base_port=base)
    replicas, gw, rlog, glog = start_replicas_and_gateway(res.config, tmp_path)
    try:
        wait_logged(lambda: "replicas ready" in rlog.read_text(), "replicas", replicas, rlog)
        # nothing asks /readyz or sends a request: serve itself must load the bundle before "ready:"
        wait_logged(lambda: "ready: " in glog.read_text(), "gateway ready", gw, glog)
        text = glog.read_text()
        assert "bundle keys now" in text, text
        assert text.index("listening: public") < text.index("bundle keys now") < text.index("ready: "), text
        assert text.index("listening: admin") < text.index("ready: "), text
    finally:
        stop(gw, replicas)
