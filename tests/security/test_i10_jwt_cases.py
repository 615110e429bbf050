"""Issue 10, JWT-SVID cases from public reports of other gateways.

* An empty, blank or whitespace-padded configured audience (public or admin)
  is a configuration error at load time (``load_config`` and ``prefixgate
  serve``), never a traceback and never accepted; so is one audience for both
  listeners, a bad ``trusted_proxies`` entry, and any key that would ask for
  forwarded-certificate-only authentication (unknown keys are refused).
* A token without ``aud`` is 401 on both listeners.
* Two trust domains whose bundles hold the same ``kid`` with different keys:
  a token for a workload of B is checked against B's bundle only (A's key,
  same kid: 401; B's key: 200).
* An ECDSA high-S twin of a valid token is accepted by the running gateway
  (finding 7; decision in docs/identity.md).
"""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from gateway.config import ConfigError, load_config
from sim.spiffe_issuer import DemoIssuer

REPO = Path(__file__).resolve().parents[2]
TD = "demo.prefixgate.test"
A, B = "a.example", "b.example"
BODY = {"model": "sim-model", "prompt": "two trust domains", "max_tokens": 2}
P256_N = 0xFFFFFFFF00000000FFFFFFFFFFFFFFFFBCE6FAADA7179E84F3B9CAC2FC632551

#: Issuers of the two extra trust domains; B's bundle publishes B's key under A's kid.
ISSUER_A = DemoIssuer(A)
ISSUER_B = DemoIssuer(B)


def _write_bundles(tmp: Path) -> tuple[Path, Path]:
    a_file, b_file = tmp / "bundle-a.json", tmp / "bundle-b.json"
    ISSUER_A.write_bundle(a_file)
    jwk_b = ISSUER_B.public_jwk()
    jwk_b["kid"] = ISSUER_A.kid  # the same kid in both bundles, different keys
    b_file.write_text(json.dumps({"keys": [jwk_b], "spiffe_sequence": 1}))
    return a_file, b_file


@pytest.fixture
def config_overrides(tmp_path: Path) -> dict[str, Any]:
    a_file, b_file = _write_bundles(tmp_path)
    tenants = [
        {"id": "tenant-a", "spiffe_ids": [f"spiffe://{TD}/tenant-a/", f"spiffe://{A}/app/"], "models": ["sim-model"],
         "pools": ["default"]},
        {"id": "tenant-b", "spiffe_ids": [f"spiffe://{B}/app/"], "models": ["sim-model"], "pools": ["default"]},
    ]
    return {
        "identity": {
            "audience": "prefixgate",
            "unauthenticated_burst": 1000,
            "trust_domains": {
                TD: {"bundle_file": str(tmp_path / "bundle.json")},  # written by the stack fixture
                A: {"bundle_file": str(a_file)},
                B: {"bundle_file": str(b_file)},
            },
        },
        "tenancy": {"tenants": tenants},
    }


# ------------------------------------------------------------ configuration


BAD_AUDIENCES = ["", " ", "   ", "\t", "\n", " prefixgate", "prefixgate ", "pre\x00fix"]


@pytest.mark.parametrize("field", ["audience", "admin_audience"])
@pytest.mark.parametrize("value", BAD_AUDIENCES)
def test_bad_configured_audience_is_a_config_error(tmp_path: Path, field: str, value: str) -> None:
    cfg = tmp_path / "g.yaml"
    cfg.write_text(yaml.safe_dump({"identity": {field: value}}))
    with pytest.raises(ConfigError) as ei:
        load_config(cfg)
    assert f"identity.{field}" in str(ei.value)
    # the environment override is checked the same way
    with pytest.raises(ConfigError):
        load_config(None, {"identity": {field: value}})


def test_one_audience_for_both_listeners_is_a_config_error() -> None:
    with pytest.raises(ConfigError) as ei:
        load_config(None, {"identity": {"audience": "same", "admin_audience": "same"}})
    assert "admin_audience" in str(ei.value)


@pytest.mark.parametrize("extra", [
    {"xfcc_only": True}, {"mode": "mtls"}, {"authentication": "xfcc"}, {"allow_xfcc_without_jwt": True},
    {"forwarded_cert_authenticates": True}, {"trust_forwarded_identity": True},
])
def test_no_setting_lets_a_forwarded_certificate_authenticate(extra: dict[str, Any]) -> None:
    with pytest.raises(ConfigError) as ei:
        load_config(None, {"identity": extra})
    assert f"identity.{next(iter(extra))}" in str(ei.value) and "unknown field" in str(ei.value)


