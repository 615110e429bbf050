"""Active health checking of replicas over HTTP.

Every ``interval_s`` seconds the checker GETs ``{replica.url}/health`` on each
replica (timeout ``timeout_s``). A check passes on HTTP 200 with a JSON
object body. ``unhealthy_after`` consecutive failed checks mark the replica
down, ``healthy_after`` consecutive passes mark it up again (hysteresis, as in
Envoy's and Kubernetes' probes). When the body's ``instance_id`` changes, the
replica restarted and lost its KV cache: ``on_restart(replica_id)`` is called
so the router forgets that replica's prefix index entries.

Passive health (as Envoy's outlier detection uses real traffic): the probe runs on the
gateway's own event loop, so a saturated loop can make it time out although the replica is
fine. A probe that *timed out* is therefore not counted against a replica whose last real
upstream verdict was a success at most ``passive_grace_s`` seconds ago
(:meth:`ReplicaSet.answered_recently`); an explicit bad answer (non-200, refused connection,
bad body) always counts. Real failures are the circuit breaker's: ``breaker_failures``
consecutive ones open it, and any real failure voids the grace.

:func:`completion_probe` is the gateway's own one-token completion, sent before tenants' evidence
alone opens a replica's shared circuit (gateway/replica_verify.py, session 10, S9-L4): ``/health``
is answered by an engine's API server even when its engine fails every request, so it cannot tell
a real fault from colluding tenants' poison.
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

__all__ = ["HealthChecker", "completion_probe", "read_at_most", "PROBE_PROMPT"]

#: the prompt of the gateway's verification completion (gateway text, never a tenant's)
PROBE_PROMPT = "ping"
#: most bytes of a verification answer read (and decoded)
PROBE_MAX_BYTES = 1 << 20

log = logging.getLogger(__name__)


async def read_at_most(resp: aiohttp.ClientResponse, limit: int) -> bytes | None:
    """``resp``'s raw body, read 64 KiB at a time: None as soon as it passes ``limit`` bytes (read no
    further). The probes' bound on what a replica makes the gateway buffer (session 12: ``resp.read()``
    buffered a ``/health`` or ``/metrics`` body of any size before its decoded size was checked)."""
    data = bytearray()
    async for chunk in resp.content.iter_chunked(1 << 16):
        data += chunk
        if len(data) > limit:
            return None
    return bytes(data)


async def completion_probe(session: aiohttp.ClientSession, url: str, model: str, timeout_s: float) -> bool:
    """One ``POST {url}/v1/completions`` of the gateway's own (``model``, :data:`PROBE_PROMPT`,
    ``max_tokens`` 1, temperature 0, not streamed, no tenant, no cache salt), bounded by ``timeout_s``
    seconds in total: True when the replica answers 200 with a JSON object holding a ``choices`` list
    (compressed answers decoded; at most :data:`PROBE_MAX_BYTES` read and decoded), False for anything else (status, timeout, connection
    error, bad body). Never raises for the replica's doing."""
    body = {"model": model, "prompt": PROBE_PROMPT, "max_tokens": 1, "temperature": 0, "stream": False}
    try:
        async with session.post(url.rstrip("/") + "/v1/completions", json=body,
                                timeout=aiohttp.ClientTimeout(total=timeout_s)) as resp:
            if resp.status != 200:
                return False
            data = await read_at_most(resp, PROBE_MAX_BYTES)
            if data is None:  # a one-token answer is small: no replica makes us buffer more
                return False
            raw = decode_body(data, resp.headers.get("Content-Encoding"), PROBE_MAX_BYTES)
        answer = json.loads(raw)
    except (asyncio.TimeoutError, aiohttp.ClientError, ValueError, ContentCodingError):
        return False
    return isinstance(answer, dict) and isinstance(answer.get("choices"), list)


class HealthChecker:
    """Periodic ``GET /health`` prober; see module doc. ``passive_grace_s`` (seconds, 0 turns
    it off): how recent a real success must be for a timed-out probe not to count;
    ``on_ignored_timeout(replica_id)`` is called for each probe timeout so ignored (a metric, so
    that a replica whose probes keep timing out is visible although it stays routable). Raises
    :class:`ValueError` on non-positive interval/timeout/thresholds or a negative grace."""

    def __init__(
        self,
        replica_set: ReplicaSet,
        session: aiohttp.ClientSession,
        interval_s: float = 2.0,
        timeout_s: float = 1.0,
        unhealthy_after: int = 2,
        healthy_after: int = 1,
        on_restart: Callable[[str], None] | None = None,
        passive_grace_s: float = 5.0,
        on_ignored_timeout: Callable[[str], None] | None = None,
    ) -> None:
        if interval_s <= 0 or timeout_s <= 0 or unhealthy_after < 1 or healthy_after < 1:
            raise ValueError("interval_s, timeout_s must be > 0 and thresholds >= 1")
        if passive_grace_s < 0:
            raise ValueError("passive_grace_s must be >= 0")
        self.passive_grace_s = passive_grace_s
        self.replica_set = replica_set
        self.session = session
        self.interval_s = interval_s
        self.timeout_s = timeout_s
        self.unhealthy_after = unhealthy_after
        self.healthy_after = healthy_after
        self.on_restart = on_restart
        self.on_ignored_timeout = on_ignored_timeout
        self._fails: dict[str, int] = {}
        self._passes: dict[str, int] = {}
        self._loop = PeriodicTask(self.check_once, interval_s, "health check")

    async def probe(self, replica_id: str) -> str | None:
        """One check of ``replica_id``: returns the reported instance id
        ("" when absent) if the check passed, ``None`` if it failed."""
        return (await self._probe(replica_id))[0]

    async def _probe(self, replica_id: str) -> tuple[str | None, bool]:
        """:meth:`probe`'s answer and whether a failure was a timeout (connect or read)."""
        url = self.replica_set.get(replica_id).url.rstrip("/") + "/health"
        try:
            async with self.session.get(url, timeout=aiohttp.ClientTimeout(total=self.timeout_s)) as resp:
                if resp.status != 200:
                    return None, False
                data = await read_at_most(resp, PROBE_MAX_BYTES)  # session 12: was resp.read(), unbounded
                if data is None:
                    return None, False
                # a compressing replica (or proxy) is decoded, not failed (issue 10, finding 5)
                raw = decode_body(data, resp.headers.get("Content-Encoding"), PROBE_MAX_BYTES)
            body = json.loads(raw)
        except asyncio.TimeoutError:  # also aiohttp's ServerTimeoutError / ConnectionTimeoutError
            return None, True
        except (aiohttp.ClientError, ValueError, ContentCodingError):
            return None, False
        if not isinstance(body, dict):
            return None, False
        inst = body.get("instance_id")
        return (inst if isinstance(inst, str) else ""), False

    async def check_once(self) -> None:
        """Probe every replica concurrently and apply the verdicts."""
        ids = [r.id for r in self.replica_set.all()]
        results = await asyncio.gather(*(self._probe(rid) for rid in ids))
        for rid, (inst, timed_out) in zip(ids, results):
            with contextlib.suppress(UnknownReplicaError):  # removed while probing
                if (timed_out and self.passive_grace_s > 0
                        and self.replica_set.answered_recently(rid, self.passive_grace_s)):
                    log.debug("replica %s: health probe timed out but real traffic succeeded "
                              "within %.1f s; not counted", rid, self.passive_grace_s)
                    if self.on_ignored_timeout is not None:
                        self.on_ignored_timeout(rid)
                    continue
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
