"""The configurations issue 13's tests check: the demo's, the test suite's, the example and ``init``'s.

Each builder returns a config document (dict) whose secrets, bundle and audit
key exist under ``tmp``, so :func:`gateway.build.build` can be
built from it. Replica URLs point at nothing (no test here sends upstream).
"""

from __future__ import annotations

import importlib.util
import os
import secrets
import sys
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "gateway.yaml"


def _load_tests_conftest() -> Any:
    spec = importlib.util.spec_from_file_location("i13_tests_conftest", ROOT / "tests" / "conftest.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # its dataclasses look their module up
    spec.loader.exec_module(mod)
    return mod


def demo_config(tmp: Path) -> dict[str, Any]:
    """``sim.demo.gateway_config`` as the main job writes it (3 tenants, 6 replicas)."""
    from sim.bounds import tenant_names
    from sim.demo import DemoPaths, gateway_config, prepare_identity

    paths = DemoPaths.under(tmp / "demo")
    prepare_identity(paths)
    replicas = [{"replica_id": f"replica-{i}", "url": f"http://127.0.0.1:{9 + i}"} for i in range(6)]
    return gateway_config("cache_aware", replicas, tenant_names(3), paths, listen_port=0, admin_port=0)


def tests_config(tmp: Path) -> dict[str, Any]:
    """tests/conftest.py ``base_config`` with three replicas (the ``stack`` fixture's default)."""
    from sim.spiffe_issuer import DemoIssuer

    conftest = _load_tests_conftest()
    (tmp / "tests").mkdir()
    urls = [f"http://127.0.0.1:{9 + i}" for i in range(3)]
    return conftest.base_config(tmp / "tests", urls, DemoIssuer(conftest.TD))


def example_config(tmp: Path) -> dict[str, Any]:
    """examples/gateway.yaml with its /etc and /var paths moved under ``tmp`` (files created),
    its bundle URL replaced by a file and its syslog sink dropped (nothing listens here)."""
    from audit.keys import generate_signing_key
    from sim.spiffe_issuer import DemoIssuer

    text = EXAMPLE.read_text(encoding="utf-8")
    etc, var = tmp / "etc", tmp / "var"
    etc.mkdir()
    var.mkdir()
    doc = yaml.safe_load(text.replace("/etc/prefixgate", str(etc)).replace("/var/lib/prefixgate", str(var)))
    (etc / "master.key").write_text(secrets.token_hex(32))
    os.chmod(etc / "master.key", 0o600)
    generate_signing_key(etc / "audit-signing.key")
    bundle = etc / "bundle.json"
    DemoIssuer("prod.example").write_bundle(bundle)
    doc["identity"]["trust_domains"]["prod.example"] = {"bundle_file": str(bundle)}
    doc["audit"].pop("syslog")
    return doc


def init_config(tmp: Path) -> dict[str, Any]:
    """What ``prefixgate-sim init`` writes."""
    from sim.quickstart import init_gateway_dir

    res = init_gateway_dir(tmp / "init")
    return yaml.safe_load(res.config.read_text(encoding="utf-8"))


BUILDERS = {"demo": demo_config, "tests": tests_config, "example": example_config, "init": init_config}