def test_unknown_identity_key_from_environment_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PREFIXGATE__IDENTITY__XFCC_ONLY", "true")
    with pytest.raises(ConfigError) as ei:
        load_config(None)
    assert "identity.xfcc_only" in str(ei.value)


@pytest.mark.parametrize("bad", ["loopback", "127.0.0.1/33", "", "10.0.0.0/8; 0.0.0.0/0"])
def test_bad_trusted_proxy_is_a_config_error(bad: str) -> None:
    with pytest.raises(ConfigError) as ei:
        load_config(None, {"identity": {"trusted_proxies": [bad]}})
    assert "identity.trusted_proxies" in str(ei.value)


@pytest.mark.parametrize("value", ["", "   "])
def test_serve_refuses_a_blank_audience(tmp_path: Path, value: str) -> None:
    cfg = tmp_path / "g.yaml"
    cfg.write_text(yaml.safe_dump({"identity": {"audience": value}}))
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    p = subprocess.run([sys.executable, "-m", "gateway.cli", "serve", "--config", str(cfg)],
                       capture_output=True, text=True, timeout=120, env=env, cwd=tmp_path)
    assert p.returncode == 1, (p.returncode, p.stderr)
    assert "identity.audience" in p.stderr and "Traceback" not in p.stderr, p.stderr


# ------------------------------------------------------------ running gateway


def op_token(stack: Any, **kw: Any) -> str:
    return stack.issuer.mint(f"spiffe://{TD}/ops/admin", "prefixgate-admin", **kw)


async def test_token_without_aud_is_401_on_both_listeners(stack: Any) -> None:
    tok = stack.token(aud=None)
    r = await stack.client.post("/v1/completions", headers={"Authorization": f"Bearer {tok}"}, json=BODY)
    assert r.status_code == 401 and r.json()["error"]["code"] == "missing_claim", r.text
    r = await stack.client.get(f"{stack.admin_url}/admin/routing",
                               headers={"Authorization": f"Bearer {op_token(stack, aud=None)}"})
    assert r.status_code == 401, r.text
    assert 'error="invalid_token"' in r.headers["www-authenticate"]
    # control: with aud both pass
    r = await stack.client.get(f"{stack.admin_url}/admin/routing",
                               headers={"Authorization": f"Bearer {op_token(stack)}"})
    assert r.status_code == 200, r.text


async def test_same_kid_in_two_bundles_is_checked_against_the_subjects_domain_only(stack: Any) -> None:
    sub_b = f"spiffe://{B}/app/one"
    # A's key, A's kid (which B's bundle also lists, with B's key): claims a workload of B -> refused
    forged = ISSUER_A.mint(sub_b, "prefixgate")
    r = await stack.client.post("/v1/completions", headers={"Authorization": f"Bearer {forged}"}, json=BODY)
    assert r.status_code == 401 and r.json()["error"]["code"] == "bad_signature", r.text
    # B's key under that same kid: accepted, as tenant-b
    genuine = ISSUER_B.mint(sub_b, "prefixgate", headers={"kid": ISSUER_A.kid})
    r = await stack.client.post("/v1/completions", headers={"Authorization": f"Bearer {genuine}"}, json=BODY)
    assert r.status_code == 200, r.text
    # and the other way round: B's key cannot vouch for A's workloads either
    b_for_a = ISSUER_B.mint(f"spiffe://{A}/app/one", "prefixgate", headers={"kid": ISSUER_A.kid})
    r = await stack.client.post("/v1/completions", json=BODY, headers={"Authorization": f"Bearer {b_for_a}"})
    assert r.status_code == 401 and r.json()["error"]["code"] == "bad_signature", r.text
    r = await stack.client.post("/v1/completions", json=BODY, headers={
        "Authorization": f"Bearer {ISSUER_A.mint(f'spiffe://{A}/app/one', 'prefixgate')}"})
    assert r.status_code == 200, r.text


def _twin(token: str) -> str:
    h, p, s = token.split(".")
    sig = base64.urlsafe_b64decode(s + "==")
    s_int = int.from_bytes(sig[32:], "big")
    sig2 = sig[:32] + (P256_N - s_int).to_bytes(32, "big")
    return f"{h}.{p}.{base64.urlsafe_b64encode(sig2).rstrip(b'=').decode()}"


async def test_ecdsa_twin_is_accepted_by_the_gateway(stack: Any) -> None:
    tok = stack.token()
    for t in (tok, _twin(tok)):
        r = await stack.client.post("/v1/completions", headers={"Authorization": f"Bearer {t}"}, json=BODY)
        assert r.status_code == 200, r.text
