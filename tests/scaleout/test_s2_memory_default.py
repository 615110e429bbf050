"""The memory default is untouched by the shared-state wiring (issue 16): no Redis module is imported,
the router holds the in-process index itself and the in-process load tracker behind local wrappers only
(no shared-state wrapper on the request path)."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.scaleout.s2_instances import ROOT

SCRIPT = """
import sys
from pathlib import Path
from gateway.auditing import AuditHub
from gateway.build import build
from gateway.config import GatewayConfig
from routing.index import InProcessPrefixIndex
from routing.load import InProcessLoadTracker
from tests.scaleout.s2_instances import instance_doc, write_secret

tmp = Path(sys.argv[1])
doc = instance_doc(tmp, 0, "redis://127.0.0.1:1/0", write_secret(tmp / "master.key"))
doc["state"] = {"backend": "memory"}
gw = build(GatewayConfig.model_validate(doc), audit=AuditHub(None))
assert gw.shared is None
assert type(gw.router.index) is InProcessPrefixIndex and gw.router.index is gw.index
chain, t = [], gw.router.loads
while True:  # local wrappers (flow control's release notice, calibration) may sit in front
    chain.append(type(t).__module__)
    if not hasattr(t, "inner"):
        break
    t = t.inner
assert type(t) is InProcessLoadTracker, chain
assert not any(m.startswith(("routing.shared", "gateway.shared")) for m in chain), chain
loaded = [m for m in ("gateway.shared_state", "gateway.shared_routing", "gateway.shared_docs",
                      "gateway.shared_alerts", "routing.shared", "redis") if m in sys.modules]
assert not loaded, loaded
print("ok")
"""


def test_memory_backend_builds_what_it_built_before(tmp_path: Path) -> None:
    out = subprocess.run([sys.executable, "-c", SCRIPT, str(tmp_path)], cwd=ROOT, capture_output=True, text=True,
                         timeout=120, env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-2000:]
