"""``state`` section validation and ``serve --workers`` refusals (issue 16)."""
from __future__ import annotations

import os
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from gateway.cli import main as prefixgate
from gateway.config import ConfigError, load_config


def test_default_is_the_embedded_memory_backend() -> None:
    cfg = load_config(None)
    assert cfg.state.backend == "memory"
    assert cfg.state.lease_ttl_s == 10.0
    assert cfg.state.key_prefix == "prefixgate:"


def test_redis_backend_fields() -> None:
    st = load_config(None, {"state": {"backend": "redis", "url": "rediss://redis.internal:6380/2",
                                      "username": "prefixgate", "password_env": "PG_REDIS_PASSWORD",
                                      "tls_ca_file": "/etc/ssl/redis-ca.pem", "key_prefix": "pg-prod:",
                                      "lease_ttl_s": 5}}).state
    assert (st.backend, st.url, st.username, st.password_env, st.tls_ca_file, st.key_prefix, st.lease_ttl_s) == (
        "redis", "rediss://redis.internal:6380/2", "prefixgate", "PG_REDIS_PASSWORD", "/etc/ssl/redis-ca.pem",
        "pg-prod:", 5.0)


@pytest.mark.parametrize(("state", "message"), [
    ({"backend": "redis"}, "state: state.url is required"),
    ({"backend": "redis", "url": "http://h:6379"}, "state.url: state url must start with"),
    ({"backend": "redis", "url": "redis://user:hunter2@h:6379/0"}, "state.url: state url must not contain a password"),
    ({"backend": "redis", "url": "redis://h", "password_file": "/p", "password_env": "P"}, "state: set at most one"),
    ({"backend": "redis", "url": "redis://h", "tls_ca_file": "/ca.pem"}, "state: state.tls_ca_file needs a rediss:// url"),
    ({"lease_ttl_s": 10.5}, "state.lease_ttl_s: Input should be less than or equal to 10"),
    ({"lease_ttl_s": 0}, "state.lease_ttl_s: Input should be greater than 0"),
    ({"key_prefix": "has space"}, "state.key_prefix: String should match pattern"),
    ({"backend": "etcd"}, "state.backend: Input should be 'memory' or 'redis'"),
    ({"bogus": 1}, "state.bogus: unknown field"),
])
def test_invalid_state_is_refused_with_its_dotted_location(state: dict, message: str) -> None:
    with pytest.raises(ConfigError) as exc:
        load_config(None, {"state": state})
    assert str(exc.value).startswith(f"invalid configuration: {message}"), str(exc.value)
    assert "hunter2" not in str(exc.value)


def _serve(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, state: dict, *args: str):
    monkeypatch.setenv("GOGC", os.environ.get("GOGC", "800"))  # no re-exec inside the test process
    cfg = tmp_path / "gateway.yaml"
    cfg.write_text(yaml.safe_dump({"state": state}))
    return CliRunner().invoke(prefixgate, ["serve", "--config", str(cfg), *args])


def test_serve_workers_without_the_shared_backend_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    res = _serve(tmp_path, monkeypatch, {"backend": "memory"}, "--workers", "2")
    assert res.exit_code != 0
    assert "Error: serve --workers 2 needs state.backend: redis" in res.output, res.output


def test_the_redis_backend_may_serve_with_one_or_several_workers() -> None:
    # the shared limits are wired into admission (issue 16): no more "not implemented" refusal
    from gateway.cli import serving_refusal

    assert serving_refusal("redis", 1) is None
    assert serving_refusal("redis", 4) is None
    assert serving_refusal("memory", 1) is None
    assert "needs state.backend: redis" in (serving_refusal("memory", 2) or "")


def test_serve_workers_zero_is_a_usage_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    res = _serve(tmp_path, monkeypatch, {}, "--workers", "0")
    assert res.exit_code == 2 and "--workers" in res.output
