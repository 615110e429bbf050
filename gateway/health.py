"""Active health checking of replicas over HTTP.

Every ``interval_s`` seconds the checker GETs ``{replica.url}/health`` on each
replica (timeout ``timeout_s``). A check passes on HTTP 200 with a JSON
object body. ``unhealthy_after`` consecutive failed checks mark the replica
down, ``healthy_after`` consecutive passes mark it up again (hysteresis, as in
Envoy's and Kubernetes' probes). When the body's ``instance_id`` changes, the
replica restarted and lost its KV cache: ``on_restart(replica_id)`` is called
so the router forgets that replica's prefix index entries.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Callable

import aiohttp

from gateway.proxy import ContentCodingError, decode_body
from gateway.replicas import ReplicaSet, UnknownReplicaError
from gateway.periodic import PeriodicTask

__all__ = ["HealthChecker"]

log = logging.getLogger(__name__)


class HealthChecker:
    """Periodic ``GET /health`` prober; see module doc. Raises
    :class:`ValueError` on non-positive interval/timeout/thresholds."""

    def __init__(
        self,
        replica_set: ReplicaSet,
        session: aiohttp.ClientSession,
        interval_s: float = 2.0,
        timeout_s: float = 1.0,
        unhealthy_after: int = 2,
        healthy_after: int = 1,
        on_restart: Callable[[str], None] | None = None,
    ) -> None:
        if interval_s <= 0 or timeout_s <= 0 or unhealthy_after < 1 or healthy_after < 1:
            raise ValueError("interval_s, timeout_s must be > 0 and thresholds >= 1")
        self.replica_set = replica_set
        self.session = session
        self.interval_s = interval_s
        self.timeout_s = timeout_s
        self.unhealthy_after = unhealthy_after
        self.healthy_after = healthy_after
        self.on_restart = on_restart
        self._fails: dict[str, int] = {}
        self._passes: dict[str, int] = {}
        self._loop = PeriodicTask(self.check_once, interval_s, "health check")

    async def probe(self, replica_id: str) -> str | None:
        """One check of ``replica_id``: returns the reported instance id
        ("" when absent) if the check passed, ``None`` if it failed."""
        url = self.replica_set.get(replica_id).url.rstrip("/") + "/health"
        try:
            async with self.session.get(url, timeout=aiohttp.ClientTimeout(total=self.timeout_s)) as resp:
                if resp.status != 200:
                    return None
                # a compressing replica (or proxy) is decoded, not failed (issue 10, finding 5)
                raw = decode_body(await resp.read(), resp.headers.get("Content-Encoding"), 1 << 20)
            body = json.loads(raw)
        except (aiohttp.ClientError, asyncio.TimeoutError, ValueError, ContentCodingError):
            return None
        if not isinstance(body, dict):
            return None
        inst = body.get("instance_id")
        return inst if isinstance(inst, str) else ""

    async def check_once(self) -> None:
        """Probe every replica concurrently and apply the verdicts."""
        ids = [r.id for r in self.replica_set.all()]
        results = await asyncio.gather(*(self.probe(rid) for rid in ids))
        for rid, inst in zip(ids, results):
            with contextlib.suppress(UnknownReplicaError):  # removed while probing
                self._apply(rid, inst)

    def _apply(self, rid: str, inst: str | None) -> None:
        if inst is None:
            self._passes[rid] = 0
            self._fails[rid] = self._fails.get(rid, 0) + 1
            if self._fails[rid] >= self.unhealthy_after and self.replica_set.state(rid).healthy:
                log.warning("replica %s marked down", rid)
                self.replica_set.mark_health(rid, False)
            return
        self._fails[rid] = 0
        self._passes[rid] = self._passes.get(rid, 0) + 1
        if inst and self.replica_set.observe_instance(rid, inst):
            log.info("replica %s restarted (new instance id); forgetting its prefix index", rid)
            if self.on_restart is not None:
                self.on_restart(rid)
        if self._passes[rid] >= self.healthy_after and not self.replica_set.state(rid).healthy:
            log.info("replica %s marked up", rid)
            self.replica_set.mark_health(rid, True)

    def start(self) -> None:
        """Start the periodic loop on the running event loop (idempotent)."""
        self._loop.start()

    async def stop(self) -> None:
        """Stop the loop and wait for it to end."""
        await self._loop.stop()
