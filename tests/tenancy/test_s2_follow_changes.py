"""The key-state loop (tenancy/shared_keys.py) follows changes with the same loop as the shared
documents (tenancy/shared_store.py ``follow_changes``): a first sync that fails (Redis went away
between the join and the loop's start) is retried, it no longer ends the loop for good."""
from __future__ import annotations

from tenancy.keys import KeyRing
from tenancy.shared_keys import SharedKeyState
from tests.support.pubsub import PubSubOnlyClient
from tests.support.waiting import wait_for


class _FlakyRedis(PubSubOnlyClient):
    """``hgetall`` fails ``failures`` times (Redis down), then answers an empty hash."""

    def __init__(self, failures: int) -> None:
        self.failures = failures
        self.calls = 0

    def register_script(self, source: str) -> object:
        return object()

    async def hgetall(self, key: str) -> dict[bytes, bytes]:
        self.calls += 1
        if self.calls <= self.failures:
            raise ConnectionError("redis is down")
        return {}


async def test_a_failed_first_sync_is_retried() -> None:
    client = _FlakyRedis(failures=1)
    state = SharedKeyState(client, "pg:", b"k" * 32, KeyRing(b"k" * 32), poll_s=0.01)
    state.start()
    try:
        await wait_for(lambda: client.calls >= 3, timeout_s=10, what="syncs after the failed first one")
    finally:
        await state.aclose()
