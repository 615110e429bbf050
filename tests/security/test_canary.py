"""Canary run: no prompt text, master secret, derived key, cache salt or JWT
leaves the gateway through a log, a metric, an error body, an audit sink or
a spill file (issue 3 done-criteria; issue 6 "no secret in any output").

The run uses unique canary prompt words, the stack's master secret
(``tmp/master.key``, random per run) plus a second canary master rotated in
through the admin listener, and canary JWT-SVIDs (valid and forged ones).
It goes through allowed, streamed, chat, refused, denied, oversized and
malformed requests and operator actions; then every output is searched.
"""

from __future__ import annotations

import base64
import logging
import os
import secrets
from pathlib import Path
from typing import Any

import pytest

from gateway.auditing import AuditHub
from sim.procs import free_port
from tests.support.audit_log import file_audit_hub

TD = "demo.prefixgate.test"
CANARY = "canary" + secrets.token_hex(6)
CANARY2 = "kanarie" + secrets.token_hex(6)


closed_port = free_port  # free a moment ago: nothing listens there


@pytest.fixture
def audit_hub(tmp_path: Path) -> AuditHub:
    return file_audit_hub(
        tmp_path,
        ocsf={"file": str(tmp_path / "ocsf" / "events.ocsf.jsonl")},
        # a SIEM that is down: its events go to the spill file, which is searched too
        syslog={"host": "127.0.0.1", "port": closed_port(), "protocol": "tcp", "format": "cef"},
        summary=False,
    )


@pytest.fixture
def config_overrides() -> dict[str, Any]:
    return {"identity": {"unauthenticated_burst": 1000}}


async def stop_with_siem_down(c: Any) -> None:
    """Stop the components (flush every sink, final checkpoint; the fixture's stop is
    then a no-op) without waiting the default 10 s for the SIEM that never comes up."""
    close = c.audit.log.close

    async def quick_close(timeout_s: float = 10.0) -> None:
        await close(timeout_s=1.0)

    c.audit.log.close = quick_close
    await c.stop()


def forms(secret: bytes) -> list[bytes]:
    """Encodings under which a secret could leak."""
    return [
        secret,
        secret.hex().encode(),
        secret.hex().upper().encode(),
        base64.b64encode(secret),
        base64.b64encode(secret).rstrip(b"="),
        base64.urlsafe_b64encode(secret).rstrip(b"="),
        repr(secret)[2:-1].encode(),
    ]


def token_parts(token: str) -> list[bytes]:
    """The whole token and its payload and signature segments (the header only names the public kid)."""
    _, payload, sig = token.split(".")
    return [token.encode(), payload.encode(), sig.encode()]


