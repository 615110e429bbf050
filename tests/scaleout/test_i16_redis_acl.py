"""The Redis connection of ``state``: an ACL user restricted to the key prefix, its password from a
0600 file or the environment, never in the URL or an error message (tenancy/shared.py, issue 16)."""
from __future__ import annotations

import os
from pathlib import Path

import pytest
import redis.asyncio as aioredis
from redis.exceptions import AuthenticationError, NoPermissionError, ResponseError

from gateway.config import StateConfig
from tenancy.registry import Tenant
from tenancy.shared import StateSetupError, make_limits, redis_client

PASSWORD = "s3cret-acl-password-for-tests"


@pytest.fixture
async def acl_user(redis_server):
    """ACL user ``pg`` limited to keys ``pgacl:*``, no admin or dangerous commands."""
    admin = aioredis.Redis.from_url(redis_server.url)
    await admin.execute_command("ACL", "SETUSER", "pg", "on", f">{PASSWORD}", "resetkeys", "~pgacl:*",
                                "resetchannels", "-@all", "+@read", "+@write", "+@scripting", "+time",
                                "-@admin", "-@dangerous")
    yield redis_server
    await admin.aclose()


def _secret_file(tmp_path: Path, mode: int) -> str:
    p = tmp_path / "redis-password"
    p.write_text(PASSWORD + "\n")
    p.chmod(mode)
    return str(p)


async def test_acl_user_with_password_file_runs_the_scripts(acl_user, tmp_path: Path) -> None:
    cfg = StateConfig(backend="redis", url=acl_user.url, username="pg", key_prefix="pgacl:",
                      password_file=_secret_file(tmp_path, 0o600))
    lim = make_limits(cfg)
    try:
        t = Tenant(id="acme", rate_rps=0.001, rate_burst=2, max_concurrency=5,
                   output_tokens_per_s=1.0, output_tokens_burst=10.0)
        lease = await lim.limiter.admit(t)
        res = await lim.ledger.reserve(t, 0, 5)
        res.settle(0, 3, "usage")
        lease.release()
        await lim.flush()
        assert (await lim.ledger.totals())["acme"].charged["output"] == 3
        # the ACL confines the user to its prefix and to no admin command
        client = redis_client(cfg)
        try:
            with pytest.raises(NoPermissionError):
                await client.set("other:key", "1")
            with pytest.raises(NoPermissionError):
                await client.flushall()
        finally:
            await client.aclose()
    finally:
        await lim.aclose()


async def test_wrong_password_from_the_environment_is_refused_without_echoing_it(acl_user, monkeypatch) -> None:
    monkeypatch.setenv("PG_REDIS_PW", "wrong-password-value")
    lim = make_limits(StateConfig(backend="redis", url=acl_user.url, username="pg", key_prefix="pgacl:",
                                  password_env="PG_REDIS_PW"))
    try:
        with pytest.raises((AuthenticationError, ResponseError)) as exc:
            await lim.limiter.admit(Tenant(id="acme", max_concurrency=1))
        assert "wrong-password-value" not in str(exc.value)
    finally:
        await lim.aclose()


def test_password_sources_are_checked(tmp_path: Path, monkeypatch) -> None:
    base = {"backend": "redis", "url": "redis://127.0.0.1:1/0", "username": "pg"}
    with pytest.raises(StateSetupError, match="accessible by group/others") as exc:
        redis_client(StateConfig(**base, password_file=_secret_file(tmp_path, 0o644)))
    assert PASSWORD not in str(exc.value)
    with pytest.raises(StateSetupError, match="cannot be opened"):
        redis_client(StateConfig(**base, password_file=str(tmp_path / "absent")))
    monkeypatch.delenv("PG_UNSET_PW", raising=False)
    with pytest.raises(StateSetupError, match="PG_UNSET_PW"):
        redis_client(StateConfig(**base, password_env="PG_UNSET_PW"))
    assert os.environ.get("PG_UNSET_PW") is None
