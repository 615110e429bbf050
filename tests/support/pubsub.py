"""A Redis Pub/Sub stand-in for tests of loops that follow a channel (``tenancy.shared_store.follow_changes``,
``tenancy.shared_keys.SharedKeyState``) without a Redis server.

:class:`SilentPubSub` subscribes, never delivers a message (``get_message`` waits its ``timeout``
seconds and returns None, as redis-py's ``PubSub.get_message`` does when nothing arrived) and
closes; :class:`PubSubOnlyClient` is a client that offers nothing but ``pubsub()``.
"""
from __future__ import annotations

import asyncio

__all__ = ["PubSubOnlyClient", "SilentPubSub"]


class SilentPubSub:
    """The subset of redis-py's asyncio ``PubSub`` the follow loops use; no message ever comes."""

    async def subscribe(self, channel: str) -> None:
        return None

    async def get_message(self, *, ignore_subscribe_messages: bool, timeout: float) -> None:
        """Wait ``timeout`` seconds, then None (no message)."""
        await asyncio.sleep(timeout)

    async def aclose(self) -> None:
        return None


class PubSubOnlyClient:
    """A Redis client stand-in whose only method is ``pubsub()`` (a new :class:`SilentPubSub`)."""

    def pubsub(self) -> SilentPubSub:
        return SilentPubSub()