async def test_canary_run_leaves_no_trace(stack: Any, caplog: pytest.LogCaptureFixture,
                                          capfd: pytest.CaptureFixture[str]) -> None:
    caplog.set_level(logging.DEBUG)
    c = stack.components
    admin = stack.admin_url
    tokens: list[str] = []
    responses: list[bytes] = []

    def tok(workload: str = "tenant-a/app", audience: str = "prefixgate", **kw: Any) -> dict[str, str]:
        t = stack.issuer.mint(f"spiffe://{TD}/{workload}", audience, **kw)
        tokens.append(t)
        return {"Authorization": f"Bearer {t}"}

    async def call(method: str, url: str, **kw: Any) -> Any:
        r = await stack.client.request(method, url, **kw)
        responses.append(r.text.encode() + b"\n" + "\n".join(f"{k}: {v}" for k, v in r.headers.items()).encode())
        return r

    prompt = " ".join([CANARY] + [f"{CANARY}x{i}" for i in range(80)])
    op = tok("ops/admin", "prefixgate-admin")
    # allowed: plain, streamed, chat, and a repeat (cache hit) of two tenants
    for who in ("tenant-a/app", "tenant-b/app", "tenant-a/app"):
        r = await call("POST", "/v1/completions", headers=tok(who), json={"model": "sim-model", "prompt": prompt})
        assert r.status_code == 200
    r = await call("POST", "/v1/completions", headers=tok(),
                   json={"model": "sim-model", "prompt": prompt, "stream": True, "max_tokens": 3})
    assert r.status_code == 200
    r = await call("POST", "/v1/chat/completions", headers=tok("tenant-b/svc"),
                   json={"model": "sim-model", "messages": [{"role": "system", "content": CANARY2},
                                                            {"role": "user", "content": prompt}]})
    assert r.status_code == 200
    # the client tries to choose the cache salt: overwritten, and not echoed anywhere
    r = await call("POST", "/v1/completions", headers=tok(),
                   json={"model": "sim-model", "prompt": prompt, "cache_salt": CANARY2 + "salt"})
    assert r.status_code == 200
    # refused and failed: forged/expired/foreign tokens, unmapped workload, oversize, bad JSON, unknown model
    forged = [stack.issuer.mint(f"spiffe://{TD}/tenant-a/app", "prefixgate", ttl_s=-100, now=None),
              stack.issuer.mint(f"spiffe://{TD}/tenant-a/app", "elsewhere"),
              stack.issuer.mint(f"spiffe://{TD}/tenant-a/app", "prefixgate", headers={"kid": CANARY2}),
              prompt.replace(" ", ".")[:200] + ".x"]
    tokens += forged[:3]
    for t in forged:
        r = await call("POST", "/v1/completions", headers={"Authorization": f"Bearer {t}"},
                       json={"model": "sim-model", "prompt": prompt})
        assert r.status_code == 401
    r = await call("POST", "/v1/completions", headers=tok("stranger/x"), json={"model": "sim-model", "prompt": prompt})
    assert r.status_code == 403
    r = await call("POST", "/v1/completions", headers=tok(),
                   json={"model": "sim-model", "prompt": " ".join([CANARY] * 4100)})
    assert r.status_code == 400
    r = await call("POST", "/v1/completions", headers=tok(), content=f'{{"prompt": "{CANARY} '.encode())
    assert r.status_code == 400
    r = await call("POST", "/v1/completions", headers=tok(), json={"model": "no-such-model", "prompt": prompt})
    assert r.status_code == 404
    r = await call("POST", "/v1/completions", headers=tok("tenant-reg/app"),
                   json={"model": "sim-model", "prompt": prompt, "max_tokens": 10**6})
    assert r.status_code in (200, 400, 403)
    # operator actions, including a master rotation to a second canary secret
    old_master = (stack.tmp / "master.key").read_bytes()
    for path in ("/admin/tenants/tenant-a/rotate-key", "/admin/tenants/tenant-b/rotate-salt"):
        r = await call("POST", admin + path, headers=op)
        assert r.status_code == 200, r.text
    new_master = secrets.token_bytes(48)
    fd = os.open(stack.tmp / "master.new", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.write(fd, new_master)
    os.close(fd)
    os.replace(stack.tmp / "master.new", stack.tmp / "master.key")
    assert (await call("POST", admin + "/admin/keys/rotate-master",
                       headers=op)).status_code == 200
    assert (await call("POST", admin + "/admin/keys/rotate-master",
                       headers=op)).status_code == 409
    r = await call("POST", "/v1/completions", headers=tok(), json={"model": "sim-model", "prompt": prompt})
    assert r.status_code == 200
    # metrics and status pages
    for url in ("/metrics", "/healthz", "/readyz"):
        await call("GET", url)
    for path in ("/admin/metrics", "/admin/routing", "/admin/replicas"):
        assert (await call("GET", admin + path, headers=op)).status_code == 200

    # every key the run derived, and the salts it sent upstream
    secrets_: list[bytes] = []
    for secret in (old_master, new_master):
        secrets_ += forms(secret)
    for tid in ("tenant-a", "tenant-b", "tenant-reg"):
        for k in c.keyring.lookup_keys(tid):
            secrets_ += forms(k.key)
        secrets_.append(c.keyring.cache_salt(tid).encode())
    from tenancy.salt import cache_salt, derive_salt_key

    for secret in (old_master, new_master):
        for tid in ("tenant-a", "tenant-b", "tenant-reg"):
            sk = derive_salt_key(secret, tid)
            secrets_ += forms(sk)
            secrets_ += [cache_salt(sk, tid, e).encode() for e in (0, 1)]
    canaries = [CANARY.encode(), CANARY2.encode()] + secrets_
    for t in tokens:
        canaries += token_parts(t)

    await stop_with_siem_down(c)
    out, err = capfd.readouterr()
    files = {p: p.read_bytes() for p in stack.tmp.rglob("*")
             if p.is_file() and p.name not in ("master.key", "audit.key")}
    assert any("spill" in str(p) and data for p, data in files.items()), "the down SIEM left no spill file"
    assert any("ocsf" in str(p) and data for p, data in files.items())
    assert sum(data.count(b'"type": "event"') + data.count(b'"type":"event"')
               for p, data in files.items() if p.suffix == ".jsonl") >= 10
    outputs: dict[str, bytes] = {
        "logs": caplog.text.encode() + b"\n".join(str(r.__dict__).encode() for r in caplog.records),
        "stdout/stderr": (out + err).encode(),
        "responses": b"\n".join(responses),
        **{f"file {p.relative_to(stack.tmp)}": data for p, data in files.items()},
    }
    leaks = [f"{where}: {needle[:24]!r}…" for where, blob in outputs.items() for needle in canaries if needle in blob]
    assert not leaks, "\n".join(leaks[:20])


async def test_unknown_model_name_is_not_written_to_the_audit_trail(stack: Any) -> None:
    """A refused, client-chosen model name is free text from the caller: writing it
    verbatim into the SIEM lets a client smuggle anything (prompt text, a token)
    into the audit trail. Only served model names belong in audit events."""
    r = await stack.client.post("/v1/completions", headers=stack.auth(),
                                json={"model": CANARY2, "prompt": "hello world"})
    assert r.status_code == 404 and CANARY2 not in r.text
    await stop_with_siem_down(stack.components)
    blob = b"".join(p.read_bytes() for p in stack.tmp.rglob("*") if p.is_file())
    assert b'"outcome":"rejected"' in blob or b'"outcome": "rejected"' in blob
    assert CANARY2.encode() not in blob
