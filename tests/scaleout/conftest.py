"""Fixtures of the scale-out tests (issue 16): a real ``redis-server`` per test.

``redis_server``: a :class:`tests.support.redis_server.RedisServer` running
on a free loopback port (skipped only when the binary is absent and ``CI`` is
unset; see :func:`tests.support.redis_server.require_redis_server`).
"""
from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.redis_server import RedisServer, require_redis_server


@pytest.fixture
def redis_server(tmp_path: Path) -> Iterator[RedisServer]:
    """A running ``redis-server`` with its own temp dir; stopped after the test."""
    binary = require_redis_server()
    server = RedisServer(binary, tmp_path)
    server.start()
    try:
        yield server
    finally:
        server.stop()
