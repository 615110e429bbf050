"""The gateway's shared state through Redis (issue 16, ``state.backend: redis``), as one
:class:`gateway.build.Lifecycle`: routing events (:mod:`gateway.shared_routing`), key
versions and salt epochs (:mod:`tenancy.shared_keys`), the policy set and the tenant
registry (:mod:`gateway.shared_docs`), the concentration windows (:mod:`gateway.shared_alerts`). Built by :func:`gateway.build.build` only for the
Redis backend; the memory default never imports this module.

Subkeys (HKDF-SHA256 of the master secret in use, and of a previous one still in grace after
a master rotation; the secret itself never leaves the process):
``pg-shared-state-mac-v1`` (key records, key-check), ``pg-shared-routing-mac-v1``
(routing entries), ``pg-shared-docs-mac-v1`` (policy and registry records).

Start order: join (key-check: a different master secret refuses to start), adopt the
key records, rebuild routing from the stream, adopt the policy and registry
documents, then run their tasks. Operator changes through the admin API are
published by :meth:`SharedState.on_operator_change` (key and salt rotations, the master
generation, registry reloads) and by the policy store's publisher, inside the admin request: a change or
reload another instance stored first at the same version answers 409 (SF17-1, S22-fixrot-1); one not shared
because a master generation is pending here 503 ``master_pending`` (S22-review-3), or 503 ``state_unavailable``
when Redis failed on the read that tells them apart (S22-fixrot-2).
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry, Gauge

from gateway.config import GatewayConfig
from gateway.shared_docs import DOCS_MAC_INFO, SharedDocument, state_metrics
from gateway.shared_refusal import adopt_stored, admin_answer, refusal, superseded
from gateway.shared_routing import ROUTING_MAC_INFO, RoutingStream, new_instance_id
from routing.index import PrefixIndex
from routing.load import LoadTracker
from routing.shared import PublishingPrefixIndex, RemoteLoadView, SharedLoadTracker
from tenancy.keys import KeyRing, KeyRingError, load_master_secret
from tenancy.shared import redis_client
from tenancy.shared_keys import SharedKeyState
from tenancy.shared_store import cancel_task

if TYPE_CHECKING:
    from gateway.admin import Admin
    from gateway.auditing import AuditHub
    from gateway.pep import DecisionPoint

__all__ = ["SharedState"]

log = logging.getLogger("prefixgate.state")


class SharedState:
    """Every shared piece of one gateway instance (see module doc).

    ``config``: the gateway configuration (``state`` section used);
    ``master_secret``: unused (the HKDF subkeys come from ``keyring`` and follow its master); ``keyring``: the
    instance's key ring; ``registry``: where the metrics go (the admin
    registry: operators only, R3-5; no tenant or replica names); ``client``: a ready
    :class:`redis.asyncio.Redis` (default: :func:`tenancy.shared.redis_client`,
    closed by :meth:`stop`). Raises :class:`tenancy.shared.StateSetupError`.
    """

    def __init__(self, config: GatewayConfig, master_secret: bytes, keyring: KeyRing,
                 registry: CollectorRegistry, *, client: Any = None) -> None:
        sc = config.state
        del master_secret  # the subkeys come from ``keyring`` (they follow a master rotation)
        self.config = config
        self._own_client = client is None
        self.client = client if client is not None else redis_client(sc)
        self.instance_id = new_instance_id()
        self.prefix = sc.key_prefix
        self.poll_s = sc.sync_poll_s
        # the subkeys follow the key ring's master (current first, then masters in grace)
        self._routing_key = lambda: keyring.mac_subkeys(ROUTING_MAC_INFO)
        self._docs_key = lambda: keyring.mac_subkeys(DOCS_MAC_INFO)
        tc = config.tenancy
        self.keys = SharedKeyState(self.client, self.prefix, None, keyring, poll_s=sc.sync_poll_s,
                                   master_loader=lambda: load_master_secret(tc.master_secret_file,
                                                                            tc.master_secret_env))
        self._registry = registry
        self.metrics = state_metrics(registry)
        Gauge("prefixgate_shared_key_records_rejected",
              "Key and master-generation records ignored for a bad MAC, shape or a lower generation",
              registry=registry).set_function(lambda: self.keys.rejected)
        Gauge("prefixgate_shared_master_generation_pending",
              "A higher master generation announced that this instance's secret source cannot authenticate "
              "(0: none)", registry=registry).set_function(lambda: self.keys.master_pending)
        Gauge("prefixgate_master_generation", "The master generation in use",
              registry=registry).set_function(lambda: keyring.master_generation)
        self.routing: RoutingStream | None = None
        self.policy: SharedDocument | None = None
        self.tenants: SharedDocument | None = None
        #: the tenants version this instance holds (0 at start: its registry is its configuration file's until
        #: it adopts or publishes one); the highest ever seen is the key ring's, persisted (S20-R1)
        self.registry_version = 0
        #: the tenants document at ``registry_version`` (None: none adopted or published yet): what a sync
        #: compares the stored record at that version with, never the tenants a reload applied before its
        #: publish numbered them (S30-flake30-1: the sync took them for a raced change and reverted the reload)
        self._registry_body: dict[str, Any] | None = None
        self._keyring = keyring
        self._refused_registry = 0  # the last tenants version this instance refused (counted once)
        self._admin: Admin | None = None
        self._pending: set[asyncio.Task[Any]] = set()
        self._keycheck: asyncio.Task[None] | None = None

    # -- wiring (build time) -------------------------------------------------
    def wrap_routing(self, index: PrefixIndex, loads: LoadTracker, replica_ids: list[str], *,
                     batcher: Any = None) -> tuple[PrefixIndex, LoadTracker]:
        """The router's index and load tracker: ``index``/``loads`` plus the others' events.

        Returns ``(publishing index, shared load tracker)``; ``index`` keeps
        receiving the other instances' chains. ``batcher``: the limits' script batcher
        (:attr:`tenancy.shared.SharedLimits.batcher`), whose batches then carry the routing
        stream's ``XADD`` and busy ``XREAD`` (None: their own round trips).
        """
        sc = self.config.state
        holder: list[RoutingStream] = []
        shared_loads = SharedLoadTracker(loads, RemoteLoadView(), lambda e: holder[0].emit(e))
        self.routing = RoutingStream(self.client, self.prefix, self.instance_id, self._routing_key, index,
                                     shared_loads, replica_ids, lease_ttl_s=sc.lease_ttl_s,
                                     max_entries=sc.stream_max_entries, max_bytes=sc.stream_max_bytes,
                                     entry_max_bytes=sc.stream_entry_max_bytes, registry=self._registry,
                                     # an idle XREAD BLOCK must end before the reply timeout fires
                                     read_block_ms=max(10, min(int(sc.lease_ttl_s * 250),
                                                               int(sc.command_timeout_s * 500))),
                                     batcher=batcher)
        holder.append(self.routing)
        return PublishingPrefixIndex(index, self.routing.emit), shared_loads

    def attach(self, admin: Admin, pdp: DecisionPoint, audit: AuditHub) -> None:
        """Share the concentration windows (``audit.monitor``), the policy set (embedded engine with a
        version store) and the tenant registry."""
        self._admin = admin
        if audit.monitor is not None and self.routing is not None:
            from gateway.shared_alerts import PublishingMonitor

            monitor = PublishingMonitor(audit.monitor, self.routing.emit)
            audit.monitor = monitor
            self.routing.on_observed = monitor.apply
        store = pdp.store
        if store is not None and self.config.policy.mode == "embedded":
            from policy.store_disk import policy_set_document, policy_set_from_document

            async def apply_policy(version: int, body: Any) -> None:
                # S17-1: a set stored at this instance's own version (two changes raced) is adopted as the
                # next version here, then published by SharedDocument.sync
                await store.adopt(store.version + 1 if version == store.version else version,
                                  policy_set_from_document(body), who=f"shared-state:{self.instance_id}")
                pdp.clear_cache()

            self.policy = SharedDocument(self.client, self.prefix, "policy", self._docs_key,
                                         lambda: store.version, apply_policy, self.metrics,
                                         local_body=lambda: policy_set_document(store.policy_set),
                                         heal_unauthenticated=self._no_master_pending, poll_s=self.poll_s)
            policy_doc = self.policy

            async def stored(version: int, policy_set: Any) -> bool:  # S27-review27-2: no unchanged while behind
                return await policy_doc.holds(version, policy_set_document(policy_set))

            store.set_publisher(self._publish_policy, pending_master=lambda: self.keys.master_pending, stored=stored)

        async def apply_tenants(version: int, body: Any) -> None:
            if not isinstance(body, dict) or not isinstance(body.get("tenants"), list):
                raise ValueError("tenants document")
            # the highest version seen is persisted before use (as a key version: KeyRing.adopt), also when
            # refused below; KeyRingError (state file not writable): nothing applied, retried at the next poll
            self._keyring.adopt_registry_version(version)
            try:  # invalid here, e.g. against this instance's replicas (salt-pool rule, R10-1): ignored
                admin.apply_registry(body["tenants"], body.get("operators") or [])
            except ValueError as exc:  # TenantConfigError: the registry in force stays; counted, logged once
                if version != self._refused_registry:
                    self._refused_registry = version
                    self.metrics.rejected.labels("tenants", "refused").inc()
                    if self.tenants is not None:
                        self.tenants.rejected += 1
                    log.warning("shared state: ignored tenants version %d (%s)", version, exc)
                raise
            self.registry_version, self._registry_body = version, admin.last_tenancy

        self.tenants = SharedDocument(self.client, self.prefix, "tenants", self._docs_key,
                                      lambda: self.registry_version, apply_tenants, self.metrics,
                                      local_body=lambda: (admin.last_tenancy if self._registry_body is None
                                                          else self._registry_body),
                                      floor=lambda: self._keyring.registry_version,
                                      heal_unauthenticated=self._no_master_pending, poll_s=self.poll_s)
        admin.change_hooks.append(self.on_operator_change)

    def _no_master_pending(self) -> bool:
        """False while a higher master generation is announced and not applicable here (S20-FS1)."""
        return not self.keys.master_pending

    # -- operator changes ----------------------------------------------------
    async def on_operator_change(self, record: dict[str, Any]) -> None:
        """Publish an admin change record's effect: a key or salt rotation, a registry reload.

        Redis errors are logged, not raised (the change is made and persisted locally; the next poll re-publishes
        what Redis lacks). A reload made here and not shared raises :class:`tenancy.admin.AdminError` (the reload
        answers and audits it; :meth:`_publish_doc`: 409 ``conflict``, 503 ``master_pending`` or
        ``state_unavailable``; 409 ``conflict`` also when a version adopted from another instance replaced the reload
        here before it was numbered, S31-review31-1)."""
        from tenancy.admin import AdminError

        action, refused = record.get("action"), None
        try:
            if action in ("tenant.rotate_key", "tenant.rotate_salt"):
                await self.keys.publish(str(record["tenant_id"]))
            elif action == "keys.rotate_master":
                await self.keys.publish_master()  # the generation only: the others load their own secret
                await self.keys.sync()  # re-MAC the tenant records under the new master
            elif action == "tenants.reload" and self.tenants is not None and self._admin is not None:
                admin = self._admin
                try:
                    remote = await self.tenants.remote_version()
                except Exception as exc:  # noqa: BLE001 - S31-review31-3: numbered anyway, so the next sync
                    # publishes it (before: unnumbered, the sync found its version's body stored and never shared it)
                    log.warning("shared state: reading the stored tenants version failed (%s); the reload is "
                                "numbered from this instance's and published by the next sync", type(exc).__name__)
                    remote = 0
                if admin.last_reload is not None and admin.last_tenancy != admin.last_reload:  # S31-review31-1:
                    # a version adopted since the reload applied replaced it here (a sync in the window): it lost
                    refused = admin_answer("conflict", superseded(self.tenants, self.registry_version, self.metrics))
                else:
                    version = max(self.registry_version, self._keyring.registry_version, remote) + 1
                    self.registry_version, self._registry_body = version, admin.last_tenancy
                    try:
                        self._keyring.adopt_registry_version(version)
                    except KeyRingError as exc:  # applied: share it; only a restart's floor stays lower
                        log.error("shared state: tenants version %d not persisted (%s); published anyway", version,
                                  exc)
                    refused = await self._publish_doc(self.tenants, version, admin.last_tenancy)
        except Exception as exc:  # noqa: BLE001
            log.warning("shared state: publishing %s failed (%s); retried by the next sync",
                        action, exc.__class__.__name__)
        if refused is not None:
            raise AdminError(*refused)

    async def _publish_policy(self, record: Any, policy_set: Any) -> str:
        """Publish a policy change inside its admin request (SF17-1); returns the record's ``shared``:
        ``published``, ``conflict`` (another instance stored this version first: the stored set is
        adopted right after, the request answers 409), ``master_pending`` (not stored, and the stored record
        cannot be read while a master generation is pending here: the change stays in force on this instance
        only, the request answers 503, S22-review-3), ``unresolved`` (not stored, and Redis failed on the read
        that tells those two apart: the request answers 503 ``state_unavailable``, S22-fixrot-2) or
        ``unpublished`` (Redis error on the publish; the next sync re-publishes what Redis lacks)."""
        from policy.store_disk import policy_set_document

        doc = self.policy
        if doc is None:
            return "unpublished"
        try:
            if await doc.publish(record.version, policy_set_document(policy_set)):
                return "published"
        except Exception as exc:  # noqa: BLE001
            log.warning("shared state: publishing policy failed (%s); retried by the next sync",
                        exc.__class__.__name__)
            return "unpublished"
        shared, _ = await self._refused(doc, record.version, "the change")
        if shared == "conflict":  # in a task: after the store's lock is released (adopt takes it)
            self._spawn(adopt_stored(doc))  # a failure is logged (S24-fixreg-2)
        return shared

    async def _refused(self, doc: SharedDocument, version: int, what: str) -> tuple[str, str]:
        """After a refused publish of ``doc`` at ``version``: ``(shared, message)``
        (:func:`gateway.shared_refusal.refusal`, with this instance's pending master generation)."""
        return await refusal(doc, version, what, self.keys.master_pending, self.metrics)

    async def _publish_doc(self, doc: SharedDocument | None, version: int, body: Any) -> tuple[int, str, str] | None:
        """Publish ``body`` at ``version``; returns ``(status, code, message)`` of a reload made here and not
        shared (:meth:`_refused`: 409 ``conflict``, the stored one adopted at once as a policy change's, S17-1,
        S22-fixrot-1; 503 ``master_pending``, ``state_unavailable``), else None (stored, or a failed publish)."""
        if doc is None or body is None:
            return None
        try:
            if await doc.publish(version, body):
                return None
        except Exception as exc:  # noqa: BLE001
            log.warning("shared state: publishing %s failed (%s)", doc.name, exc.__class__.__name__)
            return None
        shared, message = await self._refused(doc, version, "the reload")
        if shared == "conflict":
            await adopt_stored(doc)  # S17-1: converge now; a Redis error is logged (S23-fixreg-3)
        return admin_answer(shared, message)

    def _spawn(self, coro: Any) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._pending.add(task)
        task.add_done_callback(self._pending.discard)

    async def settle(self) -> None:
        """Wait for publications started by listeners (tests)."""
        while self._pending:
            await asyncio.gather(*list(self._pending), return_exceptions=True)

    # -- lifecycle -----------------------------------------------------------
    async def start(self) -> None:
        """Join (raises :class:`tenancy.keys.KeyRingError` on a key-check mismatch), adopt, run.

        If Redis does not answer at start, the instance starts anyway (its
        admission follows ``state.on_unavailable``: 503 when ``fail_closed``)
        and joins in the background, every ``state.probe_interval_s``, as
        soon as Redis answers; until then it routes and keys on its own
        state (its persisted highest key versions). A key-check mismatch
        found by that late join is logged as an error and the instance keeps
        its own key state (docs/scale-out.md, "Failure modes").
        """
        from tenancy.shared_failover import unavailable_errors

        try:
            await self.keys.join()
        except unavailable_errors() as exc:
            log.warning("shared state: Redis does not answer at start (%s); joining when it does",
                        exc.__class__.__name__)
            self._keycheck = asyncio.get_running_loop().create_task(self._join_later(),
                                                                    name="prefixgate-late-join")
            return
        await self._run()

    async def _join_later(self) -> None:
        """Retry the join until Redis answers, then adopt and run (start's tail)."""
        from tenancy.keys import KeyRingError
        from tenancy.shared_failover import unavailable_errors

        while True:
            await asyncio.sleep(self.config.state.probe_interval_s)
            try:
                await self.keys.join()
            except unavailable_errors():
                continue
            except KeyRingError:
                log.error("shared state: the stored key-check value is not this instance's master secret's; "
                          "this instance keeps its own key state and does not join")
                return
            try:
                await self._run()
            except unavailable_errors():  # Redis went away again between join and adoption
                continue
            log.warning("shared state: joined after Redis became reachable")
            return

    async def _run(self) -> None:
        """Adopt what Redis holds and start the background tasks (after a successful join)."""
        await self.keys.sync()
        self.keys.start()
        if self.routing is not None:
            await self.routing.start()
        for doc in (self.policy, self.tenants):
            if doc is not None:
                await doc.sync()
                doc.start()
        self._keycheck = asyncio.get_running_loop().create_task(self._reassert_key_check(),
                                                                name="prefixgate-key-check")

    async def _reassert_key_check(self) -> None:
        """Every ``sync_poll_s``: set the key-check value again if Redis lost it (emptied, restarted), so an
        instance with another master secret cannot join in its place; a mismatch is logged as an error."""
        from tenancy.keys import KeyRingError

        while True:
            await asyncio.sleep(self.poll_s)
            try:
                await self.keys.join()
            except KeyRingError:
                log.error("shared state: the stored key-check value is not this instance's master secret's "
                          "(another master secret joined); records it writes are ignored here")
            except Exception as exc:  # noqa: BLE001 - Redis down: retried
                log.debug("key-check re-assertion failed (%s)", exc.__class__.__name__)

    async def stop(self) -> None:
        """Stop every task, give up the routing lease, close the client."""
        await self.settle()
        # a late join that finishes while being cancelled has replaced itself by the key-check
        # task (``_run``'s last step): cancel until no task is left
        while self._keycheck is not None:
            task, self._keycheck = self._keycheck, None
            await cancel_task(task)
        for doc in (self.policy, self.tenants):
            if doc is not None:
                await doc.aclose()
        if self.routing is not None:
            await self.routing.stop()
        await self.keys.aclose()
        if self._own_client:
            await self.client.aclose()
