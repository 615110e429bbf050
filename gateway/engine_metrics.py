"""Scrape each replica's engine metrics (``GET /metrics``) into the router's calibration.

Only what a real engine exposes is read: the Prometheus text of vLLM or
SGLang (names in :mod:`routing.calibration`). Runs only when
``routing.policy.calibrate`` is on. A failed scrape is skipped (the health
checker owns the replica's health); the last good sample stays.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

import aiohttp

from gateway.health import read_at_most
from gateway.proxy import ContentCodingError, decode_body
from gateway.replicas import ReplicaSet
from routing.calibration import Calibration, parse_engine_metrics
from gateway.periodic import PeriodicTask

__all__ = ["EngineMetricsPoller"]

log = logging.getLogger(__name__)

MAX_METRICS_BYTES = 4 << 20


class EngineMetricsPoller:
    """Every ``interval_s`` seconds GET ``{replica.url}/metrics`` of every
    replica (timeout ``timeout_s``) and store the parsed sample in
    ``calibration``; ``own_requests(replica_id)`` (optional): this router's
    running requests there, so the calibration can tell the engine's other
    clients' requests apart. Raises :class:`ValueError` on non-positive times."""

    def __init__(self, replica_set: ReplicaSet, session: aiohttp.ClientSession, calibration: Calibration,
                 interval_s: float = 2.0, timeout_s: float = 1.0,
                 own_requests: Callable[[str], int] | None = None) -> None:
        if interval_s <= 0 or timeout_s <= 0:
            raise ValueError("interval_s and timeout_s must be > 0")
        self.replica_set = replica_set
        self.session = session
        self.calibration = calibration
        self.interval_s = interval_s
        self.timeout_s = timeout_s
        self.own_requests = own_requests
        self._loop = PeriodicTask(self.scrape_once, interval_s, "engine metrics")

    async def scrape(self, replica_id: str) -> bool:
        """One scrape of ``replica_id``; True if a sample was stored."""
        url = self.replica_set.get(replica_id).url.rstrip("/") + "/metrics"
        own_before = self.own_requests(replica_id) if self.own_requests is not None else None
        try:
            async with self.session.get(url, timeout=aiohttp.ClientTimeout(total=self.timeout_s)) as resp:
                if resp.status != 200:
                    return False
                data = await read_at_most(resp, MAX_METRICS_BYTES)  # session 12: was resp.read(), unbounded
                if data is None:
                    return False
                raw = decode_body(data, resp.headers.get("Content-Encoding"), MAX_METRICS_BYTES)
            sample = parse_engine_metrics(raw.decode("utf-8", errors="replace"))
        except (TimeoutError, aiohttp.ClientError, ValueError, ContentCodingError):
            return False
        if not sample.engine:
            return False
        own = None
        if self.own_requests is not None and own_before is not None:
            # the larger of this router's count before and after the scrape: a request that
            # finished meanwhile must not look like another client's
            own = max(own_before, self.own_requests(replica_id))
        self.calibration.observe_engine(replica_id, sample, own)
        return True

    async def scrape_once(self) -> None:
        """Scrape every replica concurrently."""
        ids = [r.id for r in self.replica_set.all()]
        await asyncio.gather(*(self.scrape(rid) for rid in ids), return_exceptions=True)

    def start(self) -> None:
        """Start the periodic loop on the running event loop (idempotent)."""
        self._loop.start()

    async def stop(self) -> None:
        """Stop the loop and wait for it to end."""
        await self._loop.stop()
