"""The upstream edge: the connection pool to the replicas (request path), active
health checks and the engine-metrics poller (calibration) on a small aiohttp
session of their own, and what one upstream call's outcome means for the
replica's circuit breaker and the router's view of it.

It is also the replica set's verifier (session 10, S9-L4): before tenants' evidence alone opens a
replica's shared circuit, it sends the gateway's own one-token completion there
(gateway/health.py ``completion_probe``) in a task of its own, bounded by
:data:`VERIFY_TIMEOUT_S` (or ``health.timeout_s`` if longer; at most ``upstream.first_byte_timeout_s``), and gives the verdict to
:meth:`gateway.replicas.ReplicaSet.verified`; the replica set bounds how often
(gateway/replica_verify.py).
"""

from __future__ import annotations

import asyncio
import logging
import sys

import aiohttp

from audit.tls import client_context
from gateway.config import HealthConfig, UpstreamConfig
from gateway.engine_metrics import EngineMetricsPoller
from gateway.health import HealthChecker, completion_probe
from gateway.metrics import GatewayMetrics
from gateway.proxy import UPSTREAM_DEFAULT_HEADERS, UpstreamFailure, make_session
from gateway.replicas import Attempt, ReplicaSet
from gateway.upstream_pool import UpstreamPool
from routing.calibration import Calibration
from routing.router import Router

__all__ = ["Upstream", "make_probe_session"]

#: most connections of the probe session (one probe per replica at a time)
PROBE_POOL_SIZE = 16
#: seconds (at least) a verification completion may take: a one-token answer behind a queue (S9-L4)
VERIFY_TIMEOUT_S = 5.0

log = logging.getLogger("prefixgate")

#: whether the probe session asks aiohttp to abort closed TLS transports (``enable_cleanup_closed``: asyncio leaks a
#: TLS connection whose peer never completes the shutdown, CPython gh-118950). Not on CPython 3.11.1-3.11.3 (Debian
#: 12's 3.11.2: the shared venv): there ``close()`` of a transport already closed (a peer that closed first) drops
#: its protocol and a later ``abort()`` raises AttributeError (gh-98539, from python/cpython#98540; fixed in 3.11.4
#: by #104485). aiohttp's 2-second clean-up swallows it and is never scheduled again, so every later such TLS
#: connection stays in its list for the session's life (a probe session lives as long as the gateway) and
#: ``session.close()`` raises it at stop (session 20, FT-2).
CLEANUP_CLOSED = not (3, 11, 1) <= sys.version_info[:3] < (3, 11, 4)


def make_probe_session(connect_timeout_s: float) -> aiohttp.ClientSession:
    """The aiohttp session of health checks and the engine-metrics poller (call inside a running loop):
    at most :data:`PROBE_POOL_SIZE` connections, ``Accept-Encoding: identity``, no cookies, no
    decompression (compressed answers are decoded by gateway.proxy.BodyDecoder); TLS with
    :func:`audit.tls.client_context`; closed TLS transports aborted where that is safe (:data:`CLEANUP_CLOSED`)."""
    return aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=PROBE_POOL_SIZE, limit_per_host=0, enable_cleanup_closed=CLEANUP_CLOSED,
                                       ssl=client_context()),  # https replicas: audit/tls.py (S19-R3)
        timeout=aiohttp.ClientTimeout(total=None, connect=connect_timeout_s, sock_read=None),
        cookie_jar=aiohttp.DummyCookieJar(), auto_decompress=False, headers=UPSTREAM_DEFAULT_HEADERS)


