"""Issue 13: developer commands live in ``prefixgate-sim`` (owned by sim/), and the product
CLI ``prefixgate`` never imports the simulator.

- ``prefixgate-sim trust-domain create`` makes a trust domain once; tokens
  minted from it in later runs keep verifying (before: ``python -m
  sim.spiffe_issuer`` made a new key on every run, 401 ``unknown_kid``);
- ``prefixgate-sim token`` prints the bare token, with the documented lifetime;
- ``prefixgate-sim init`` writes a config the gateway accepts as is.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import jwt
import pytest
from click.testing import CliRunner

from gateway.auditing import AuditHub
from gateway.build import build
from gateway.config import load_config
from gateway.identity import FileBundleSource, JwtSvidVerifier, TrustBundleStore
from sim.cli import DEFAULT_TOKEN_TTL_S
from sim.cli import main as sim_cli

ROOT = Path(__file__).resolve().parents[2]


def _run(*args: str) -> str:
    res = CliRunner().invoke(sim_cli, list(args), catch_exceptions=False)
    assert res.exit_code == 0, res.output
    return res.output


def test_product_cli_never_imports_the_simulator() -> None:
    code = ("import sys, gateway.cli, gateway.server, gateway.app;"
            "bad = sorted(m for m in sys.modules if m == 'sim' or m.startswith('sim.'));"
            "print(bad); sys.exit(1 if bad else 0)")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run([sys.executable, "-c", code], cwd=str(ROOT), env=env, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    from gateway.cli import main as prefixgate

    assert "demo" not in prefixgate.commands
    assert {"demo", "replicas", "init", "token", "trust-domain"} <= set(sim_cli.commands)


async def test_tokens_from_a_created_trust_domain_stay_valid(tmp_path: Path) -> None:
    td = tmp_path / "td"
    _run("trust-domain", "create", str(td), "--name", "example.org")
    first = _run("token", str(td), "spiffe://example.org/ns/a/app").strip()
    # creating it again is refused: the key (and every token) stays
    res = CliRunner().invoke(sim_cli, ["trust-domain", "create", str(td), "--name", "example.org"])
    assert res.exit_code != 0 and "already holds trust domain" in res.output
    later = _run("token", str(td), "spiffe://example.org/ns/b/app", "--ttl", "60").strip()
    assert "\n" not in first and first.count(".") == 2  # the bare compact JWS
    store = TrustBundleStore()
    store.add(FileBundleSource("example.org", str(td / "bundle.json")))
    verifier = JwtSvidVerifier(store, "prefixgate", ["example.org"])
    for tok, sub in ((first, "spiffe://example.org/ns/a/app"), (later, "spiffe://example.org/ns/b/app")):
        ident = await verifier.verify(tok)
        assert str(ident.spiffe_id) == sub
    claims = jwt.decode(first, options={"verify_signature": False})
    assert claims["exp"] - claims["iat"] == DEFAULT_TOKEN_TTL_S and claims["aud"] == "prefixgate"
    assert os.stat(next((td / "keys").glob("*.pem"))).st_mode & 0o077 == 0
    bad = CliRunner().invoke(sim_cli, ["token", str(td), "spiffe://other.org/x"])
    assert bad.exit_code != 0 and "not a SPIFFE ID of trust domain example.org" in bad.output


def test_init_writes_a_config_the_gateway_accepts(tmp_path: Path) -> None:
    out = _run("init", str(tmp_path / "gw"), "--replicas", "3")
    cfg_path = tmp_path / "gw" / "gateway.yaml"
    assert str(cfg_path) in out
    cfg = load_config(cfg_path)
    c = build(cfg, audit=AuditHub(None))
    assert [t.id for t in c.registry.tenants()] == ["acme", "globex"] and len(cfg.replicas) == 3
    assert cfg.policy.dir is None and c.configuration_warnings() == []
    assert os.stat(tmp_path / "gw" / "master.key").st_mode & 0o077 == 0
    # a second init never overwrites
    res = CliRunner().invoke(sim_cli, ["init", str(tmp_path / "gw")])
    assert res.exit_code != 0 and "never overwrites" in res.output
    tok = _run("token", str(tmp_path / "gw"), "spiffe://quickstart.test/acme/app").strip()
    assert jwt.decode(tok, options={"verify_signature": False})["sub"] == "spiffe://quickstart.test/acme/app"


def test_demo_help_goes_to_the_simulator() -> None:
    res = CliRunner().invoke(sim_cli, ["demo", "--help"])
    assert res.exit_code == 0 and "--rows" in res.output and "prefixgate-sim demo" in res.output


@pytest.mark.parametrize("argv", [[], ["--config", "x.yaml", "--count", "2"]])
def test_replicas_needs_exactly_one_source(tmp_path: Path, argv: list[str]) -> None:
    if argv:
        argv = ["--config", str(tmp_path / "x.yaml"), "--count", "2"]
        (tmp_path / "x.yaml").write_text(json.dumps({"replicas": []}))
    res = CliRunner().invoke(sim_cli, ["replicas", *argv])
    assert res.exit_code != 0 and "exactly one of --config FILE or --count N" in res.output


def test_demo_writes_its_results_to_an_ignored_directory() -> None:
    """`make demo` leaves `git status` clean: its default output directory is git-ignored and no
    tracked file is named like a run's output (the reference run is demo.reference.*)."""
    import shutil

    from sim.demo import _parse

    out = _parse([]).out
    assert out == ROOT / "results"
    assert (ROOT / "bench" / "results" / "demo.reference.md").is_file()
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    for name in ("demo.md", "demo.json"):
        rel = (out / name).relative_to(ROOT)
        ignored = subprocess.run(["git", "check-ignore", "-q", str(rel)], cwd=str(ROOT), timeout=30)
        assert ignored.returncode == 0, f"{rel} is not git-ignored"
    tracked = subprocess.run(["git", "ls-files", str(out.relative_to(ROOT))], cwd=str(ROOT), capture_output=True,
                             text=True, timeout=30).stdout
    assert tracked == ""