class Upstream:
    """Pool, health checks and breaker verdicts over ``replica_set`` (a :class:`gateway.build.Lifecycle`).

    ``session`` (the request path's :class:`gateway.upstream_pool.UpstreamPool`),
    ``probe_session`` (aiohttp, health checks, poller and verification probes) and ``health`` exist
    between :meth:`start` and :meth:`stop` (None before); ``engine_metrics``
    only when ``calibration`` is on. ``probe_model``: the model the verification completion asks
    for (a served model; None: ``GET /health`` is the verification, which misses a dead engine behind
    a live API server).
    """

    def __init__(self, replica_set: ReplicaSet, router: Router, metrics: GatewayMetrics, upstream: UpstreamConfig,
                 health: HealthConfig, calibration: Calibration | None, probe_model: str | None = None) -> None:
        self.replica_set = replica_set
        self.router = router
        self.metrics = metrics
        self.calibration = calibration
        self._ucfg, self._hcfg = upstream, health
        self.session: UpstreamPool | None = None
        self.probe_session: aiohttp.ClientSession | None = None
        self.health: HealthChecker | None = None
        self.engine_metrics: EngineMetricsPoller | None = None
        replica_set.tenants.on_open = self.tenant_circuit_opened  # R7b-1
        self.probe_model = probe_model
        #: a one-token answer slower than a stream's first-byte deadline fails real requests too
        self.verify_timeout_s = min(upstream.first_byte_timeout_s, max(health.timeout_s, VERIFY_TIMEOUT_S))
        self._verifying: set[asyncio.Task[None]] = set()
        replica_set.verifier = self.verify  # S9-L4

    def open_session(self) -> UpstreamPool:
        """Open the upstream pool and the probe session (idempotent); returns the pool."""
        u = self._ucfg
        if self.session is None or self.session.closed:
            self.session = make_session(u.pool_size, u.connect_timeout_s, u.read_timeout_s)
        if self.probe_session is None or self.probe_session.closed:
            self.probe_session = make_probe_session(u.connect_timeout_s)
        return self.session

    def require_session(self) -> UpstreamPool:
        """The open session; raises RuntimeError before :meth:`start`."""
        if self.session is None:
            raise RuntimeError("the gateway was not started")
        return self.session

    async def start(self) -> None:
        """Open the session, probe every replica once, then start the periodic checks (and poller)."""
        self.open_session()
        session = self.probe_session
        assert session is not None
        h = self._hcfg
        self.health = HealthChecker(
            self.replica_set, session, interval_s=h.interval_s, timeout_s=h.timeout_s,
            unhealthy_after=h.unhealthy_after, healthy_after=h.healthy_after, on_restart=self.on_restart,
            passive_grace_s=h.passive_grace_s,
            on_ignored_timeout=lambda rid: self.metrics.health_probe_timeouts_ignored.labels(rid).inc(),
        )
        await self.health.check_once()
        self.health.start()
        if self.calibration is not None:
            loads = self.router.loads
            self.engine_metrics = EngineMetricsPoller(
                self.replica_set, session, self.calibration, interval_s=h.interval_s, timeout_s=h.timeout_s,
                own_requests=lambda rid: loads.snapshot(rid).running_requests)
            self.engine_metrics.start()

    async def stop(self) -> None:
        """Stop the checks, the poller and verification probes, close the session."""
        for task in list(self._verifying):
            task.cancel()
        await asyncio.gather(*self._verifying, return_exceptions=True)
        try:
            if self.health is not None:
                await self.health.stop()
            if self.engine_metrics is not None:
                await self.engine_metrics.stop()
        finally:
            try:
                if self.session is not None:
                    await self.session.close()
            finally:
                if self.probe_session is not None:
                    await self.probe_session.close()

    def on_restart(self, replica_id: str) -> None:
        """A replica restarted (lost its KV cache): drop its prefix index entries."""
        self.router.forget_replica(replica_id)
        log.info("replica %s restarted: its prefix index entries are dropped", replica_id)

    def failed(self, attempt: Attempt, fail: UpstreamFailure) -> None:
        """Count a failed call and settle its breaker attempt: a replica fault
        (502/503/504, timeout, connect error, reset, broken answer) is a failure; any
        other answer (the client's fault, 429, a plain 500: R7-2) shows the replica
        alive and is a success (docs/routing.md, "Circuit breaker")."""
        self.metrics.upstream_failures.labels(fail.kind).inc()
        if fail.replica_fault:
            attempt.failed(fail.reached)  # R8-2: a request never sent is no tenant's doing
            if not attempt.retry:  # R7b-1: the tenant's streak on this replica; no second replica
                fail.retryable = False
        else:
            attempt.succeeded(served=False)  # R8-4: alive, but no evidence that it serves

    def verify(self, replica_id: str) -> bool:
        """The replica set's verifier (S9-L4): start the gateway's own verification probe of
        ``replica_id`` in a task (its verdict goes to :meth:`ReplicaSet.verified`); False when none can
        be sent (no running loop, the probe session not open), so the failure counts as before. The
        replica set calls it at most once per replica at a time and ``verify_interval_s`` apart."""
        session = self.probe_session
        if session is None or session.closed:
            return False
        try:
            task = asyncio.get_running_loop().create_task(self._verify(replica_id, session))
        except RuntimeError:
            return False
        self._verifying.add(task)
        task.add_done_callback(self._verifying.discard)
        return True

    async def _verify(self, replica_id: str, session: aiohttp.ClientSession) -> None:
        ok = False
        try:
            url = self.replica_set.get(replica_id).url
            if self.probe_model is not None:
                ok = await completion_probe(session, url, self.probe_model, self.verify_timeout_s)
            elif self.health is not None:
                ok = await asyncio.wait_for(self.health.probe(replica_id), self.verify_timeout_s) is not None
        except Exception:  # an unknown replica, a bug: no verdict that the replica serves
            log.exception("replica %s: verification probe failed to run", replica_id)
        finally:  # also when cancelled (stop): the probe slot is always given back
            self.replica_set.verified(replica_id, ok)
        if ok:
            log.warning("replica %s: tenants' failures there were not confirmed by the gateway's own request "
                        "(it was served); the shared circuit stays closed, the failures stay with the tenants",
                        replica_id)
        else:
            log.warning("replica %s: the gateway's own request failed there too; its shared circuit opens",
                        replica_id)

    def tenant_circuit_opened(self, replica_id: str, tenant_id: str) -> None:
        """One tenant's failures on ``replica_id`` opened the circuit of that (replica, tenant) pair
        only (R7b-1, R8-2: gateway/tenant_breaker.py): audit line (ids only, never prompt text) and metric."""
        self.metrics.tenant_circuits_opened.labels(replica_id, tenant_id).inc()
        log.warning("replica %s: circuit opened for tenant %s only (its requests failed there; no other "
                    "tenant's failure corroborates a replica fault)", replica_id, tenant_id)

    def answered(self, replica_id: str, instance_id: str | None, attempt: Attempt | None = None) -> None:
        """A replica started answering (the first byte of a 200); a changed instance id means it
        restarted. A half-open probe ``attempt`` (given for streams; a plain answer's first byte
        comes with its end anyway) gets its circuit verdict now (R7-2:
        :meth:`gateway.replicas.Attempt.first_byte`); other attempts' verdicts wait for the end of
        the answer (see the pipeline)."""
        if attempt is not None:
            attempt.first_byte()
        if instance_id and self.replica_set.observe_instance(replica_id, instance_id):
            self.on_restart(replica_id)
